"""The analysis of one or more sweeps, start to end: load, compare, tabulate, plot, report, log.

Writes into `out`: runs.parquet (every step with its run's config and status),
verdicts.csv (one row per run: its baseline, the measures, the verdict and the
expected one), invariance.csv, comm.csv, cost.csv and floor.csv (when the
sweep holds an interleaved cost job), trainers.csv (custom rules), rl.csv,
rl_runs.csv and rl_papers.csv (objective=pg runs), report.md and the PNG plots.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from analysis.bugs.table import bugs_csv, bugs_table
from analysis.cost.comm import comm_table
from analysis.cost.interleaved import MIN_STEPS, cost_table, floor_table, short_cost_jobs
from analysis.gradients.expected import expected_verdicts
from analysis.gradients.groups import assign_groups, refuse_different_data
from analysis.gradients.invariance import invariance, invariance_summary
from analysis.gradients.measures import measure
from analysis.gradients.tolerances import Tolerances
from analysis.gradients.verdicts import verdicts
from analysis.load.runs_parquet import write_runs_parquet
from analysis.load.sweeps import load_sweeps
from analysis.plots.background import Background
from analysis.plots.cost import comm_overhead, counted_modes, interleaved_cost
from analysis.plots.curves import curve_figure_jobs, curve_figure_paths
from analysis.plots.post_training import post_training_plot
from analysis.post_training.layouts import layout_table as post_training_runs
from analysis.post_training.papers import paper_table
from analysis.post_training.table import rl_table
from analysis.report.answer import opening
from analysis.report.bugs import bugs_answer, bugs_section
from analysis.report.cost import cost_answer, interleaved_clause
from analysis.report.document import training_sections, write_report
from analysis.report.post_training import post_training_answer, post_training_section
from analysis.report.rfc import rfc_answer
from analysis.report.trainers import trainer_sentences, trainers_section
from analysis.trainers.table import trainers_csv, trainers_table
from analysis.wandb_log import log_analysis, resolve_mode

VERDICT_ID_COLUMNS = [
    "run",
    "sweep",
    "job",
    "group",
    "group_label",
    "family",
    "layout",
    "optimizer",
    "reduction",
    "world_size",
    "sp",
    "grad_accum",
    "tp",
    "pp",
    "pp_schedule",
    "data_ranks",
    "status",
    "diverged_at",
    "baseline",
    "baseline_kind",
    "fsdp_reduction",
    "all_reduce",
    "backward_factor",
    "backward_torch",
]


@dataclass
class Analysis:
    out: Path
    runs: pd.DataFrame
    verdicts: pd.DataFrame
    invariance: pd.DataFrame
    comm: pd.DataFrame
    cost: pd.DataFrame  # the interleaved measurement, one row per (cost job, mode)
    answer: str
    report: Path
    wandb_dir: Path | None
    written: list[str]  # the files written into `out`
    notes: list[str] = field(default_factory=list)  # what was left out of the input and why (the load's)
    timings: dict[str, float] = field(default_factory=dict)  # seconds per phase
    # objective=pg: one row per mode (rl.csv), per run against its mode at W=1 (rl_runs.csv), per mode and paper
    post_training: pd.DataFrame = field(default_factory=pd.DataFrame)
    post_training_runs: pd.DataFrame = field(default_factory=pd.DataFrame)
    post_training_papers: pd.DataFrame = field(default_factory=pd.DataFrame)
    bugs: pd.DataFrame = field(default_factory=pd.DataFrame)  # the known-bugs table, one row per bug (bugs.csv)


class _Clock:
    """Seconds per phase: `clock("load")` closes the phase that ran since the last call."""

    def __init__(self) -> None:
        self.timings: dict[str, float] = {}
        self._last = time.perf_counter()

    def __call__(self, phase: str) -> None:
        now = time.perf_counter()
        self.timings[phase] = now - self._last
        self._last = now


def analyze(
    sweeps: list[Path], out: Path, tol: Tolerances = Tolerances(), *, make_plots: bool = True, wandb_mode: str = "auto"
) -> Analysis:
    # Two helpers work while this process computes: a forked process that draws the per-group
    # figures, and a thread that builds and writes runs.parquet (Arrow, mostly without the GIL).
    # The process is forked first, before the load: no other thread is at work yet, and it shares
    # only the imports' pages with this process, so this process' writes to the memory that the
    # load fills cost no copy-on-write faults (1,000 runs: about 15,000 fewer page faults).
    clock = _Clock()
    background = Background() if make_plots else None
    try:
        return _analyze(sweeps, out, tol, clock, background, wandb_mode)
    finally:
        if background is not None:
            background.shutdown()  # at once where the analysis raised; else it has waited for the figures already


def _analyze(
    sweeps: list[Path], out: Path, tol: Tolerances, clock: _Clock, background: Background | None, wandb_mode: str
) -> Analysis:
    make_plots = background is not None
    out.mkdir(parents=True, exist_ok=True)
    loaded = load_sweeps(sweeps)
    if loaded.runs.empty:
        return _analyze_cost_only(sweeps, out, loaded, clock, make_plots, wandb_mode)
    runs = assign_groups(loaded.runs).reset_index(drop=True)
    refuse_different_data(runs)  # NotComparable, naming the runs, before anything is written
    clock("load")
    writer = ThreadPoolExecutor(max_workers=1)
    parquet_written = writer.submit(write_runs_parquet, loaded, out / "runs.parquet")

    measures, curves = measure(runs, loaded.steps, tol)
    plotting = make_plots and bool(curves["logged"].any())
    curve_pngs = (
        [background.submit(draw, *args) for draw, args in curve_figure_jobs(runs, curves, out)] if plotting else []
    )
    table = _verdicts_table(runs, measures, tol, loaded.steps)
    written: dict[str, pd.DataFrame] = {}  # each table as it is written, under its file's name
    _save(out, written, {"verdicts.csv": table})
    clock("measures and verdicts")

    layout_table = invariance(runs, curves["loss"], curves["logged"], tol)
    layout_summary = invariance_summary(layout_table)
    comm = comm_table(runs, loaded.steps)
    _save(out, written, {"invariance.csv": layout_table, "comm.csv": comm})
    cost, floor = _cost_tables(loaded, out, written)
    clock("invariance and communication")

    rl_runs = post_training_runs(runs, loaded.steps, tol)
    rl_papers = paper_table(rl_runs, runs, loaded.steps, tol)
    rl = rl_table(rl_runs, rl_papers)
    if len(rl):
        _save(out, written, {"rl.csv": rl, "rl_runs.csv": rl_runs, "rl_papers.csv": rl_papers})
    clock("post-training")

    other_pngs = _figures_drawn_here(plotting, rl_runs, rl, comm, cost, out)
    clock("plots (this process)")
    # The report names the per-group figures while the forked process may still be drawing them.
    pngs = (curve_figure_paths(curves, out, runs) if plotting else []) + other_pngs
    trainers, bugs = trainers_table(runs, table, comm), bugs_table(runs, table, tol)
    if len(trainers):
        _save(out, written, {"trainers.csv": trainers_csv(trainers)})
    if len(bugs):
        _save(out, written, {"bugs.csv": bugs_csv(bugs)})
    answer = _answer(runs, table, comm, layout_summary, cost, trainers, bugs, rl)
    body = (
        post_training_section(rl)
        + bugs_section(bugs)
        + trainers_section(trainers)
        + training_sections(runs, table, comm, layout_table, layout_summary, tol)
    )
    report = write_report(
        out, sweeps, answer, body, pngs, cost, floor, groups=runs["group"].nunique(), notes=loaded.notes
    )
    clock("report")
    _wait_for_helpers(curve_pngs, parquet_written, writer, clock)
    # W&B gets the cost tables where the cost jobs gave rows (their files are written for any that measured)
    tables = {name.removesuffix(".csv"): f for name, f in written.items() if len(cost) or name not in _COST_FILES}
    wandb_dir = log_analysis(out, sweeps[0].name, runs, tables, pngs, report, resolve_mode(wandb_mode, runs))
    clock("W&B")
    files = ["report.md", "verdicts.csv", "invariance.csv", "comm.csv", "runs.parquet"]
    files += [name for name in _LATER_FILES if name in written] + [p.name for p in pngs]
    return Analysis(
        out,
        runs,
        table,
        layout_table,
        comm,
        cost,
        answer,
        report,
        wandb_dir,
        files,
        loaded.notes,
        clock.timings,
        rl,
        rl_runs,
        rl_papers,
        bugs,
    )


_COST_FILES = ("cost.csv", "floor.csv")
_LATER_FILES = (*_COST_FILES, "trainers.csv", "rl.csv", "rl_runs.csv", "rl_papers.csv", "bugs.csv")  # as listed


def _save(out: Path, written: dict[str, pd.DataFrame], frames: dict[str, pd.DataFrame]) -> None:
    """Write each table to out/NAME now (what is done stays written if a later step fails); note it."""
    for name, frame in frames.items():
        frame.to_csv(out / name, index=False)
        written[name] = frame


def _cost_tables(loaded, out: Path, written: dict[str, pd.DataFrame]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(cost, floor) of the cost jobs that measured, written where any did; a short job is noted."""
    cost_jobs = loaded.cost_jobs if loaded.cost_jobs is not None else pd.DataFrame()  # those that measured
    cost, floor = cost_table(cost_jobs), floor_table(cost_jobs)
    loaded.notes.extend(short_cost_jobs(cost_jobs))
    if len(cost_jobs):
        _save(out, written, {"cost.csv": cost, "floor.csv": floor})
    return cost, floor


