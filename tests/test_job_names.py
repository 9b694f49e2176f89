"""Job folder names are safe on every file system, whatever the overrides: generated, not listed.

A name keeps only the characters of `runner.config.SAFE_NAME_CHARACTERS` (no colon, space, quote, bracket,
slash or non-ASCII), never ends in a dot (Windows drops it), and fits a file name (255 bytes) with the sweep's
job number before it. Tried on random strings over every printable ASCII character, whitespace and some
non-ASCII, on overrides as Hydra composes them (`custom.fn=MODULE:CALLABLE`, paths with spaces), and in a real
sweep.
"""

from __future__ import annotations

import random
import re
import string
from pathlib import Path

from helpers import run_module
from hydra import compose, initialize_config_dir

from runner.config import job_dirname, register_configs

CONF = Path(__file__).resolve().parents[1] / "conf"
SAFE = re.compile(r"^[A-Za-z0-9._,=+-]*$")
ALPHABET = string.printable + "\u00e9\u00fc\u4e2d\u0000\u200b\U0001f600"
NUMBER_PREFIX = "999999_"  # the sweep's subdir puts the job number before the name


def assert_safe(name: str, given: str) -> None:
    assert SAFE.match(name), f"{given!r} -> {name!r}"
    assert not name.endswith((".", " ")), f"{given!r} -> {name!r}"
    assert len((NUMBER_PREFIX + name).encode()) <= 255, f"{given!r} -> {len(name)} characters"


def test_random_overrides_give_safe_unique_names():
    rng = random.Random(30)
    seen: dict[str, str] = {}
    for _ in range(3000):
        given = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 400)))
        name = job_dirname(given)
        assert_safe(name, given)
        assert job_dirname(given) == name  # the same overrides always name the same folder
        if len(given) > 150:  # shortened: the hash of the whole keeps two overrides apart
            assert seen.setdefault(name, given) == given, f"{given!r} and {seen[name]!r} -> {name!r}"


def test_every_unsafe_character_is_replaced_where_it_stands():
    for char in ALPHABET:
        name = job_dirname(f"data.path=a{char}b")
        assert_safe(name, char)
        assert name == f"data.path=a{char}b" or name == "data.path=a_b", (char, name)


def test_overrides_as_hydra_composes_them():
    """custom.fn's colon, paths with spaces, quotes and brackets: every value a user may type, as the folder's name."""
    register_configs()
    values = [f"'/data/my {c}corpus.txt'" for c in string.punctuation if c not in "'\\"] + ["'~/a b/c.jsonl'"]
    cases = [["reduction=custom", "custom.fn=runner.trainers.torchtitan:loss"], ["cost.modes=[sum,local]"]]
    cases += [[f"data.path={value}", "reduction=sum"] for value in values]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        for overrides in cases:
            given = compose("config", overrides, return_hydra_config=True).hydra.job.override_dirname
            assert_safe(job_dirname(given), given)


def test_a_sweep_over_a_path_with_a_space_and_a_colon_runs_in_safe_folders(tmp_path):
    corpus = tmp_path / "my corpus:1.txt"
    corpus.write_text("\n\n".join(f"Paragraph {i} of a corpus in a folder with a space." for i in range(40)))
    args = ["-m", f"data.path='{corpus}'", "reduction=sum,local", "train.steps=2", "wandb.mode=disabled"]
    done = run_module("runner", [*args, "hydra.sweep.dir=s"], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    jobs = sorted(p.name for p in (tmp_path / "s").iterdir() if p.is_dir() and not p.name.startswith("."))
    assert len(jobs) == 2 and all(SAFE.match(name) for name in jobs), jobs
    assert all("my_corpus_1.txt" in name for name in jobs), jobs
