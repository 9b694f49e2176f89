"""Synthetic sweep directories in the runner's output contract, with answers known by construction.

Every run shares one made-up trajectory (a decaying loss, a random gradient
sketch and grad norm per step, drawn from the sweep seed); each `SyntheticRun`
then changes it the way a reduction mode would: scale the gradient by k, turn
its direction, move the loss curve from some step on, diverge, fail, or stop
early. The analysis must recover exactly those changes. Used by the tests and
by `python -m bench analysis` (1,000 runs x 1,000 steps).
"""

from __future__ import annotations

import copy
import functools
import json
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import numpy as np
import yaml
from omegaconf import OmegaConf
from omegaconf._utils import get_omega_conf_dumper

from runner.config import MetricsConfig, RunConfig, counted_step
from runner.modes import ALL_REDUCE_BACKWARD, AutogradAllReduce, has_graph_all_reduce
from runner.record.config_file import write_config_copy
from runner.record.metrics_file import write_arrow_copy

SKETCH_DIM = 8
DEFAULT_METRICS = MetricsConfig()  # the runner's sampling of counted steps


@dataclass
class SyntheticRun:
    reduction: str = "sum"
    world_size: int = 2
    sp: int = 1
    grad_accum: int = 1
    seed: int = 0
    steps: int = 60
    factor: float = 1.0  # the gradient (sketch and grad norm) is k times the true one
    norm_factor: float = 1.0  # the logged grad norm alone is this many times the gradient's (a grad-norm bug)
    norm_hook: bool = False  # the logged norm is a rule's grad_norm hook's: the record holds true_grad_norm too
    turn: float = 0.0  # angle (radians) by which the gradient direction is turned
    loss_shift_from: int | None = None  # from this step on, the loss is higher by loss_shift per step
    loss_shift: float = 0.01
    status: str = "completed"  # completed, diverged, failed, or invalid (nothing ran)
    diverge_at: int | None = None  # the step whose loss and grad norm are not finite
    fail_after: int | None = None  # a failed run logged this many steps
    overrides: dict | None = None  # more config keys, dotted: {"optim.name": "sgd"}
    step_time_factor: float = 1.0  # every step takes this many times as long (e.g. a counter that costs time)
    paper: str | None = None  # the published objective its rule writes out (summary.json's custom_upstream)
    reported_factor: float = 1.0  # the reported loss is this many times L (1/W: a mean of local losses logged)
    own_loss_calls: int | None = None  # the mode's own loss all-reduces per step (None: as the runner's mode issues)
    own_all_gathers: int = 0  # all-gathers per step of its own beyond FSDP's (a rule's token count)
    summary: dict | None = None  # more summary.json fields: {"custom_upstream": [...], "all_reduce_backward": {...}}

    @property
    def job_name(self) -> str:
        return f"{self.reduction}_ws{self.world_size}_sp{self.sp}_ga{self.grad_accum}_seed{self.seed}"


@functools.cache
def _default_config() -> dict:
    """The schema's defaults as YAML gives them (building the structured config takes a third of a second: once)."""
    return yaml.safe_load(OmegaConf.to_yaml(OmegaConf.structured(RunConfig), resolve=True))


def _set(config: dict, key: str, value) -> None:
    """config[a][b][c] = value for key "a.b.c", as OmegaConf.update on the structured config would store it: the key
    must be the schema's (or under an open mapping such as model.overrides), an int where a float is stored
    becomes a float, an Enum its value."""
    *parents, leaf = key.split(".")
    node = config
    for i, part in enumerate(parents):
        if part not in node and node:  # a closed section: not a key of the schema
            raise KeyError(f"{key}: {'.'.join(parents[: i + 1])} is not a key of the config")
        node = node.setdefault(part, {})
    if leaf not in node and node and parents[:2] != ["model", "overrides"]:
        raise KeyError(f"{key} is not a key of the config")
    old = node.get(leaf)
    node[leaf] = (
        value.value
        if isinstance(value, Enum)
        else float(value)
        if isinstance(old, float) and isinstance(value, int) and not isinstance(value, bool)
        else value
    )


def _config_yaml(run: SyntheticRun) -> str:
    config = copy.deepcopy(_default_config())
    values = {
        "reduction": run.reduction,
        "world_size": run.world_size,
        "sp": run.sp,
        "grad_accum": run.grad_accum,
        "seed": run.seed,
        "train.steps": run.steps,
        "wandb.mode": "disabled",
        **(run.overrides or {}),
    }
    for key, value in values.items():
        _set(config, key, value)
    return yaml.dump(
        config, default_flow_style=False, allow_unicode=True, sort_keys=False, Dumper=get_omega_conf_dumper()
    )


