"""Per-step metrics: always appended to metrics.jsonl, mirrored to W&B; rank 0 only."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from runner.metrics_file import write_arrow_copy
from runner.wandb_run import wandb_payload


class MetricLogger:
    def __init__(self, path: Path, wandb_run=None):
        self.path = path
        self.file = path.open("a")
        self.wandb_run = wandb_run

    def log(self, record: dict[str, Any]) -> None:
        # JSON has no NaN/inf: a diverged step is written as null.
        clean = {key: (None if isinstance(value, float) and not math.isfinite(value) else value) for key, value in record.items()}
        self.file.write(json.dumps(clean) + "\n")
        self.file.flush()
        if self.wandb_run is not None:
            self.wandb_run.log(wandb_payload(record))

    def close(self) -> None:
        self.file.close()
        write_arrow_copy(self.path)  # the analysis reads this instead of parsing the JSON again
        if self.wandb_run is not None:
            self.wandb_run.finish()
            self.wandb_run = None


def progress_line(record: dict[str, Any], steps: int) -> str:
    return (
        f"step {record['step']:>{len(str(steps))}}/{steps} | loss {record['loss']:.4f} | "
        f"grad_norm {record['grad_norm']:.3g} | {record['tokens_per_s'] / 1e3:.1f}k tok/s"
    )
