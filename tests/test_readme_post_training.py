"""README's "Post-training aggregation" table says what each mode's preset states, and so what
`python -m analysis --check` holds every run of `experiment=rl` to (tests/test_rl_end_to_end.py checks the
measured rows against it)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def readme_table() -> dict[str, dict[str, str]]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Post-training aggregation", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| mode")]
    table = {}
    for line in rows:
        mode, weighs, invariant, changes = (cell.strip() for cell in line.strip("|").split("|"))
        table[mode] = {"weighs": weighs, "invariant": invariant, "changes_with": changes}
    return table


def stated() -> dict[str, dict[str, str]]:
    """Each preset of experiment=rl's sweep: its name, what it weighs alike and how it changes with the layout."""
    experiment = yaml.safe_load((ROOT / "conf" / "experiment" / "rl.yaml").read_text())
    presets = experiment["hydra"]["sweeper"]["params"]["trainer"].split(",")
    table = {}
    for preset in presets:
        config = yaml.safe_load((ROOT / "conf" / "trainer" / f"{preset}.yaml").read_text())
        custom = config.get("custom") or {}
        name = custom.get("name", config.get("reduction"))  # the reference is `sum` itself: the token mean
        layouts = custom.get("expect_layouts", "invariant")
        table[name] = {
            "weighs": custom.get("weighs", "token"),
            "invariant": "yes" if layouts == "invariant" else "no",
            "changes_with": re.sub(r"^changes with ", "", layouts) if layouts != "invariant" else "",
        }
    return table


def test_the_readme_table_is_what_the_presets_state():
    assert readme_table() == stated()


def test_the_readme_counts_the_invariant_modes_it_lists():
    table = readme_table()
    invariant = sum(row["invariant"] == "yes" for row in table.values())
    text = (ROOT / "README.md").read_text()
    assert f"{invariant} of the {len(table)} are invariant" in text
    assert f"other {['no', 'one', 'two', 'three', 'four', 'five', 'six'][len(table) - invariant]}" in text
