"""The launcher's check of `custom.fn`, in a short subprocess: the launching process never imports torch,
and the user's module may.

`python -m runner.callables MODULE:CALLABLE` imports the module, inspects the
callable's parameters and reports, as one JSON line, what is wrong and the code
the import brought in (the source hash of the local modules and the installed
packages' versions: part of the run's identity, `runner.record.identity`). It
costs one interpreter start plus the module's imports (measured on 2 busy
cores: 0.04 s for a module that imports nothing heavy, 1.9 s for one that
imports torch, 2.8 s for one that imports transformers' loss), once per
distinct `custom.fn` per launching process: a sweep checks each callable once,
however many jobs use it, and a sweep's preflight checks all of its callables in
one subprocess (`check_all`), where the imports the rules share (torch, loaded
before any of them) are paid once and each rule is imported in a process forked
from that state, so that each one's facts are what a fresh interpreter finds
(experiment=trainers: 13 rules in about 10 s instead of 55 s).
"""

from __future__ import annotations

import json
import subprocess
import sys

TIMEOUT_S = 120.0  # one callable's import; a batch gets this plus PER_SPEC_S for each further callable
PER_SPEC_S = 30.0
_facts: dict[str, dict] = {}  # spec -> `runner.callables.callable_facts`, for this launching process


def check_all(specs: list[str]) -> None:
    """Check every distinct spec not checked yet in one subprocess (`python -m runner.callables SPEC...`);
    `custom_fn_facts` then answers from what it found."""
    todo = sorted(set(specs) - set(_facts))
    if not todo:
        return
    timeout = TIMEOUT_S + PER_SPEC_S * (len(todo) - 1)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "runner.callables", *todo], capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        _facts.update(
            {spec: {"problem": f"custom.fn={spec}: importing it took longer than {timeout:g} s"} for spec in todo}
        )
        return
    lines = done.stdout.strip().splitlines()
    try:
        found = json.loads(lines[-1]) if done.returncode == 0 and lines else None
    except json.JSONDecodeError:  # a module printed after the check, at exit
        found = None
    last = (done.stderr.strip().splitlines() or lines or ["no output"])[-1]
    for spec in todo:
        facts = found.get(spec) if isinstance(found, dict) else None
        if not isinstance(facts, dict):
            facts = {"problem": f"custom.fn={spec}: checking it in a subprocess failed ({last})"}
        _facts[spec] = facts


def forget_checked() -> None:
    """Forget every check of this process: the next `custom_fn_facts` imports the callables anew."""
    _facts.clear()


def custom_fn_facts(spec: str) -> dict:
    """`runner.callables.callable_facts` of custom.fn=`spec`, from a subprocess; checked once per process.
    `problem` is a message naming the field, or None."""
    check_all([spec])
    return _facts[spec]


def custom_fn_problem(spec: str) -> str | None:
    """What is wrong with custom.fn=`spec` (a message naming the field), or None."""
    return custom_fn_facts(spec).get("problem")
