"""Load the job directories of one or more sweeps into two tidy DataFrames.

- `runs`: one row per job directory (whatever became of it): `run` (its id,
  `<sweep>/<job>`), `sweep`, `job`, `status`, `error`, `steps_done`,
  `steps_logged`, `diverged_at`, `device_used`, `backend`, `paper` (the published
  objective a custom rule writes out, from summary.json), what its summary.json
  records of the code and data it rests on (`analysis.load.provenance`: `upstream`,
  the measured all-reduce backward, the identity's data parts), then the whole resolved
  config flattened to dotted columns (`reduction`, `world_size`, `optim.lr`...).
- `steps`: one row per (run, logged step): the metrics.jsonl records, with
  `comm` flattened to `comm_<kind>_<field>` (plus `comm_total_<field>` over
  kinds), `loss_comm` to `loss_comm_<field>` and `grad_sketch` to
  `sketch_0..sketch_{K-1}`.

A job without summary.json is `unfinished` (still running, or its process died
before writing one); a job without metrics.jsonl has no steps. Nothing here raises on a broken
job: what can be read is kept and the rest is reported.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import yaml

from analysis.load.jobs import distinct_jobs, recordless
from analysis.load.provenance import COLUMNS as PROVENANCE
from analysis.load.provenance import provenance
from runner.record.config_file import read_config
from runner.record.metrics_file import parse_jsonl, read_arrow_copy

RUN_COLUMNS = [
    "run",
    "sweep",
    "job",
    "status",
    "error",
    "steps_done",
    "steps_logged",
    "diverged_at",
    "device_used",
    "backend",
    "paper",
    *PROVENANCE,
]
NOT_RUN = ("invalid", "skipped")  # statuses of jobs that never started a rank
# Every run has these, whatever its config.yaml held: the analysis groups by them.
REQUIRED_CONFIG = {
    "reduction": None,
    "world_size": np.nan,
    "sp": np.nan,
    "grad_accum": np.nan,
    "dp_replicate": 1,  # HSDP replicas; a config written before the key ran one
    "tp": 1,  # tensor-parallel ranks; likewise
    "pp": 1,  # pipeline stages; likewise
    "pp_schedule": "gpipe",  # the schema's default: a config without pp ran no pipeline
    "data.packing": False,
    "optim.name": None,
    "optim.lr": np.nan,
    "optim.clip": np.nan,
}

# What a config written before a key ran, filled in where runs of such configs lie beside newer ones: the layout's
# sizes (whole numbers, as the newer configs hold them) and the pipeline's settings, so that an older run keeps
# its group and family (`analysis.gradients.groups`) with the newer runs of its config.
OLDER_CONFIG = {"dp_replicate": 1, "tp": 1, "pp": 1, "pp_schedule": "gpipe", "pp_scale_grads": False}


@dataclass
class Sweeps:
    runs: pd.DataFrame
    steps: pd.DataFrame
    # Interleaved cost jobs (`cost.modes` set) that measured: one row each, with `path`; not runs to compare.
    cost_jobs: pd.DataFrame | None = None
    # What the analysis says of its input: a folder given twice, a cost job refused, failed or missing.
    notes: list[str] = dataclass_field(default_factory=list)


def is_cost_job(row: dict) -> bool:
    return bool(row.get("cost.modes"))


def _flatten(config: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _read_summary(job: Path) -> dict:
    try:
        return json.loads((job / "summary.json").read_text())
    except FileNotFoundError:
        return {
            "status": "unfinished",
            "error": "no summary.json: still running, or its process died before writing one",
        }
    except json.JSONDecodeError as error:
        return {"status": "failed", "error": f"summary.json is not JSON: {error}"}


def _paper(summary: dict) -> str | None:
    """The published objective a custom rule writes out (its summary's `custom_upstream` entry with a `paper`:
    `runner.train.custom_rule.Paper`), None for any other run: the post-training table compares every mode with
    the papers' objectives."""
    upstream = summary.get("custom_upstream")
    papers = (
        [entry["paper"] for entry in upstream if isinstance(entry, dict) and entry.get("paper")]
        if isinstance(upstream, list)
        else []
    )
    return papers[0] if papers else None


