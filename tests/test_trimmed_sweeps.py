"""Trimmed sweeps through the analysis: each sentence of the report holds of the runs that are there, and says
nothing of those that are not.

Generated from conf/experiment/: each experiment that sweeps the modes (default, grid, sgd, sp), the
post-training one (rl) and the known bugs' (bugs); each one's swept values (Hydra's own composition) are trimmed at random
(seeded), each job written as a synthetic run whose gradient is what its mode's facts say (grad L, grad L / W,
or turned where micro-batches are reweighted); post-training sweeps are trimmed in their layouts and known-bug
sweeps in their bugs. Checked against the trim, not against the analysis' own tables: which modes the answer
names, which layouts it lists, whether the RFC's first point is measured, which axes an invariance verdict
covers, how many bugs the bugs' answer counts.
"""

from __future__ import annotations

import itertools
import random
import re
import zlib

import pytest
from hydra import compose, initialize_config_dir

from analysis.pipeline import analyze
from analysis.testing.synthetic import PG_LAYOUTS, SyntheticRun, known_bug_runs, pg_run, write_sweep
from runner.config import register_configs
from runner.layout import ParallelLayout
from runner.modes import OVER_W, REWEIGHTED, facts
from runner.sweep.overrides import CONF

TRIMS = 4  # per experiment
BUILT_IN = [p.stem for p in sorted((CONF / "experiment").glob("*.yaml"))]


def swept(experiment: str) -> tuple[dict[str, list[str]], dict]:
    """(the swept keys' values, the fixed layout and optimizer) of `experiment`, as Hydra composes it."""
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", [f"experiment={experiment}"], return_hydra_config=True)
    params = {key: str(value).split(",") for key, value in (cfg.hydra.sweeper.params or {}).items()}
    fixed = {"world_size": cfg.world_size, "sp": cfg.sp, "grad_accum": cfg.grad_accum, "optim.name": cfg.optim.name}
    return params, fixed


def mode_experiments() -> list[str]:
    """The experiments that sweep the runner's modes over layout axes alone (default, grid, sgd, sp)."""
    found = []
    for name in BUILT_IN:
        params = set(swept(name)[0])
        if "reduction" in params and params <= {"reduction", "world_size", "grad_accum", "sp"}:
            found.append(name)
    return found


def trims(values: dict[str, list[str]], seed: int) -> list[dict[str, list[str]]]:
    rng = random.Random(seed)
    found = []
    for _ in range(TRIMS):
        found.append(
            {key: sorted(rng.sample(options, rng.randint(1, len(options)))) for key, options in values.items()}
        )
    return found


def synthetic(mode: str, world_size: int, sp: int, grad_accum: int, optim: str) -> SyntheticRun:
    gradient = facts(mode).gradient
    factor = 1 / world_size if gradient == OVER_W else 1.0
    turn = 0.2 if gradient == REWEIGHTED and world_size * grad_accum > 1 else 0.0
    return SyntheticRun(mode, world_size, sp, grad_accum, factor=factor, turn=turn, overrides={"optim.name": optim})


def answer_of(report: str) -> str:
    return report.split("## Answer\n\n", 1)[1].split("\n## ", 1)[0]


CASES = [(name, n) for name in mode_experiments() for n in range(TRIMS)]


