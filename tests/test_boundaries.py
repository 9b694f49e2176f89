"""The package's dependency rules (docs/extending.md), checked on every file's imports and in fresh interpreters.

- Layers: the runner's packages are stacked in an order (RUNNER_LAYERS), and so
  are the analysis' (ANALYSIS_LAYERS); no file imports from a layer above its
  own, nor from another package of its own layer; its own package it may use
  freely. Read from every file's import statements, those inside functions too.
  The runner never imports the analysis; nothing on the analysis' path imports
  its test helpers (`analysis.testing`, the top layer).
- The sweep side (the Hydra process that validates jobs and spawns ranks) never
  imports torch: a sweep's launching process stays light, and bad input is
  refused in about a second.
- The analysis reads the runner's output through the record side only
  (`runner.record`, plus the torch-free schema it is written in: `runner.config`
  with its ranges, `runner.modes`, `runner.layout`, `runner.trajectory`), and never imports torch.
"""

from __future__ import annotations

import ast
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import analysis
import runner.sweep

SWEEP_SIDE = ["runner.__main__"] + [info.name for info in pkgutil.walk_packages(runner.sweep.__path__, "runner.sweep.")]
ANALYSIS = sorted(info.name for info in pkgutil.walk_packages(analysis.__path__, "analysis."))
RECORD_SIDE = ("runner.record", "runner.config", "runner.ranges", "runner.modes", "runner.layout", "runner.trajectory")
ROOT = Path(__file__).resolve().parents[1]

# Lowest first. A file may import from its own package and from the layers below its own, never from above
# nor from another package of its own layer.
RUNNER_LAYERS = [
    ("runner.extras",),  # the optional extras and the command that installs one (torch-free)
    # the schema's leaves, torch-free
    ("runner.ranges", "runner.modes", "runner.layout", "runner.callables", "runner.trajectory"),
    ("runner.config",),  # the typed config
    ("runner.record",),  # what a job leaves and how it is read back
    ("runner.data", "runner.model"),
    ("runner.train",),  # the parts, the reductions, the collective counter, the training loop
    ("runner.measure", "runner.trainers"),  # the cost loop (it runs the training's parts); trainers' rules (custom.fn)
    ("runner.world",),  # a rank's life: it runs the training or the cost loop
    ("runner.sweep",),  # the Hydra process: it spawns the ranks
    ("runner.__main__", "runner.testing"),  # entry points: nothing imports them
]
ANALYSIS_LAYERS = [
    ("analysis.nanstats",),  # NumPy's NaN-aware statistics without its per-line loop
    ("analysis.load",),  # records into DataFrames and [run, step] arrays; each run's identity; runs.parquet
    ("analysis.gradients", "analysis.cost"),  # the verdicts; the cost (interleaved inference, collective counts)
    (
        "analysis.trainers",
        "analysis.post_training",
        "analysis.bugs",
    ),  # what the runs show about trainers' rules, post-training modes, known bugs
    ("analysis.plots",),
    ("analysis.report",),  # the answer and one module per section (it names the plots' files and captions)
    ("analysis.wandb_log",),
    ("analysis.pipeline",),  # start to end
    ("analysis.__main__", "analysis.testing"),  # the CLI; the test and benchmark helpers
]

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


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    relative = ROOT / Path(*name.split("."))
    return relative.is_dir() or relative.with_suffix(".py").is_file()


def imported_modules(path: Path, ours: tuple[str, ...]) -> set[str]:
    """The modules of `ours` (package names) that `path` imports anywhere (a function's imports too): for
    `from a.b import c`, a.b.c where c is a module, else a.b."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: a relative import"  # absolute imports only, so that this reads them
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.add(submodule if is_module(submodule) else node.module)
    return {name for name in found if name.split(".")[0] in ours}


def unit_of(module: str, layers: list[tuple[str, ...]]) -> tuple[int, str] | None:
    """(layer, package or module) of `module` in `layers`; None for the top package itself or a name outside."""
    for level, units in enumerate(layers):
        for unit in units:
            if module == unit or module.startswith(unit + "."):
                return level, unit
    return None


def upward_imports(package: str, layers: list[tuple[str, ...]], ours: tuple[str, ...]) -> list[str]:
    """Every import in `package`'s files that goes up a layer or sideways to another package of the same layer."""
    problems = []
    for path in sorted((ROOT / package).rglob("*.py")):
        importer = module_name(path)
        if importer == package:
            continue
        own = unit_of(importer, layers)
        assert own is not None, f"{importer} is in no layer: give its package a place in the layers"
        for name in sorted(imported_modules(path, ours)):
            other = unit_of(name, layers)
            if other is None or other[1] == own[1]:
                continue
            if other[0] >= own[0]:
                where = "above" if other[0] > own[0] else "beside"
                problems.append(f"{importer} imports {name} ({other[1]} is {where} {own[1]})")
    return problems


def test_every_layer_names_a_real_package_or_module():
    for units in RUNNER_LAYERS + ANALYSIS_LAYERS:
        for unit in units:
            assert is_module(unit), unit


def test_no_runner_file_imports_upward():
    assert upward_imports("runner", RUNNER_LAYERS, ("runner",)) == []


def test_no_analysis_file_imports_upward():
    assert upward_imports("analysis", ANALYSIS_LAYERS, ("analysis",)) == []


def test_the_runner_never_imports_the_analysis():
    files = sorted((ROOT / "runner").rglob("*.py"))
    assert len(files) > 40
    assert [str(p.relative_to(ROOT)) for p in files if imported_modules(p, ("analysis",))] == []


def test_the_layer_check_sees_upward_sideways_and_function_level_imports(tmp_path, monkeypatch):
    """The check itself, on a made-up package: each kind of import it must refuse, and those it must allow."""
    package = tmp_path / "pkg"
    for folder in ("low", "mid_a", "mid_b", "high"):
        (package / folder).mkdir(parents=True)
        (package / folder / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "low" / "base.py").write_text("from pkg.high.top import x\n")  # up
    (package / "mid_a" / "one.py").write_text("def f():\n    from pkg.mid_b import two\n")  # sideways, in a function
    (package / "mid_b" / "two.py").write_text("import pkg.low.base\nfrom pkg.mid_b import three\n")  # down; own
    (package / "mid_b" / "three.py").write_text("")
    (package / "high" / "top.py").write_text("from pkg.mid_a import one\nfrom pkg import mid_b\n")  # down
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    layers = [("pkg.low",), ("pkg.mid_a", "pkg.mid_b"), ("pkg.high",)]
    assert upward_imports("pkg", layers, ("pkg",)) == [
        "pkg.low.base imports pkg.high.top (pkg.high is above pkg.low)",
        "pkg.mid_a.one imports pkg.mid_b.two (pkg.mid_b is beside pkg.mid_a)",
    ]
