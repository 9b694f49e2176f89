"""What the elastic agent would add to the runner's launching process before any rank starts (B8).

The runner's launcher never imports torch; the agent is torch code. Each
figure is the median of a few fresh `python -c` processes.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

_TIMED = "import time{before}; t = time.perf_counter(); import torch.distributed.launcher.api; print(time.perf_counter() - t)"


def _median_seconds(code: str, reps: int) -> float:
    runs = [
        subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True) for _ in range(reps)
    ]
    return float(np.median([float(run.stdout) for run in runs]))


@dataclass(frozen=True)
class LauncherImports:
    fresh_s: float  # torch and the elastic launcher, in a process that had imported neither
    after_torch_s: float  # the elastic launcher alone, once torch is imported
    reps: int


def measure(reps: int = 5) -> LauncherImports:
    return LauncherImports(
        _median_seconds(_TIMED.format(before=""), reps), _median_seconds(_TIMED.format(before=", torch"), reps), reps
    )


def autogroup() -> str:
    """The kernel's autogroup scheduling switch ("1": each session gets its own CPU share)."""
    try:
        return Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip()
    except OSError:
        return "absent"
