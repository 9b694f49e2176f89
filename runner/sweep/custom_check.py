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
however many jobs use it.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys

TIMEOUT_S = 120.0


@functools.cache
def custom_fn_facts(spec: str) -> dict:
    """`runner.callables.callable_facts` of custom.fn=`spec`, from a subprocess; checked once per process.
    `problem` is a message naming the field, or None."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", "runner.callables", spec], capture_output=True, text=True, timeout=TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        return {"problem": f"custom.fn={spec}: importing it took longer than {TIMEOUT_S:g} s"}
    lines = done.stdout.strip().splitlines()
    try:
        facts = json.loads(lines[-1]) if done.returncode == 0 and lines else None
    except json.JSONDecodeError:  # the module printed after the check, at exit
        facts = None
    if not isinstance(facts, dict):
        last = (done.stderr.strip().splitlines() or done.stdout.strip().splitlines() or ["no output"])[-1]
        return {"problem": f"custom.fn={spec}: checking it in a subprocess failed ({last})"}
    return facts


def custom_fn_problem(spec: str) -> str | None:
    """What is wrong with custom.fn=`spec` (a message naming the field), or None."""
    return custom_fn_facts(spec).get("problem")
