"""Per-step metrics: always appended to metrics.jsonl, mirrored to W&B; rank 0 only.

A trainer may `hold` records whose world figures are still to come and write
them with `write_held`; `close` writes whatever is still held (a failed job's
last steps, their world figures null), so no step is lost.
"""

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
        self.held: list[dict[str, Any]] = []

    def hold(self, record: dict[str, Any]) -> None:
        self.held.append(record)

    def write_held(self) -> list[dict[str, Any]]:
        """Writes the held records in order (as they are now); returns them."""
        held, self.held = self.held, []
        for record in held:
            self._write(record)
        self.file.flush()
        return held

    def log(self, record: dict[str, Any]) -> None:
        self._write(record)
        self.file.flush()

    def _write(self, record: dict[str, Any]) -> None:
        # JSON has no NaN/inf: a diverged step is written as null.
        clean = {key: (None if isinstance(value, float) and not math.isfinite(value) else value) for key, value in record.items()}
        self.file.write(json.dumps(clean) + "\n")
        if self.wandb_run is not None:
            self.wandb_run.log(wandb_payload(record))

    def close(self) -> None:
        self.write_held()
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
