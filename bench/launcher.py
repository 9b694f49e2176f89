"""B8: what torch's elastic engine (torchrun's) would cost per job over the runner's own launcher, against the fixed cost.

Every round runs, in a random order, five arms of W=2 on this machine:

- runner: `runner.sweep.spawn.run_world` starting `bench.launcher_rank` (join as the worker does, barrier, leave);
- runner again: the same, the null control (what the machine's noise alone makes of two equal arms);
- runner, own session: the same, each rank started in a new session, as the elastic agent starts them;
- elastic: `elastic_launch` (c10d rendezvous on a free port, max_restarts=0, per-rank log files with
  rank 0 tee'd to the terminal, as the runner does) starting the same program, timed from this process
  (torch and the elastic modules already imported) from the call to its return;
- job: `python -m runner train.steps=1`, whose wall time minus training is the per-job fixed cost (B2's).

The difference is paired per round (rounds are independent jobs), its 95% CI a bootstrap over rounds.
Where the time goes comes from the ranks' timestamps and the elastic agent's own `@prof` metrics.
The launching process's own import of torch and the launcher, which the agent needs and the runner's
launcher does not, is measured in fresh processes (`bench.launcher_imports`) and added for a single run.
"""

from __future__ import annotations

import functools
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from unittest import mock

import numpy as np

from bench.fixed_cost import runner_job
from bench.launcher_imports import autogroup
from bench.launcher_imports import measure as measure_imports
from runner.sweep.spawn import run_world

LIMIT = 0.20  # the bar: elastic stays out if its extra cost is above this share of the fixed cost
RANK_PROGRAM = "bench.launcher_rank"
RANK_MARKS = ("started", "imported", "joined", "left")
ARMS = ("runner", "runner again", "runner, own session", "elastic", "job")
_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


class _Timings:
    """A torchelastic metric handler that keeps (when emitted, name, value) of each `@prof` duration."""

    def __init__(self):
        self.rows: list[tuple[float, str, int]] = []

    def emit(self, metric_data) -> None:
        self.rows.append((time.time(), metric_data.name, metric_data.value))

    def interval(self, suffix: str, last: bool = False) -> tuple[float, float]:
        """(start, end) epoch seconds of the first (or last) call of the function named `suffix`."""
        rows = [row for row in self.rows if row[1].endswith(f"{suffix}.duration.ms")]
        emitted, _, ms = rows[-1 if last else 0]
        return emitted - ms / 1000, emitted

    def when(self, name: str) -> float:
        return next(emitted for emitted, row_name, _ in self.rows if row_name.endswith(name))

    def total(self, name: str) -> float:
        return sum(ms for _, row_name, ms in self.rows if row_name == f"{name}.duration.ms") / 1000

    def recording(self, name: str, function):
        """`function`, its calls' durations kept as `@prof` keeps them (for what the agent does not time itself)."""

        def timed(*args, **kwargs):
            started = time.time()
            try:
                return function(*args, **kwargs)
            finally:
                self.rows.append((time.time(), f"{name}.duration.ms", (time.time() - started) * 1000))

        return timed


def rank_marks(folder: Path, launcher: str) -> dict[str, float]:
    """Each mark of the ranks' timeline at its latest rank (the world moves on when its last rank has)."""
    records = [json.loads(path.read_text()) for path in sorted((folder / "phases").glob("rank*.json"))]
    assert len(records) == 2 and all(r["launcher"] == launcher for r in records), records
    return {mark: max(r[mark] for r in records) for mark in RANK_MARKS}


def runner_arm(folder: Path, own_session: bool = False) -> tuple[float, dict[str, float]]:
    # The elastic agent starts each rank in a session of its own; with the kernel's autogroup scheduling a new
    # session is a new CPU share, which on a shared machine speeds its ranks up. `own_session` does the same here.
    popen = functools.partial(subprocess.Popen, start_new_session=True) if own_session else subprocess.Popen
    started = time.time()
    with mock.patch.object(subprocess, "Popen", popen):
        outcome = run_world(2, folder, [], timeout_s=300, module=RANK_PROGRAM)
    returned = time.time()
    assert outcome.ok, outcome
    return returned - started, {"launch": started, **rank_marks(folder, "runner"), "returned": returned}