@pytest.mark.parametrize("experiment, n", CASES, ids=[f"{e}-{n}" for e, n in CASES])
def test_a_trimmed_sweep_of_modes_says_only_what_its_runs_show(tmp_path, experiment, n):
    values, fixed = swept(experiment)
    trim = trims(values, seed=zlib.crc32(experiment.encode()))[n]
    axes = {key: [int(v) for v in trim.get(key, [fixed[key]])] for key in ("world_size", "sp", "grad_accum")}
    modes = trim["reduction"]
    runs = []
    for mode, world_size, sp, grad_accum in itertools.product(modes, *axes.values()):
        if world_size % sp or (16 % ((world_size // sp) * grad_accum)):
            continue  # a layout the runner refuses (sp not dividing W, a batch that does not split)
        runs.append(synthetic(mode, world_size, sp, grad_accum, str(fixed["optim.name"])))
    if not runs:
        pytest.skip("no valid layout in this trim")
    result = analyze([write_sweep(tmp_path / "sweep", runs)], tmp_path / "out", make_plots=False, wandb_mode="disabled")
    answer = answer_of(result.report.read_text())
    headline = answer.split("\n\n", 1)[0]

    sum_runs = [r for r in runs if r.reduction == "sum"]
    sum_compared = len(sum_runs) > 1 and any(r.world_size == 1 for r in sum_runs)
    compared = {r.reduction for r in runs if r.reduction != "sum"} | ({"sum"} if sum_compared else set())
    named = set(re.findall(r"`([a-z_]+)`", headline))
    if "sum" in modes:
        assert named == compared, (headline, trim)
        assert ("No run here could be compared" in headline) == (not compared), headline
    else:  # no reference: nothing was compared, and the answer says so rather than a verdict
        assert headline.startswith("No run here could be compared with a baseline"), headline
        assert "**The RFC**" not in answer
    layouts = sorted({str(ParallelLayout(r.world_size, r.sp, r.grad_accum)) for r in runs})
    assert f"layouts {', '.join(layouts)}." in answer, (answer, layouts)

    rfc = answer.split("1. Can FSDP train with the local loss alone? ", 1)
    local_at_w = any(r.reduction in ("local", "detached") and r.world_size > 1 for r in runs)
    if len(rfc) == 2 and "sum" in modes:
        assert rfc[1].startswith("Yes") == local_at_w, (rfc[1][:200], trim)
        for mode in ("local", "detached"):
            if mode not in modes:
                assert f"`{mode}` (no all-reduce" not in rfc[1] and f"`{mode}`," not in rfc[1].split("\n", 1)[0]


@pytest.mark.parametrize("n", range(TRIMS))
def test_a_trimmed_post_training_sweep_states_the_axes_it_varied(tmp_path, n):
    values, _ = swept("rl")
    layouts = trims({"layout": values["layout"]}, seed=7)[n]["layout"]
    if "w1" not in layouts:
        layouts = ["w1", *layouts]  # the reference of every invariance verdict
    runs = [SyntheticRun("sum", *PG_LAYOUTS[layout], steps=3, overrides={"objective.name": "pg"}) for layout in layouts]
    runs += [pg_run("token mean", layout, "token", "invariant") for layout in layouts]
    result = analyze([write_sweep(tmp_path / "sweep", runs)], tmp_path / "out", make_plots=False, wandb_mode="disabled")
    varied = set()
    for layout in layouts:
        world_size, sp, grad_accum = PG_LAYOUTS[layout]
        varied |= {"dp"} if world_size // sp > 1 else set()
        varied |= {"sp"} if sp > 1 else set()
        varied |= {"grad_accum"} if grad_accum > 1 else set()
    section = result.report.read_text().split("## Post-training aggregation\n\n", 1)[1].split("\n\n", 1)[0]
    if not varied:
        assert "Not measured: every mode ran at one layout" in section
        return
    untested = [axis for axis in ("dp", "sp", "grad_accum") if axis not in varied]
    assert ("not varied, so not tested" in section) == bool(untested), section
    for axis in untested:
        assert axis in section.split("this analysis varied:", 1)[1].split(";", 1)[1], section


@pytest.mark.parametrize("n", range(TRIMS))
def test_a_trimmed_bugs_sweep_counts_the_bugs_it_ran(tmp_path, n):
    values, _ = swept("bugs")
    bugs = trims({"bug": values["bug"]}, seed=11)[n]["bug"]
    runs = [run for bug in bugs for run in known_bug_runs(bug, expect="1/2", buggy_factor=0.5)]
    result = analyze([write_sweep(tmp_path / "sweep", runs)], tmp_path / "out", make_plots=False, wandb_mode="disabled")
    answer = answer_of(result.report.read_text())
    assert answer.startswith(f"Of the runner's own modes only the reference ran here; {2 * len(bugs)} runs of other")
    assert "No run here could be compared" not in answer and "**The RFC**" not in answer
    counted = "the one bug showed" if len(bugs) == 1 else f"all {len(bugs)} bugs showed"
    assert counted in answer, answer
