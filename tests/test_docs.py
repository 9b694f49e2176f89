"""README.md is a front door and docs/ holds the rest: every relative link of either resolves, anchors included."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", flags=re.MULTILINE | re.DOTALL)


def anchors(page: Path) -> set[str]:
    """GitHub's heading slugs: lower case, punctuation dropped, spaces to hyphens."""
    headings = re.findall(r"^#{1,6} (.+)$", FENCE.sub("", page.read_text()), flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-") for heading in headings}


def links(page: Path) -> list[str]:
    return LINK.findall(FENCE.sub("", page.read_text()))


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in links(page):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no heading '#{anchor}' in {resolved.name}")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    assert not broken_links(page), f"{page.relative_to(ROOT)}: {broken_links(page)}"


def test_readme_is_a_front_door():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    linked = {Path(target.partition("#")[0]).name for target in links(ROOT / "README.md")}
    unlinked = [page.name for page in PAGES[1:] if page.name not in linked]
    assert not unlinked, f"docs pages the README does not link: {unlinked}"
    for command in ("make run", "make test"):
        assert command in readme


def test_the_link_check_catches_a_broken_link(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n[ok](#title) [bad](#nowhere) [gone](missing.md)\n")
    assert broken_links(page) == ["#nowhere: no heading '#nowhere' in page.md", "missing.md: no such file"]


def test_the_command_line_page_names_every_option_of_every_group():
    """docs/command-line.md's "Groups" sentence lists each group's options as conf/ holds them, and the count of
    trainer presets it gives is conf/trainer/'s."""
    import re

    conf = ROOT / "conf"
    text = (ROOT / "docs" / "command-line.md").read_text()
    groups = text.split("Groups (each option a file of conf/GROUP/):", 1)[1].split("Other\nkeys", 1)[0]
    for group in ("model", "data", "optim", "objective", "layout"):
        [listed] = re.findall(rf"`{group}=([\w|]+)`", groups)
        assert listed.split("|") == sorted(p.stem for p in (conf / group).glob("*.yaml")), group
    [experiments] = re.findall(r"`experiment=([\w|]+)` \(and `(\w+)`", groups)
    assert sorted([*experiments[0].split("|"), experiments[1]]) == sorted(
        p.stem for p in (conf / "experiment").glob("*.yaml")
    )
    assert f"one of the {len(list((conf / 'trainer').glob('*.yaml')))} presets of conf/trainer/" in groups
    assert re.findall(r"`bug_arm=([\w|]+)`", groups) == [
        "|".join(sorted(p.stem for p in (conf / "bug_arm").glob("*.yaml")))
    ]