def elastic_arm(folder: Path, timings: _Timings) -> tuple[float, dict[str, float]]:
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.elastic.multiprocessing.tail_log import TailLog
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=2, rdzv_backend="c10d", rdzv_endpoint="localhost:0",
        run_id=uuid.uuid4().hex, max_restarts=0,
        logs_specs=DefaultLogsSpecs(log_dir=str(folder / "logs"), redirects=Std.ALL, tee={0: Std.ALL}),
    )  # fmt: skip
    timings.rows.clear()
    handlers = {sig: signal.getsignal(sig) for sig in _SIGNALS}
    # The agent sets an environment variable and signal handlers and leaves them: undo both, so arms stay apart.
    # Two steps the agent does not time: the rendezvous' random first-round delay, and stopping the tee's log tailers.
    delay = mock.patch.object(dynamic_rendezvous, "_delay", timings.recording("delay", dynamic_rendezvous._delay))
    tail_stop = mock.patch.object(TailLog, "stop", timings.recording("tail stop", TailLog.stop))
    with mock.patch.dict(os.environ), delay, tail_stop:
        started = time.time()
        try:
            elastic_launch(config, sys.executable)("-m", RANK_PROGRAM, str(folder))
            returned = time.time()
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
    marks = {"launch": started, **rank_marks(folder, "torchrun"), "returned": returned}
    marks["rendezvous start"], marks["rendezvous end"] = timings.interval("._rendezvous")
    marks["start workers end"] = timings.interval("._start_workers")[1]
    marks["final poll start"], marks["final poll end"] = timings.interval("._monitor_workers", last=True)
    marks["run end"] = timings.when("SimpleElasticAgent.run.duration.ms")
    marks["delay"], marks["tail stop"] = timings.total("delay"), timings.total("tail stop")
    return returned - started, marks


# (row, from mark, to mark): the timeline both launchers share, then the elastic agent's own steps
# (to mark None: the from mark is already a duration).
PHASES = [
    ("launch to the last rank's first line", "launch", "started"),
    ("rank imports torch.distributed", "started", "imported"),
    ("rank joins (init_world)", "imported", "joined"),
    ("rank barrier and leave", "joined", "left"),
    ("last rank left to launch returned", "left", "returned"),
]
ELASTIC_PHASES = [
    ("handler (TCPStore) and agent set-up", "launch", "rendezvous start"),
    ("rendezvous (`_rendezvous`)", "rendezvous start", "rendezvous end"),
    ("of which its sleeps (`_delay`: random 0 to 0.3 s on the first round)", "delay", None),
    ("start workers (`_start_workers`)", "rendezvous end", "start workers end"),
    ("workers started to the last rank's first line", "start workers end", "started"),
    ("last rank left to the final poll (monitor interval, process exit)", "left", "final poll start"),
    ("final poll (`_monitor_workers`: reap, close)", "final poll start", "final poll end"),
    ("of which stopping the tee's log tailers (`TailLog.stop`)", "tail stop", None),
    ("exit barrier and shutdown", "final poll end", "run end"),
    ("after `run` (rendezvous shutdown) to return", "run end", "returned"),
]


def median_ci(values: np.ndarray, denominator: np.ndarray | None = None, reps: int = 10_000) -> tuple[float, float]:
    """95% bootstrap CI over rounds of median(values) (over median(denominator), resampled with them, if given)."""
    rng = np.random.default_rng(0)
    picks = rng.integers(0, len(values), (reps, len(values)))
    stats = np.median(values[picks], axis=1)
    if denominator is not None:
        stats = stats / np.median(denominator[picks], axis=1)
    low, high = np.percentile(stats, [2.5, 97.5])
    return float(low), float(high)


def verdict(diff_ci, null_ci, fraction_ci) -> str:
    """Stated only when the difference's CI is clear of the noise: the null control's CI, stretched to take in 0."""
    if diff_ci[0] <= max(null_ci[1], 0) and diff_ci[1] >= min(null_ci[0], 0):
        return (f"not resolvable: the elastic-minus-runner CI overlaps the null control's; its upper end is "
                f"{fraction_ci[1]:.0%} of the fixed cost")  # fmt: skip
    if fraction_ci[0] > LIMIT:
        return f"elastic's extra cost EXCEEDS {LIMIT:.0%} of the fixed cost (CI {fraction_ci[0]:.0%} to {fraction_ci[1]:.0%})"
    if fraction_ci[1] < LIMIT:
        return f"elastic's extra cost is BELOW {LIMIT:.0%} of the fixed cost (CI {fraction_ci[0]:.0%} to {fraction_ci[1]:.0%})"
    return f"not resolvable: the fraction's CI ({fraction_ci[0]:.0%} to {fraction_ci[1]:.0%}) straddles {LIMIT:.0%}"