def _run_row(sweep: Path, job: Path) -> dict:
    summary = _read_summary(job)
    error = summary.get("error") or ""
    row = {
        "run": f"{sweep.name}/{job.name}",
        "sweep": sweep.name,
        "job": job.name,
        "status": summary.get("status", "unfinished"),
        "error": error.strip().splitlines()[-1] if error.strip() else "",
        "steps_done": summary.get("steps_done", 0),
        "device_used": summary.get("device"),  # what `device` (a config key) resolved to
        "backend": summary.get("backend"),
        "paper": _paper(summary),
        **provenance(summary),
    }
    try:
        config = read_config(job / "config.yaml")
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        config = None
        row.update(status="failed", error=f"config.yaml is unreadable: {str(error).splitlines()[0]}")
    if not isinstance(config, dict):
        config = {}
        row.update(status="failed", error=row["error"] or "config.yaml holds no config")
    row.update(_flatten(config))
    return row


def _sketch_matrix(column: pa.ChunkedArray) -> np.ndarray | None:
    """grad_sketch lists as a [step, k] float array (NaN where missing); None when no step has one."""
    if column.null_count == len(column) or not pa.types.is_list(column.type):
        return None
    lengths = pc.list_value_length(column)
    width = pc.max(lengths).as_py()
    if column.null_count == 0 and pc.min(lengths).as_py() == width:  # the usual case: one copy (a writable array), in C
        values = np.concatenate([chunk.flatten().to_numpy(zero_copy_only=False) for chunk in column.chunks])
        return values.astype(float, copy=False).reshape(-1, width)
    rows = column.to_pylist()
    return np.array([r + [None] * (width - len(r)) if r is not None else [None] * width for r in rows], dtype=float)


def _steps_frame(run_ids: list[str], tables: list[pa.Table | None]) -> pd.DataFrame:
    """All runs' steps in one DataFrame: concatenated in Arrow (missing columns become null), converted once.

    `run` is a categorical whose categories are `run_ids` in order, so a step's run
    is row `steps.run.cat.codes` of the runs table.
    """
    present = [(i, t) for i, t in enumerate(tables) if t is not None]
    if not present:
        steps = pd.DataFrame({column: pd.Series(dtype=float) for column in ("step", "loss", "grad_norm")})
        steps.insert(0, "run", pd.Categorical([], categories=run_ids))
        return steps
    table = pa.concat_tables([t for _, t in present], promote_options="permissive")
    codes = np.repeat([i for i, _ in present], [len(t) for _, t in present]).astype(np.int32)
    table = table.append_column("run", pa.DictionaryArray.from_arrays(codes, pa.array(run_ids, pa.string())))
    sketch = _sketch_matrix(table.column("grad_sketch")) if "grad_sketch" in table.column_names else None
    if "grad_sketch" in table.column_names:
        table = table.drop_columns(["grad_sketch"])
    steps = table.to_pandas()
    steps = steps[["run"] + [c for c in steps.columns if c != "run"]]
    if sketch is not None:
        # copy=False: pandas would otherwise copy (and transpose) the whole [step, k] array into its own block.
        sketch_columns = pd.DataFrame(sketch, columns=[f"sketch_{k}" for k in range(sketch.shape[1])], copy=False)
        steps = pd.concat([steps, sketch_columns], axis=1)
    for field in ("calls", "bytes", "seconds"):
        kinds = [c for c in steps.columns if c.startswith("comm_") and c.endswith(f"_{field}")]
        if kinds:  # NaN on steps whose collectives were not counted (the runner samples steps)
            steps[f"comm_total_{field}"] = steps[kinds].sum(axis=1, min_count=1)
    return steps


def _read_metrics(paths: list[Path]) -> list[pa.Table | None]:
    """Every job's metrics table: the Arrow copies one after another (each a fraction of a millisecond,
    mostly holding the GIL), then the JSONL files without a matching copy parsed side by side in
    threads (Arrow parses without the GIL)."""
    tables = [read_arrow_copy(path) for path in paths]
    unparsed = [i for i, table in enumerate(tables) if table is None]
    if unparsed:
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            for i, table in zip(unparsed, pool.map(parse_jsonl, [paths[i] for i in unparsed])):
                tables[i] = table
    return tables


