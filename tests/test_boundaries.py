"""The package's dependency rules, checked in fresh interpreters.

- The sweep side (the Hydra process that validates jobs and spawns ranks) never
  imports torch: a sweep's launching process stays light, and bad input is
  refused in about a second.
- The analysis reads the runner's output through the record side only
  (`runner.record`, plus the torch-free schema it is written in: `runner.config`
  with its ranges, `runner.modes`, `runner.layout`), and never imports torch.
"""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys

import analysis
import runner.sweep

SWEEP_SIDE = ["runner.__main__"] + [info.name for info in pkgutil.walk_packages(runner.sweep.__path__, "runner.sweep.")]
ANALYSIS = sorted(info.name for info in pkgutil.walk_packages(analysis.__path__, "analysis."))
RECORD_SIDE = ("runner.record", "runner.config", "runner.ranges", "runner.modes", "runner.layout")

PROBE = """
import importlib, json, sys
report = {}
for name in sys.argv[1:]:
    importlib.import_module(name)
    report[name] = {"torch": "torch" in sys.modules, "runner": sorted(m for m in sys.modules if m.startswith("runner."))}
print(json.dumps(report))
"""


def imports_of(modules: list[str]) -> dict[str, dict]:
    """Per module, imported in this order into one fresh interpreter: whether torch was loaded by then,
    and the runner modules loaded by then."""
    done = subprocess.run([sys.executable, "-c", PROBE, *modules], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def first_to(report: dict[str, dict], condition) -> str | None:
    return next((name for name, seen in report.items() if condition(seen)), None)


def test_the_sweep_side_never_imports_torch():
    assert len(SWEEP_SIDE) >= 6  # __main__, job, preflight, validate, tally, spawn
    report = imports_of(SWEEP_SIDE)
    assert first_to(report, lambda seen: seen["torch"]) is None, "imports torch: " + str(
        first_to(report, lambda s: s["torch"])
    )


def test_the_analysis_reads_the_runner_through_its_record_side_only():
    report = imports_of(ANALYSIS)
    assert first_to(report, lambda seen: seen["torch"]) is None
    used = set(report[ANALYSIS[-1]]["runner"])
    outside = sorted(m for m in used if not m.startswith(RECORD_SIDE))
    assert not outside, f"the analysis imports {outside}; it may use {', '.join(RECORD_SIDE)} only"
    assert "runner.record.metrics_file" in used and "runner.modes" in used  # the rule is checked on real imports
