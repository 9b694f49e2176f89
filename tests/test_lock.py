"""requirements.lock pins what pyproject.toml asks for, and the environment the tests run in was installed from it.

`make setup` gives the lock to every install as constraints (`make lock` writes it); torch is left out of it,
pinned by the Makefile's TORCH_SPEC instead.
"""

from __future__ import annotations

import importlib.metadata as metadata
import re
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements.lock"
LOCKED_EXTRAS = ("dev", "trainers")


def pins() -> dict[str, str]:
    text = LOCK.read_text()
    return {canonicalize_name(name): version for name, version in re.findall(r"^([\w.\-]+)==(\S+)", text, re.M)}


def declared() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    listed = project["dependencies"] + [r for extra in LOCKED_EXTRAS for r in project["optional-dependencies"][extra]]
    return [Requirement(r) for r in listed]


def test_every_declared_dependency_is_pinned_within_its_range():
    locked = pins()
    for requirement in declared():
        name = canonicalize_name(requirement.name)
        if name == "torch":
            assert name not in locked, "torch is the Makefile's (TORCH_SPEC), not the lock's"
            continue
        assert name in locked, f"{requirement} is not in requirements.lock: run `make lock`"
        assert requirement.specifier.contains(locked[name], prereleases=True), (
            f"requirements.lock pins {name}=={locked[name]} outside pyproject.toml's {requirement}: run `make lock`"
        )


def test_the_lock_names_no_machine_of_its_own():
    body = [line for line in LOCK.read_text().splitlines() if line and not line.lstrip().startswith("#")]
    assert body and all(re.fullmatch(r"[\w.\-]+==[\w.+!\-]+", line) for line in body), [
        line for line in body if not re.fullmatch(r"[\w.\-]+==[\w.+!\-]+", line)
    ]
    assert "make lock" in LOCK.read_text().splitlines()[1]


def test_the_installed_versions_are_the_locked_ones():
    installed = {canonicalize_name(d.metadata["Name"]): d.version for d in metadata.distributions()}
    locked = pins()
    assert len(set(locked) & set(installed)) > 50
    differ = {
        name: (locked[name], installed[name])
        for name in locked
        if name in installed and installed[name] != locked[name]
    }
    assert not differ, f"installed apart from requirements.lock (locked, installed): {differ}; run `make setup`"