def true_trajectory(seed: int, steps: int) -> dict[str, np.ndarray]:
    """The shared made-up run: loss[t], sketch[t, k], grad_norm[t] for t = 1..steps."""
    # One generator per quantity, so that a shorter run's trajectory is a prefix of a longer one's.
    loss_noise, sketch_draw = (np.random.default_rng([seed, stream]) for stream in (1, 2))
    t = np.arange(1, steps + 1)
    sketch = sketch_draw.normal(size=(steps, SKETCH_DIM))
    return {
        "loss": 2.5 + 3.0 * np.exp(-t / 15) + 0.02 * loss_noise.normal(size=steps),
        "sketch": sketch,
        "grad_norm": np.linalg.norm(sketch, axis=1) / 2,
    }


def _turned(sketch: np.ndarray, angle: float, seed: int) -> np.ndarray:
    """Each step's sketch turned by `angle` towards a fixed random direction orthogonal to it (norm kept)."""
    if angle == 0:
        return sketch
    other = np.random.default_rng([seed, 777]).normal(size=sketch.shape)
    other -= (other * sketch).sum(1, keepdims=True) / (sketch**2).sum(1, keepdims=True) * sketch
    other *= np.linalg.norm(sketch, axis=1, keepdims=True) / np.linalg.norm(other, axis=1, keepdims=True)
    return np.cos(angle) * sketch + np.sin(angle) * other


def _records(run: SyntheticRun) -> list[dict]:
    true = true_trajectory(run.seed, run.steps)
    loss = true["loss"].copy()
    if run.loss_shift_from is not None:
        later = np.arange(1, run.steps + 1) >= run.loss_shift_from
        loss[later] += run.loss_shift * (np.arange(1, run.steps + 1)[later] - run.loss_shift_from + 1)
    sketch = run.factor * _turned(true["sketch"], run.turn, run.seed)
    grad_norm = run.norm_factor * np.linalg.norm(sketch, axis=1) / 2
    logged = run.fail_after if run.status == "failed" and run.fail_after is not None else run.steps
    if run.status == "invalid":
        logged = 0
    if run.diverge_at is not None:
        logged = run.diverge_at
    # Loss all-reduces per step as the runner issues them: N, plus the mode's own
    # (sum: 2 per micro-batch, detached: 1 per micro-batch, the others: 1 per step).
    own = {"sum": 2 * run.grad_accum, "detached": run.grad_accum}.get(run.reduction, 1)
    loss_calls = 1 + (own if run.own_loss_calls is None else run.own_loss_calls)
    timing = np.random.default_rng([run.seed, run.world_size, len(run.reduction)])
    packed = bool((run.overrides or {}).get("data.packing", False))
    records = []
    for i in range(logged):
        step = i + 1
        finite = step != run.diverge_at
        step_time = run.step_time_factor * 0.05 * (1 + 0.02 * loss_calls) * (1 + 0.05 * timing.random())
        counted = counted_step(step, run.steps, DEFAULT_METRICS)  # as the runner samples (metrics.count_*)
        all_reduce = {"calls": loss_calls + 1, "bytes": 8 * (loss_calls + 1), "seconds": 1e-4 * (loss_calls + 1)}
        gathers = 6 + run.own_all_gathers
        all_gather = {"calls": gathers, "bytes": 1000 * gathers, "seconds": 1e-3 * gathers / 6}
        records.append(
            {
                "step": step,
                "dp": run.world_size // run.sp,
                "sp": run.sp,
                "tokens": 1000 * step,
                "valid_tokens": 1000,
                "micro_batch_tokens_min": 250 if packed else 200,
                "micro_batch_tokens_max": 250 if packed else 300,
                "loss": float(loss[i]) if finite else None,
                "reported_loss": float(loss[i]) * run.reported_factor if finite else None,
                "grad_norm": float(grad_norm[i]) if finite else None,
                "clip_coef": min(1.0, 1.0 / (float(grad_norm[i]) + 1e-6)),
                "lr": 3e-3,
                "step_time_s": step_time,
                "peer_skew_s": 1e-4,
                "tokens_per_s": 1000 / step_time,
                "comm": {"all_gather": all_gather, "all_reduce": all_reduce} if counted else None,
                "loss_comm": {"calls": loss_calls, "bytes": 8 * loss_calls, "seconds": 1e-4 * loss_calls}
                if counted
                else None,
                "grad_sketch": sketch[i].tolist() if finite else [float("nan")] * SKETCH_DIM,
            }
        )
        if run.norm_hook and finite:
            records[-1]["true_grad_norm"] = float(grad_norm[i]) / run.norm_factor
    return records