def phase_rows(marks: list[dict[str, float]], phases) -> list[float]:
    return [float(np.median([m[end] - m[start] if end else m[start] for m in marks])) for _, start, end in phases]


def run(quick: bool) -> tuple[str, str, str, str]:
    import torch  # noqa: F401  (the runner's parent has torch imported)
    from torch.distributed.elastic import metrics
    from torch.distributed.launcher.api import elastic_launch  # noqa: F401  (imported once per sweep, not timed)

    rounds = 2 if quick else 15
    timings = _Timings()
    metrics.configure(timings, "torchelastic")
    wall = {arm: [] for arm in ARMS}
    marks = {arm: [] for arm in ARMS[:4]}
    order = random.Random(0)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for index in range(rounds):
                for arm in order.sample(ARMS, len(ARMS)):
                    folder = Path(tmp) / f"{index}-{arm.replace(' ', '-')}"
                    if arm == "job":
                        seconds, _ = runner_job(Path(tmp), folder.name)
                    else:
                        own_session = arm == "runner, own session"
                        seconds, arm_marks = (
                            elastic_arm(folder, timings) if arm == "elastic" else runner_arm(folder, own_session)
                        )
                        marks[arm].append(arm_marks)
                    wall[arm].append(seconds)
    finally:
        metrics.configure(metrics.NullMetricHandler(), "torchelastic")
    wall = {arm: np.array(seconds) for arm, seconds in wall.items()}
    fixed = wall["job"]
    diff, null = wall["elastic"] - wall["runner"], wall["runner again"] - wall["runner"]
    diff_ci, null_ci = median_ci(diff), median_ci(null)
    fraction, fraction_ci = float(np.median(diff) / np.median(fixed)), median_ci(diff, fixed)
    null_fraction, null_fraction_ci = float(np.median(null) / np.median(fixed)), median_ci(null, fixed)
    session_diff = wall["elastic"] - wall["runner, own session"]
    session_ci, session_fraction_ci = median_ci(session_diff), median_ci(session_diff, fixed)
    # Less noisy: each launcher arm's wall time less its last rank's imports (the same code in every arm, and most of the noise).
    own = {arm: wall[arm] - np.array([m["imported"] - m["started"] for m in marks[arm]]) for arm in marks}
    own_diff, own_null = own["elastic"] - own["runner"], own["runner again"] - own["runner"]
    own_diff_ci, own_null_ci, own_fraction_ci = median_ci(own_diff), median_ci(own_null), median_ci(own_diff, fixed)
    labels = {"runner": "runner (`run_world`)", "runner again": "runner again (null control)",
              "runner, own session": "runner, each rank in a session of its own (as elastic starts them)",
              "elastic": "elastic (`elastic_launch`)", "job": "runner job, wall minus training (fixed cost)"}  # fmt: skip
    arm_rows = "\n".join(
        f"| {labels[arm]} | {np.median(s):.2f} | {np.percentile(s, 90):.2f} |" for arm, s in wall.items()
    )
    runner_phases, elastic_phases = phase_rows(marks["runner"], PHASES), phase_rows(marks["elastic"], PHASES)
    phase_table = "\n".join(
        f"| {name} | {r:.3f} | {e:.3f} | {e - r:+.3f} |"
        for (name, _, _), r, e in zip(PHASES, runner_phases, elastic_phases)
    )
    agent_table = "\n".join(
        f"| {name} | {s:.3f} |" for (name, _, _), s in zip(ELASTIC_PHASES, phase_rows(marks["elastic"], ELASTIC_PHASES))
    )
    imports = measure_imports(2 if quick else 5)
    body = f"""
{rounds} rounds; each runs five arms in a random order (W=2, gloo, this machine): the runner's `run_world` and
torch's `elastic_launch` (c10d rendezvous on a free port, max_restarts=0, per-rank log files, rank 0 tee'd)
each starting `bench/launcher_rank.py` (join as the worker does with `runner.world.env.init_world`, barrier,
leave); `run_world` once more as the null control, and once with its ranks in sessions of their own; and
`python -m runner train.steps=1` (tiny, W&B offline), whose wall time minus training is the per-job fixed cost,
as B2 measures it. The runner's arms fork their ranks from its fork server, torch already imported
(`runner.world.fork_server`, the default; RUNNER_FORK_SERVER=0 starts fresh interpreters), which elastic does
not: the first tables' difference holds the ranks' imports that forking saves, the table less the ranks'
imports compares the launchers alone. Launcher arms are timed in this
process, which has torch and the elastic modules imported (importing `torch.distributed.launcher.api` after
torch costs {imports.after_torch_s:.2f} s, once per sweep, not per job: not in the figures).

| arm | median s | p90 s |
|---|---|---|
{arm_rows}

| paired per round | median s | 95% CI (bootstrap over rounds) | of the fixed cost (95% CI) |
|---|---|---|---|
| elastic minus runner | {np.median(diff):+.3f} | {diff_ci[0]:+.3f} to {diff_ci[1]:+.3f} | {fraction:+.1%} ({fraction_ci[0]:+.1%} to {fraction_ci[1]:+.1%}) |
| runner again minus runner (null) | {np.median(null):+.3f} | {null_ci[0]:+.3f} to {null_ci[1]:+.3f} | {null_fraction:+.1%} ({null_fraction_ci[0]:+.1%} to {null_fraction_ci[1]:+.1%}) |
| elastic minus runner in own sessions | {np.median(session_diff):+.3f} | {session_ci[0]:+.3f} to {session_ci[1]:+.3f} | {np.median(session_diff) / np.median(fixed):+.1%} ({session_fraction_ci[0]:+.1%} to {session_fraction_ci[1]:+.1%}) |

The elastic agent starts its ranks with `start_new_session=True`; under the kernel's autogroup scheduling
(`/proc/sys/kernel/sched_autogroup_enabled` = {autogroup()}) a new session gets its own CPU share, so on a machine
shared with other work its ranks import faster than `run_world`'s, which share the parent's session. The
third row compares elastic with `run_world` whose ranks are started the same way.

The same, each arm's wall time less its last rank's imports (identical code in every arm, and most of the noise):

| paired per round | median s | 95% CI | of the fixed cost (95% CI) |
|---|---|---|---|
| elastic minus runner | {np.median(own_diff):+.3f} | {own_diff_ci[0]:+.3f} to {own_diff_ci[1]:+.3f} | {np.median(own_diff) / np.median(fixed):+.1%} ({own_fraction_ci[0]:+.1%} to {own_fraction_ci[1]:+.1%}) |
| runner again minus runner (null) | {np.median(own_null):+.3f} | {own_null_ci[0]:+.3f} to {own_null_ci[1]:+.3f} | {np.median(own_null) / np.median(fixed):+.1%} |

Null control's per-round differences range {null.min():+.3f} to {null.max():+.3f} s; elastic minus runner's
{diff.min():+.3f} to {diff.max():+.3f} s.

Where the time goes (median s over rounds; rank marks at the later of the two ranks):

| phase | runner | elastic | elastic minus runner |
|---|---|---|---|
{phase_table}

The elastic agent's steps (from its `@prof` metrics, when each call ended and how long it took, and two
functions timed the same way: the rendezvous' `_delay` and `TailLog.stop`):

| elastic phase | median s |
|---|---|
{agent_table}

The runner's launching process never imports torch (`runner.sweep.job` checks for a CUDA device node first); the
agent would make it import torch and the launcher: {imports.fresh_s:.2f} s in a fresh process (median of
{imports.reps}), once per sweep and once per single run. A single run would then pay
{np.median(diff):+.2f} + {imports.fresh_s:.2f} = {np.median(diff) + imports.fresh_s:.2f} s, **{(np.median(diff) + imports.fresh_s) / np.median(fixed):.0%} of its fixed cost**;
a sweep of n jobs {np.median(diff):.2f} + {imports.fresh_s:.2f}/n s a job ({(np.median(diff) + imports.fresh_s / 10) / np.median(fixed):.0%} at n = 10).

**Elastic launcher's extra cost per job: {np.median(diff):+.2f} s, {fraction:+.1%} of the {np.median(fixed):.2f} s fixed cost
(limit {LIMIT:.0%}): {verdict(diff_ci, null_ci, fraction_ci)}. Against ranks in their own sessions:
{np.median(session_diff):+.2f} s, {verdict(session_ci, null_ci, session_fraction_ci)}. Less its ranks' imports:
{np.median(own_diff):+.2f} s, {verdict(own_diff_ci, own_null_ci, own_fraction_ci)}. With the launching
process's own import, a single run: {(np.median(diff) + imports.fresh_s) / np.median(fixed):.0%} of the fixed cost,
{"ABOVE" if (np.median(diff) + imports.fresh_s) / np.median(fixed) > LIMIT else "below"} the {LIMIT:.0%} limit.**
"""
    return (
        "B8",
        "Elastic launcher (torchrun's engine) vs the runner's, against the fixed cost",
        "python -m bench b8" + (" --quick" if quick else ""),
        body,
    )
