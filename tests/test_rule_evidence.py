"""The evidence behind every trainer rule: what its `upstream` names (runner/train/custom_rule.py `Package`,
`Source`, `Paper`, `Tested`), held to the repository and to what the analysis and docs/trainers.md show.

Generated over every rule a preset runs (conf/trainer/*.yaml's custom.fn) and every known bug's arms
(conf/bug/*.yaml's known_bug.buggy.fn and .fixed.fn):
- each `Tested` entry names a test that exists: the file, the test function in it, and the file names the
  rule (its preset, or its module and function) or, where the entry says the test calls the rule's functions
  `via`, each of those (which its module holds);
- the `evidence` column (`analysis.load.provenance`) is the kinds its records give, strongest first, each once,
  and the detailed form names every test;
- docs/trainers.md's and docs/post-training.md's rules tables show, row by row, the evidence its preset's
  records give (a kind only tests skipped without a package give marked "(needs PACKAGE)").
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from analysis.load.provenance import KINDS, evidence_text, provenance
from runner.callables import resolve_callable
from runner.train.upstream import TESTED_KINDS, Package, Paper, Source, Tested, upstream_records

REPO = Path(__file__).resolve().parents[1]
PRESETS = {path.stem: OmegaConf.load(path) for path in sorted((REPO / "conf" / "trainer").glob("*.yaml"))}
CUSTOM = {name: str(conf.custom.fn) for name, conf in PRESETS.items() if "custom" in conf}
BUILT_IN = sorted(set(PRESETS) - set(CUSTOM))  # the runner's own modes: nothing recorded


def bug_arms() -> set[str]:
    arms = set()
    for path in sorted((REPO / "conf" / "bug").glob("*.yaml")):
        bug = OmegaConf.load(path).known_bug
        arms |= {str(bug[arm].fn) for arm in ("buggy", "fixed")}
    return arms


SPECS = sorted(set(CUSTOM.values()) | bug_arms())
PRESETS_OF = {spec: {name for name, fn in CUSTOM.items() if fn == spec} for spec in SPECS}


def named(text: str, name: str) -> bool:
    """Whether `text` holds `name` as a whole word (hf_trainer in `runner.trainers.hf_trainer:loss`, not in
    hf_trainer_per_device)."""
    return re.search(rf"(?<!\w){re.escape(name)}(?!\w)", text) is not None


def kinds_of(entry) -> list[str]:
    """The kinds one upstream entry gives, from the entry itself (the analysis reads the records): a package's
    called functions are its release, what the rule writes out of it (`follows`) a paraphrase."""
    if isinstance(entry, Tested):
        return [entry.evidence]
    if isinstance(entry, Package):
        return ["release"] * bool(entry.calls) + ["paraphrase"] * bool(entry.follows or not entry.calls)
    if isinstance(entry, Source):
        return ["paraphrase"]
    if isinstance(entry, Paper):
        return ["paper"]
    raise AssertionError(f"an upstream entry of no known kind: {entry!r}")


def expected_evidence(fn) -> str:
    """The kinds, strongest first; one that only tests skipped without a package give is marked (needs it)."""
    kinds = {kind for entry in fn.upstream for kind in kinds_of(entry)} or {"constructed"}

    def shown(kind: str) -> str:
        givers = [entry for entry in fn.upstream if kind in kinds_of(entry)]
        needs = {entry.needs if isinstance(entry, Tested) else None for entry in givers}
        return kind if None in needs or not givers else f"{kind} (needs {' or '.join(sorted(needs))})"

    return ", ".join(shown(kind) for kind in sorted(kinds, key=KINDS.index))


@pytest.mark.parametrize("spec", SPECS)
def test_every_test_a_rule_names_exists_and_names_the_rule(spec):
    fn = resolve_callable(spec)
    module_path, function = spec.split(":")
    module, base = importlib.import_module(module_path), module_path.rsplit(".", 1)[-1]
    for entry in (e for e in fn.upstream if isinstance(e, Tested)):
        assert entry.evidence in TESTED_KINDS and entry.against, entry
        file, _, test = entry.test.partition("::")
        path = REPO / file
        assert path.is_file(), f"{spec}: {entry.test}: no such file"
        text = path.read_text()
        if test:
            defined = {node.name for node in ast.walk(ast.parse(text)) if isinstance(node, ast.FunctionDef)}
            assert test in defined, f"{spec}: {file} defines no {test}"
        if entry.via:
            for name in entry.via:
                assert callable(getattr(module, name, None)), f"{spec}: {module_path} has no function {name}"
                assert named(text, name), f"{spec}: {file} never names {name}, which it is said to call"
            assert named(text, base), f"{spec}: {file} never names {base}"
        else:
            rule = any(named(text, p) for p in PRESETS_OF[spec]) or (named(text, base) and named(text, function))
            assert rule, f"{spec}: {file} names neither its preset {sorted(PRESETS_OF[spec])} nor {base}, {function}"


@pytest.mark.parametrize("spec", SPECS)
def test_the_evidence_column_is_the_kinds_of_the_rules_records(spec):
    fn = resolve_callable(spec)
    records = upstream_records(fn)
    columns = provenance({"custom_upstream": records})
    assert columns["evidence"] == expected_evidence(fn)
    detail = columns["evidence_detail"]
    for entry in (e for e in fn.upstream if isinstance(e, Tested)):
        assert f"{entry.evidence}: {entry.test}" in detail
        assert all(name in detail for name in entry.via) and (entry.needs or "") in detail
    assert [part.split(":", 1)[0] for part in detail.split("; ")] == sorted(
        [kind for entry in fn.upstream for kind in kinds_of(entry)] or ["constructed"], key=KINDS.index
    )  # one part per record, strongest first (no ";" inside a part)


def test_known_rows():
    evidence = {name: evidence_text(upstream_records(resolve_callable(fn))) for name, fn in CUSTOM.items()}
    assert evidence["hf_trainer"].startswith("release") and "upstream_tests" in evidence["hf_trainer"]
    # the Trainer's count is followed (a paraphrase) and held against the installed Trainer (a release)
    assert evidence["hf_trainer_per_device"] == evidence["torchtitan"] == "release, paraphrase"
    assert evidence["hf_trainer_ulysses"] == "release, paraphrase"  # ForCausalLMLoss called, the SP path followed
    assert evidence["megatron"] == evidence["xtuner"] == "paraphrase"
    assert evidence["trl_dapo"] == "upstream_tests, paraphrase"
    assert evidence["sum_under_fsdp_sum"] == "constructed" and evidence["paper_grpo"] == "paper"
    # verl's own agg_loss only where verl is installed (make setup-verl): marked, `make test` skips that test
    assert evidence["verl_token_mean"].startswith("release (needs verl), upstream_tests")
    assert BUILT_IN and provenance({})["evidence"] == ""  # the runner's own modes record no custom_upstream


def test_the_evidence_text_of_records():
    assert evidence_text(None) == evidence_text(None, detailed=True) == ""  # an earlier runner, a built-in mode
    assert evidence_text([]) == "constructed"
    assert evidence_text([], detailed=True) == "constructed: no upstream (a rule of its own)"
    tested = Tested("upstream_tests", "tests/test_x.py::test_y", "org/repo@abc1234 tests", via=("f",), needs="pkg")
    followed = {"package": "p", "version": "1.0", "calls": [], "follows": ["p/a.py: g"]}
    records = [{"repository": "o/r", "commit": "c" * 40, "files": []}, tested.record(), followed, tested.record()]
    assert evidence_text(records) == "upstream_tests (needs pkg), paraphrase"  # only skipped-without tests give it
    untested = Tested("upstream_tests", "tests/test_z.py::test_w", "org/repo@abc1234 tests")
    assert evidence_text([*records, untested.record()]) == "upstream_tests, paraphrase"  # one test runs anywhere
    assert evidence_text(records, detailed=True) == (
        "upstream_tests: tests/test_x.py::test_y (through f) against org/repo@abc1234 tests, skipped without pkg; "
        "upstream_tests: tests/test_x.py::test_y (through f) against org/repo@abc1234 tests, skipped without pkg; "
        "paraphrase: o/r@ccccccc; paraphrase: p 1.0 followed (g)"
    )
    called = {"package": "p", "version": None, "calls": ["p.m.h"]}
    assert evidence_text([{"paper": "A 2024", "where": "eq. 1"}, called], detailed=True) == (
        "release: p (version not recorded) called (h); paper: A 2024"
    )
    assert provenance({"custom_upstream": records})["upstream"] == "o/r@ccccccc; p 1.0"  # a test is no code


def test_a_tested_entry_names_a_kind_a_test_gives_and_a_test_of_the_repository():
    with pytest.raises(ValueError, match="paraphrase"):
        Tested("paraphrase", "tests/test_x.py", "a second paraphrase")
    with pytest.raises(ValueError, match="tests/FILE.py"):
        Tested("release", "test_x", "somewhere")


DOCS_TABLES = {"trainers.md": "| trainer= (mode label) |", "post-training.md": "| `trainer=` (mode label) |"}


def docs_rows(doc: str) -> dict[str, str]:
    """A rules table of docs/: each row's trainer= name and its evidence cell."""
    lines = (REPO / "docs" / doc).read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(DOCS_TABLES[doc]))
    header = [cell.strip() for cell in lines[start].strip("|").split("|")]
    column = header.index("evidence")
    rows = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip("|").split(" | ")]
        rows[re.match(r"`(\w+)`", cells[0]).group(1)] = cells[column]
    return rows


