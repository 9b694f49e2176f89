"""Load the job directories of a sweep (config.yaml, summary.json, metrics.jsonl) into DataFrames."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

JOB_COLUMNS = ["job", "status", "reduction", "world_size", "sp", "grad_accum", "seed", "optim", "steps_done", "error"]


def newest_sweep(root: Path = Path("multirun")) -> Path:
    sweeps = sorted((p for p in root.glob("*") if (p / "multirun.yaml").exists()), key=lambda p: p.stat().st_mtime)
    if not sweeps:
        raise FileNotFoundError(f"no sweep under {root}/ (run `make run` first, or pass a sweep directory)")
    return sweeps[-1]


def job_dirs(sweep: Path) -> list[Path]:
    return sorted(p for p in sweep.iterdir() if (p / "config.yaml").exists())


def load_jobs(sweep: Path) -> pd.DataFrame:
    """One row per job: its sweep axes and how it ended."""
    rows = []
    for job in job_dirs(sweep):
        cfg = OmegaConf.load(job / "config.yaml")
        summary_file = job / "summary.json"
        summary = json.loads(summary_file.read_text()) if summary_file.exists() else {"status": "failed", "error": "no summary.json"}
        error = summary.get("error") or ""
        rows.append(
            {
                "job": job.name,
                "status": summary.get("status"),
                "reduction": cfg.reduction,
                "world_size": cfg.world_size,
                "sp": cfg.sp,
                "grad_accum": cfg.grad_accum,
                "seed": cfg.seed,
                "optim": cfg.optim.name,
                "steps_done": summary.get("steps_done", 0),
                "error": error.splitlines()[0] if error else "",
            }
        )
    return pd.DataFrame(rows, columns=JOB_COLUMNS)


def load_steps(sweep: Path) -> pd.DataFrame:
    """One row per (job, step): the metrics.jsonl records, `comm` flattened to comm_<kind>_<field>."""
    frames = []
    for job in job_dirs(sweep):
        metrics = job / "metrics.jsonl"
        if not metrics.exists() or metrics.stat().st_size == 0:
            continue
        records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
        frame = pd.json_normalize(records, sep="_").drop(columns=["grad_sketch"], errors="ignore")
        frame["grad_sketch"] = [r.get("grad_sketch") for r in records]
        frame.insert(0, "job", job.name)
        frames.append(frame)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["job", "step"])