def _unmeasured_cost_job(row: dict, job: Path) -> str | None:
    """Why a cost job holds no measurement to analyse (None: it holds one)."""
    refused = job / "refused.json"
    if (job / "metrics.jsonl").exists():
        if refused.exists():
            reason = _refusal_reason(refused)
            return f"the cost job in {job} was refused in its last invocation ({reason}); its earlier measurement is analysed"
        return None
    status, error = row.get("status"), " ".join(str(_read_summary(job).get("error") or "").split())
    if status == "invalid":
        return f"the cost job in {job} was refused: {error or 'its config broke a rule'}"
    if refused.exists():
        return f"the cost job in {job} was refused: {_refusal_reason(refused)}"
    if status == "skipped":
        return f"the cost job in {job} was skipped: {error or 'this machine cannot run it'}"
    if status == "unfinished":
        return f"the cost job in {job} did not finish (no summary.json): still running, or its process died"
    return f"the cost job in {job} {status or 'ended'} before it measured a step" + (f": {error}" if error else "")


def _refusal_reason(path: Path) -> str:
    try:
        record = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return "refused.json is unreadable"
    reason = record.get("error") or record.get("reason") or record.get("outcome") or "no reason recorded"
    return " ".join(str(reason).split())


def load_sweeps(sweeps: list[Path]) -> Sweeps:
    """Every job at the given paths (sweeps, single runs or job directories), each once, as `runs` and `steps`;
    interleaved cost jobs that measured apart, in `cost_jobs`; `notes` says what was left out and why."""
    jobs, notes = distinct_jobs(sweeps)
    notes += recordless(sweeps)
    if not jobs:
        raise FileNotFoundError(
            f"no job directories (with config.yaml) in {', '.join(map(str, sweeps))}; give a sweep, run or job directory"
        )
    loaded = list(
        zip([_run_row(sweep, job) for sweep, job in jobs], _read_metrics([job / "metrics.jsonl" for _, job in jobs]))
    )
    loaded_all = loaded
    cost_rows = []
    for (row, _), (sweep, job) in zip(loaded, jobs):
        if is_cost_job(row):
            unmeasured = _unmeasured_cost_job(row, job)
            notes += [unmeasured] if unmeasured else []
            if (job / "metrics.jsonl").exists():
                cost_rows.append({**row, "path": str(sweep / job.name)})
    cost_jobs = pd.DataFrame(cost_rows)
    loaded = [(row, table) for row, table in loaded if not is_cost_job(row)]
    ids = pd.Series([row["run"] for row, _ in loaded])
    for (row, _), (sweep, job) in zip(loaded, [j for (r, _), j in zip(loaded_all, jobs) if not is_cost_job(r)]):
        if (
            ids == row["run"]
        ).sum() > 1:  # two sweeps of one name (a/multirun/x, b/multirun/x): their paths tell them apart
            row["run"] = f"{sweep}/{job.name}"
    runs = pd.DataFrame([row for row, _ in loaded], columns=RUN_COLUMNS if not loaded else None)
    for column, missing in REQUIRED_CONFIG.items():
        runs[column] = runs[column] if column in runs else missing
    for older, missing in OLDER_CONFIG.items():  # runs of older configs beside newer ones
        if older in runs:
            runs[older] = runs[older].fillna(missing)
            runs[older] = runs[older].astype(int) if type(missing) is int else runs[older]
    steps = _steps_frame(runs["run"].tolist(), [table for _, table in loaded])
    logged = steps.groupby("run", observed=True).size()
    not_finite = ~np.isfinite(steps["loss"].astype(float)) | ~np.isfinite(steps["grad_norm"].astype(float))
    first_bad = steps.loc[not_finite].groupby("run", observed=True)["step"].min()
    runs["steps_logged"] = runs["run"].map(logged).fillna(0).astype(int)
    runs["diverged_at"] = runs["run"].map(first_bad).astype(float)
    runs = runs[RUN_COLUMNS + [c for c in runs.columns if c not in RUN_COLUMNS]]
    return Sweeps(runs=runs, steps=steps, cost_jobs=cost_jobs, notes=notes)
