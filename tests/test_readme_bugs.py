"""README's "Known bugs" table is generated, not typed: `analysis.report.bugs.readme_table` of a real run's bugs.csv
(`python -m runner -m experiment=bugs` then `python -m analysis`), kept as docs/known-bugs.csv. The README holds
exactly that table, the run covers every conf/bug/*.yaml (by its name, reference, layout and evidence), and every
bug in it showed as stated, named by its evidence ("reproduced" only with a release, upstream's tests or the
report's example behind it). The generator itself is checked on a synthetic sweep."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from analysis.bugs.table import REPRODUCED_BY, SHOWN_AS
from analysis.pipeline import analyze
from analysis.report.bugs import README_COLUMNS, readme_table
from analysis.testing.synthetic import known_bug_runs, write_sweep

ROOT = Path(__file__).resolve().parents[1]
RECORDED = ROOT / "docs" / "known-bugs.csv"
BUG_FILES = sorted((ROOT / "conf" / "bug").glob("*.yaml"))


def test_the_readme_table_is_the_recorded_runs_table():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Known bugs", 1)[1].split("\n## ", 1)[0]
    assert readme_table(pd.read_csv(RECORDED)) in section
    assert len(section.splitlines()) <= 32


def test_the_recorded_run_covers_every_bug_and_each_showed_as_stated_under_its_evidence():
    recorded = pd.read_csv(RECORDED).set_index("bug")
    stated = {OmegaConf.load(path).known_bug.name: OmegaConf.load(path) for path in BUG_FILES}
    assert sorted(recorded.index) == sorted(stated)
    for name, bug in stated.items():
        assert recorded.loc[name, "reference"] == bug.known_bug.reference
        dp, replicas = bug.world_size // bug.sp, bug.get("dp_replicate", 1)
        data_parallel = f"DP({replicas}x{dp // replicas})" if replicas > 1 else f"DP({dp})"
        assert recorded.loc[name, "layout"].startswith(f"{data_parallel}-SP({bug.sp})-GA({bug.grad_accum})")
        kind = bug.known_bug.evidence
        assert recorded.loc[name, "evidence"] == f"{kind}: {bug.known_bug.evidence_source}"
        assert recorded.loc[name, "result"] == ("reproduced" if kind in REPRODUCED_BY else SHOWN_AS[kind]), name


def test_the_generator_gives_one_row_per_bug_with_the_readme_columns(tmp_path):
    runs = known_bug_runs("halved", expect="1/2", buggy_factor=0.5) + known_bug_runs("turned", buggy_turn=0.4)
    sweep = write_sweep(tmp_path / "sweep", runs)
    analyze([sweep], tmp_path / "out", make_plots=False, wandb_mode="disabled")
    table = readme_table(pd.read_csv(tmp_path / "out" / "bugs.csv")).splitlines()
    assert [cell.strip() for cell in table[0].strip("|").split("|")] == list(README_COLUMNS.values())
    assert len(table) == 2 + 2
    assert table[2].startswith("| halved ") and "grad L × 1/2" in table[2] and table[2].endswith("| reproduced |")
    assert table[3].startswith("| turned ") and "another direction" in table[3]