def _wait_for_helpers(curve_pngs: list, parquet_written, writer: ThreadPoolExecutor, clock: _Clock) -> None:
    """The forked process's figures and the thread's runs.parquet, each done on return."""
    for drawn in curve_pngs:
        drawn.result()
    clock("plots (rest, in the forked process)")
    parquet_written.result()
    writer.shutdown()
    clock("runs.parquet (rest of the write)")


def _verdicts_table(runs: pd.DataFrame, measures: pd.DataFrame, tol: Tolerances, steps) -> pd.DataFrame:
    """verdicts.csv: each run's measures, its verdict and what it was expected to give, with its baseline's
    clipping beside its own."""
    judged = verdicts(runs, measures, tol)
    table = pd.concat([runs[VERDICT_ID_COLUMNS], measures, judged, expected_verdicts(runs, judged, tol, steps)], axis=1)
    clip_by_run = measures["clip_active_frac"].set_axis(runs["run"])
    table.insert(table.columns.get_loc("clip_active_frac") + 1, "baseline_clip_frac", runs["baseline"].map(clip_by_run))
    return table


def _figures_drawn_here(
    plotting: bool, rl_runs: pd.DataFrame, rl: pd.DataFrame, comm: pd.DataFrame, cost: pd.DataFrame, out: Path
) -> list[Path]:
    """The figures this process draws (the per-group curves are the forked process's)."""
    if not plotting:
        return []
    pngs = [post_training_plot(rl_runs, rl, out)] if len(rl) else []
    pngs += [comm_overhead(comm, out)] if len(counted_modes(comm)) >= 2 else []
    pngs += [interleaved_cost(cost, out)] if len(cost) else []
    return pngs


