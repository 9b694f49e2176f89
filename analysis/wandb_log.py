"""The analysis as a W&B run of the sweep's group (job_type `analysis`), beside the training runs.

Mode `auto` follows the sweep: the `wandb.mode` its runs used (offline by
default; disabled sweeps get no analysis run). One run per analysis folder:
its id is the folder's, and a re-analysis removes the earlier offline run
before logging, so `make sync` uploads one. Tables go in as wandb.Table,
plots as wandb.Image, and the report text as an HTML panel.
"""

from __future__ import annotations

import hashlib
import html
import shutil
from pathlib import Path

import pandas as pd

WANDB_MODES = ("auto", "offline", "online", "disabled")


def resolve_mode(requested: str, runs: pd.DataFrame) -> str:
    if requested != "auto":
        return requested
    used = runs["wandb.mode"].dropna().astype(str) if "wandb.mode" in runs else pd.Series(dtype=str)
    for mode in ("online", "offline"):
        if (used == mode).any():
            return mode
    return "disabled"


def log_analysis(
    out: Path,
    group: str,
    runs: pd.DataFrame,
    tables: dict[str, pd.DataFrame],
    plots: list[Path],
    report: Path,
    mode: str,
) -> Path | None:
    """Logs tables, plots and the report text; returns the offline run directory (None when disabled)."""
    if mode == "disabled":
        return None
    import wandb

    _forget_earlier_runs(out / "wandb")
    first = runs.iloc[0]
    run = wandb.init(
        id=analysis_run_id(out),  # one run per analysis folder: a re-analysis replaces it, online too
        project=first.get("wandb.project") or "loss-reduction-ablation",
        entity=first.get("wandb.entity") or None,
        group=group,
        job_type="analysis",
        name=f"analysis {group}",
        dir=str(out),
        mode=mode,
        config={"sweeps": sorted(runs["sweep"].unique().tolist()), "runs": len(runs)},
        resume="allow",
        settings=wandb.Settings(console="off", x_disable_stats=True, silent=True),
    )
    payload = {name: wandb.Table(dataframe=_loggable(table)) for name, table in tables.items()}
    payload.update({f"plots/{p.stem}": wandb.Image(str(p)) for p in plots})
    payload["report"] = wandb.Html(f"<pre>{html.escape(report.read_text())}</pre>")
    run.log(payload)
    run_dir = Path(run.dir).parent
    run.finish()
    return run_dir


def analysis_run_id(out: Path) -> str:
    """A W&B run id that names this analysis folder (W&B ids: letters, digits, dashes, underscores)."""
    return "analysis-" + hashlib.sha1(str(out.resolve()).encode()).hexdigest()[:16]


def _forget_earlier_runs(folder: Path) -> None:
    """The offline runs of earlier analyses into this folder: `make sync` would upload each of them."""
    if folder.is_dir():
        for run_dir in folder.glob("*run-*"):  # offline-run-<time>-<id>/ (and run-<id>.wandb files, if any)
            if run_dir.is_dir():
                shutil.rmtree(run_dir, ignore_errors=True)
            else:
                run_dir.unlink(missing_ok=True)


def _loggable(table: pd.DataFrame) -> pd.DataFrame:
    """W&B tables take plain columns: nullable and object columns become float or str."""
    out = table.copy()
    for column in out.columns:
        if out[column].dtype == bool or str(out[column].dtype) in ("boolean", "Int64"):
            out[column] = out[column].astype("float")
        elif not pd.api.types.is_numeric_dtype(out[column]):
            out[column] = out[column].astype(str)
    return out
