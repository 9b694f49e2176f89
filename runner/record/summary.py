"""summary.json of a job: status, error, steps done, wall-time split, versions, device.

Statuses: completed, failed (a rank raised, crashed or timed out), diverged
(loss or grad norm stopped being finite), invalid (the config breaks a rule;
nothing was started), skipped (valid, but this machine cannot run it, e.g.
more GPUs than are visible).
"""

from __future__ import annotations

import json
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

SUMMARY = "summary.json"
STATUSES = ("completed", "failed", "diverged", "invalid", "skipped")


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _git_sha() -> str | None:
    source = Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "-C", str(source), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def versions() -> dict[str, str | None]:
    return {
        "python": platform.python_version(),
        "torch": _version("torch"),
        "package": _version("loss-reduction-ablation"),
        "hydra": _version("hydra-core"),
        "wandb": _version("wandb"),
        "git_sha": _git_sha(),
    }


def read_summary(job_dir: Path, name: str = SUMMARY) -> dict[str, Any] | None:
    """summary.json of `job_dir` (or another JSON record of the job, by `name`), or None when there is none."""
    path = job_dir / name
    return json.loads(path.read_text()) if path.exists() else None


def update_summary(job_dir: Path, **fields: Any) -> dict[str, Any]:
    """Merge `fields` into summary.json (created if missing) and return the whole summary."""
    if "status" in fields and fields["status"] not in STATUSES:
        raise ValueError(f"unknown status {fields['status']!r}; valid: {STATUSES}")
    summary = read_summary(job_dir) or {}
    summary.update(fields)
    path = job_dir / SUMMARY
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)
    return summary