def _answer(runs, table, comm, layout_summary, cost, trainers, bugs, rl) -> str:
    """The report's answer: the post-training one first where the sweep has one, then the training answer, the
    known bugs', the RFC's and the trainers' sentences."""
    answer = opening(runs, table, comm, layout_summary, cost, trainers)
    if len(rl):  # a post-training sweep asks this first
        answer = answer.replace("## Answer\n\n", f"## Answer\n\n{post_training_answer(rl)}\n\n", 1)
    extras = (bugs_answer(bugs) if len(bugs) else "", rfc_answer(table, runs), "\n".join(trainer_sentences(trainers)))
    for extra in extras:
        answer += f"\n{extra}\n" if extra else ""
    return answer


def _analyze_cost_only(
    sweeps: list[Path], out: Path, loaded, clock: _Clock, make_plots: bool, wandb_mode: str
) -> Analysis:
    """Interleaved cost jobs alone (`python -m runner experiment=cost`): their tables, plot and report section."""
    cost_jobs = loaded.cost_jobs if loaded.cost_jobs is not None and len(loaded.cost_jobs) else None
    if cost_jobs is None:  # a cost job that measured nothing (refused, failed), and no training runs
        cost = floor = pd.DataFrame()
        answer = "## Answer\n\nNothing measured: " + "; ".join(loaded.notes or ["no job here ran"]) + ".\n"
        report = write_report(out, sweeps, answer, [], [], None, None, notes=loaded.notes)
        empty = pd.DataFrame()
        return Analysis(out, loaded.runs, empty, empty, empty, cost, answer, report, None, ["report.md"], loaded.notes)
    cost, floor = cost_table(cost_jobs), floor_table(cost_jobs)
    short = short_cost_jobs(cost_jobs)
    loaded.notes.extend(short)
    cost.to_csv(out / "cost.csv", index=False)
    floor.to_csv(out / "floor.csv", index=False)
    pngs = [interleaved_cost(cost, out)] if make_plots and len(cost) else []
    jobs = [job for _, job in cost.groupby("job", sort=False)]
    answer = "## Answer\n\n" + (
        " ".join(cost_answer(job) for job in jobs)
        + "\n\nNo training runs here, only the interleaved cost measurement: "
        + " Also, ".join(interleaved_clause(job) for job in jobs)
        + ".\n"
        if jobs
        else "Not measured: "
        + ("; ".join(short) or f"no cost job holds {MIN_STEPS} steps after its warm-up")
        + ". No training runs are here.\n"
    )
    report = write_report(out, sweeps, answer, [], pngs, cost, floor, notes=loaded.notes)
    clock("cost only")
    tables = {"cost": cost, "floor": floor}
    wandb_dir = log_analysis(out, sweeps[0].name, cost_jobs, tables, pngs, report, resolve_mode(wandb_mode, cost_jobs))
    written = ["report.md", "cost.csv", "floor.csv", *[p.name for p in pngs]]
    empty = pd.DataFrame()
    return Analysis(
        out, loaded.runs, empty, empty, empty, cost, answer, report, wandb_dir, written, loaded.notes, clock.timings
    )