@pytest.mark.parametrize("doc", DOCS_TABLES)
def test_the_docs_tables_show_the_evidence_the_records_give(doc):
    rows = docs_rows(doc)
    named = {"trainers.md": {"hf_trainer", "megatron", "torchtitan", "sum_under_fsdp_sum", "local"}}
    assert named.get(doc, {"reference", "verl_token_mean", "trl_dapo", "paper_grpo"}) <= set(rows)
    for name, cell in rows.items():
        assert name in PRESETS, f"docs/{doc} names trainer={name}, which conf/trainer/ lacks"
        if name in BUILT_IN:
            assert cell == "-", name
        else:
            assert cell == expected_evidence(resolve_callable(CUSTOM[name])), name


def test_trainers_csv_and_the_report_show_each_runs_evidence(tmp_path):
    import pandas as pd

    from analysis.pipeline import analyze
    from analysis.testing.synthetic import SyntheticRun, write_sweep

    def custom(name: str, records: list | None) -> SyntheticRun:
        overrides = {"custom.fn": f"runner.trainers.{name}", "custom.name": name, "custom.expect": "grad L"}
        summary = {"custom_upstream": records} if records is not None else {}
        return SyntheticRun("custom", overrides=overrides, world_size=2, grad_accum=2, summary=summary)

    hf, megatron = (upstream_records(resolve_callable(CUSTOM[name])) for name in ("hf_trainer", "megatron"))
    runs = [SyntheticRun("sum", world_size=2, grad_accum=2), custom("hf_trainer:loss", hf)]
    runs += [custom("megatron:per_token", megatron), custom("counterexample:own", []), custom("old:rule", None)]
    sweep = write_sweep(tmp_path / "sweep", runs)
    analyze([sweep], sweep / "analysis", wandb_mode="disabled", make_plots=False)
    rows = pd.read_csv(sweep / "analysis" / "trainers.csv", keep_default_na=False).set_index("trainer")
    evidence = {label.split(" [")[0]: text for label, text in rows["evidence"].items()}
    assert evidence == {
        "sum": "-",
        "hf_trainer:loss": expected_evidence(resolve_callable(CUSTOM["hf_trainer"])),
        "megatron:per_token": "paraphrase",
        "counterexample:own": "constructed",
        "old:rule": "not recorded (an earlier runner)",
    }
    full = rows["evidence (in full)"].to_dict()
    hf_full = next(text for label, text in full.items() if label.startswith("hf_trainer"))
    assert hf_full == evidence_text(hf, detailed=True) and "tests/test_hf_trainer_real.py::" in hf_full
    report = (sweep / "analysis" / "report.md").read_text()
    section = report[report.index("## Trainers") :]
    assert re.search(r"\| evidence +\|", section) and "release, upstream_tests" in section
    assert "upstream_tests (upstream's own test cases reproduced)" in section
