"""The launcher's check of `custom.fn`, in a short subprocess: the launching process never imports torch,
and the user's module may.

`python -m runner.callables MODULE:CALLABLE` imports the module and inspects the
callable's parameters (`runner.callables`). It costs one interpreter start
plus the module's imports (measured on 2 busy cores: 0.04 s for a module that
imports nothing heavy, 1.9 s for one that imports torch, 2.8 s for one that
imports transformers' loss), once per distinct `custom.fn` per launching
process: a sweep checks each callable once, however many jobs use it, and its
preflight checks all of them in one subprocess (`check_all`), so that modules
which import the same packages pay for them once (experiment=trainers: 13
rules in about 5 s instead of 45 s).
"""

from __future__ import annotations

import json
import subprocess
import sys

TIMEOUT_S = 120.0
_checked: dict[str, str | None] = {}  # spec -> problem, for this launching process


def check_all(specs: list[str]) -> None:
    """Check every distinct spec not checked yet in one subprocess (`python -m runner.callables SPEC...`);
    `custom_fn_problem` then answers from what it found. A failure of the batch leaves them to be checked alone."""
    todo = sorted(set(specs) - set(_checked))
    if len(todo) < 2:
        return
    try:
        done = subprocess.run(
            [sys.executable, "-m", "runner.callables", "--json", *todo],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
        found = json.loads(done.stdout.splitlines()[-1]) if done.returncode == 0 and done.stdout.strip() else {}
    except (subprocess.TimeoutExpired, json.JSONDecodeError):
        return
    _checked.update({spec: found[spec] for spec in todo if spec in found})


def custom_fn_problem(spec: str) -> str | None:
    """What is wrong with custom.fn=`spec` (a message naming the field), or None; checked once per process."""
    if spec not in _checked:
        _checked[spec] = _check_one(spec)
    return _checked[spec]


def _check_one(spec: str) -> str | None:
    try:
        done = subprocess.run(
            [sys.executable, "-m", "runner.callables", spec], capture_output=True, text=True, timeout=TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        return f"custom.fn={spec}: importing it took longer than {TIMEOUT_S:g} s"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return f"custom.fn={spec}: checking it in a subprocess failed ({last})"
    lines = done.stdout.splitlines()
    return (lines[-1] if lines else "") or None  # the check prints one line last: empty when the callable is fine