def _measured_backward(run: SyntheticRun) -> dict:
    """summary.json's `all_reduce_backward` as a `sum` run records it (`runner.train.all_reduce.measured_backward`):
    W per rank for a SUM backward, 1 for identity; {} for modes without an all-reduce in the graph."""
    if not has_graph_all_reduce(run.reduction):
        return {}
    implementation = AutogradAllReduce((run.overrides or {}).get("autograd_all_reduce", "funcol"))
    factor = float(run.world_size) if ALL_REDUCE_BACKWARD[implementation] == "sum" else 1.0
    measured = {"implementation": implementation.value, "factor": factor, "per_rank": [factor] * run.world_size}
    return {"all_reduce_backward": {**measured, "expected": factor, "as_expected": True, "torch": "2.13.0+cpu"}}


def write_sweep(sweep: Path, runs: list[SyntheticRun]) -> Path:
    """A sweep directory (multirun.yaml + one job directory per run) as `python -m runner -m` leaves it."""
    sweep.mkdir(parents=True, exist_ok=True)
    (sweep / "multirun.yaml").write_text("# synthetic sweep (analysis.testing.synthetic)\n")
    for number, run in enumerate(runs):
        job = sweep / f"{number}_{run.job_name}"
        job.mkdir()
        (job / "config.yaml").write_text(_config_yaml(run))
        write_config_copy(job / "config.yaml")  # as the runner's save_run_config does
        records = _records(run)
        with (job / "metrics.jsonl").open("w") as out:
            for record in records:
                out.write(json.dumps(record).replace("NaN", "null") + "\n")
        if run.status != "failed":  # as the runner leaves it: a job that closed its logger has the Arrow copy
            write_arrow_copy(job / "metrics.jsonl")
        error = {
            "failed": "rank 1 exited with code 1",
            "diverged": f"not finite at step {run.diverge_at}",
            "invalid": "sp=3 does not divide world_size=2",
        }.get(run.status)
        summary = {"status": run.status, "error": error, "steps_done": len(records), "device": "cpu", "backend": "gloo"}
        if run.paper:
            summary["custom_upstream"] = [{"paper": run.paper, "where": "its objective"}]
        summary.update(_measured_backward(run) if run.status != "invalid" else {})
        summary.update(run.summary or {})
        (job / "summary.json").write_text(json.dumps(summary))
    return sweep


def write_cost_job(
    job: Path,
    ratios: dict[str, float],
    steps: int = 150,
    noise: float = 0.02,
    drift_from: int | None = None,
    local_s: float = 0.03,
    seed: int = 0,
    world_size: int = 2,
    grad_accum: int = 2,
    load: np.ndarray | None = None,
    first_arm_penalty: float = 0.0,
) -> Path:
    """An interleaved cost job (runner.measure.cost's files) whose arms take `ratios[mode]` x local's time.

    Every step has its own load factor (1, or 3 from `drift_from` on, as when another
    process starts; or `load[step - 1]`), shared by all arms of that step; each arm adds
    its own noise. The arms run in a random order each step, as the runner's do, and the
    one that runs first takes `first_arm_penalty` longer (a cold cache, say).
    """
    job.mkdir(parents=True)
    modes = ["local", *ratios]
    cfg = OmegaConf.structured(RunConfig)
    for key, value in {
        "world_size": world_size,
        "grad_accum": grad_accum,
        "train.steps": steps,
        "cost.modes": modes,
        "wandb.mode": "disabled",
    }.items():
        OmegaConf.update(cfg, key, value, merge=False)
    (job / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    write_config_copy(job / "config.yaml")
    rng = np.random.default_rng(seed)
    collectives = {m: {"plain": 1, "functional": 1, "differentiable": 0} for m in modes}
    collectives["sum"] = {"plain": 1, "functional": 0, "differentiable": grad_accum}
    with (job / "metrics.jsonl").open("w") as out:
        for step in range(1, steps + 1):
            factor = (
                load[step - 1] if load is not None else 3.0 if drift_from is not None and step >= drift_from else 1.0
            )
            order = [modes[i] for i in rng.permutation(len(modes))]
            times = {
                m: local_s * factor * {"local": 1.0, **ratios}[m] * (1 + noise * rng.standard_normal())
                * (1 + first_arm_penalty * (m == order[0]))
                for m in modes
            }  # fmt: skip
            record = {
                "step": step,
                "loss": 3.0,
                "grad_norm": 1.0,
                "cost_s": times,
                "cost_order": order,
                "loss_collectives": collectives if step == 1 else None,
            }
            out.write(json.dumps(record) + "\n")
    floor = {kind: {"median_s": 2e-4, "p90_s": 3e-4, "calls": 1000} for kind in ("plain", "functional")}
    floor["differentiable"] = {"median_s": 1e-3, "p90_s": 1.5e-3, "calls": 1000}
    (job / "floor.json").write_text(json.dumps({**floor, "world_size": world_size, "backend": "gloo"}))
    (job / "summary.json").write_text(json.dumps({"status": "completed", "error": None, "steps_done": steps}))
    return job


# Post-training layouts (conf/layout/): (world_size, sp, grad_accum).
PG_LAYOUTS = {"w1": (1, 1, 1), "w1_ga2": (1, 1, 2), "w2": (2, 1, 1), "w2_sp2": (2, 2, 1)}


def pg_run(
    name: str,
    layout: str,
    weighs: str | None,
    expect_layouts: str | None,
    *,
    factor: float = 1.0,
    turn: float = 0.0,
    paper: str | None = None,
    steps: int = 3,
) -> SyntheticRun:
    """A post-training rule's run (objective=pg, reduction=custom) at one of PG_LAYOUTS, its gradient `factor` x
    the shared one turned by `turn` (turns add: two runs' step-1 cosine is cos(turn_a - turn_b))."""
    world_size, sp, grad_accum = PG_LAYOUTS[layout]
    custom = {
        "objective.name": "pg",
        "custom.fn": f"my_rules:{name.replace(' ', '_')}",
        "custom.name": name,
        **({"custom.weighs": weighs} if weighs else {}),
        **({"custom.expect_layouts": expect_layouts} if expect_layouts else {}),
    }
    return SyntheticRun(
        "custom", world_size, sp, grad_accum, steps=steps, factor=factor, turn=turn, paper=paper, overrides=custom
    )


def known_bug_runs(
    name: str,
    *,
    world_size: int = 2,
    expect: str = "different",
    buggy_factor: float = 1.0,
    buggy_turn: float = 0.0,
    fixed_factor: float = 1.0,
    buggy_status: str = "completed",
    steps: int = 3,
    grad_norm: str | None = None,
    buggy_norm_factor: float = 1.0,
    buggy_departs_from: int | None = None,
    evidence: str = "release",
) -> list[SyntheticRun]:
    """A known bug's three arms as `-m bug=NAME` leaves them (conf/bug/): the reference `sum`, the buggy arm (its
    gradient k times grad L and/or turned) and the fixed arm (k times grad L), sharing the bug's `known_bug.*`.
    A grad-norm bug states `grad_norm` (known_bug.buggy.grad_norm); its buggy arm logs `buggy_norm_factor` x its
    gradient's norm and its loss departs from step `buggy_departs_from` (clipping that binds). `evidence`:
    known_bug.evidence (a release by default: "reproduced" when the arms show as stated)."""
    bug = {
        "known_bug.name": name,
        "known_bug.reference": f"example/{name} #1",
        "known_bug.signature": f"{name}'s reported signature",
        "known_bug.evidence": evidence,
        "known_bug.evidence_source": f"{name}'s evidence",
        "known_bug.buggy.fn": f"bugs.{name}:buggy",
        "known_bug.buggy.expect": expect,
        "known_bug.fixed.fn": f"bugs.{name}:fixed",
        "known_bug.fixed.fsdp_reduce": "sum",
        **({"known_bug.buggy.grad_norm": grad_norm} if grad_norm is not None else {}),
    }

    def arm(which: str, fsdp: str, arm_expect: str) -> dict:
        return {
            **bug,
            "custom.fn": bug[f"known_bug.{which}.fn"],
            "custom.fsdp_reduce": fsdp,
            "custom.expect": arm_expect,
        }

    common = dict(world_size=world_size, steps=steps)
    return [
        SyntheticRun(reduction="sum", overrides=bug, **common),
        SyntheticRun(
            reduction="custom",
            factor=buggy_factor,
            turn=buggy_turn,
            status=buggy_status,
            fail_after=1 if buggy_status == "failed" else None,
            norm_factor=buggy_norm_factor,
            loss_shift_from=buggy_departs_from,
            overrides=arm("buggy", "mean", expect),
            **common,
        ),
        SyntheticRun(reduction="custom", factor=fixed_factor, overrides=arm("fixed", "sum", "grad L"), **common),
    ]
