"""Per-step metrics: always appended to metrics.jsonl, charted in W&B every `wandb_every`-th step; rank 0 only.

W&B gets step 1, every `wandb_every`-th step and the job's last record (a
diverged or failed job's too, written at `close`); metrics.jsonl gets every step.

A trainer may `hold` records whose world figures are still to come and write
them with `write_held`; `close` writes whatever is still held (a failed job's
last steps, their world figures null), so no step is lost.

W&B's `run.log` waits for a hand-off to W&B's own asyncio thread (about 0.3 ms
on an idle machine, several on a busy one), so one writer thread makes those
calls, in order, off the training loop; `close` waits for it, then raises the
first W&B error if there was one, and finishes the run either way.
JSONL lines are written by the caller, at once.
"""

from __future__ import annotations

import json
import math
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from runner.record.metrics_file import write_arrow_copy
from runner.record.wandb_run import wandb_payload


class MetricLogger:
    def __init__(self, path: Path, wandb_run=None, wandb_every: int = 1):
        self.path = path
        self.wandb_every = wandb_every
        self.uncharted: dict[str, Any] | None = None  # the last record written and not sent to W&B
        self.file = path.open("a")
        self.wandb_run = wandb_run
        self.held: list[dict[str, Any]] = []
        self.wandb_writer = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="wandb-log") if wandb_run is not None else None
        )
        self.wandb_calls: list[Future] = []
        self.wandb_error: BaseException | None = None  # the first failed run.log, raised by close

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
        clean = {
            key: (None if isinstance(value, float) and not math.isfinite(value) else value)
            for key, value in record.items()
        }
        self.file.write(json.dumps(clean) + "\n")
        if self.wandb_writer is not None:
            if on_schedule(record["step"], self.wandb_every):
                self._chart(record)
            else:
                self.uncharted = record

    def _chart(self, record: dict[str, Any]) -> None:
        self.uncharted = None
        self._forget_done_calls()
        self.wandb_calls.append(self.wandb_writer.submit(self.wandb_run.log, wandb_payload(record)))

    def _forget_done_calls(self) -> None:
        """Drops the finished `run.log` calls, keeping the first one that raised (`close` re-raises it)."""
        failed = [call for call in self.wandb_calls if call.done() and call.exception() is not None]
        self.wandb_calls = [call for call in self.wandb_calls if not call.done()]
        if failed and self.wandb_error is None:
            self.wandb_error = failed[0].exception()

    def close(self) -> None:
        if self.held:
            self.write_held()
        self.file.close()
        write_arrow_copy(self.path)  # the analysis reads this instead of parsing the JSON again
        if self.wandb_run is not None:
            if self.uncharted is not None:  # the job's last step is always charted
                self._chart(self.uncharted)
            run, self.wandb_run = self.wandb_run, None
            try:
                self.wandb_writer.shutdown(wait=True)  # every record logged, in order
                self._forget_done_calls()
                if self.wandb_error is not None:
                    raise self.wandb_error
            finally:
                run.finish()


def on_schedule(step: int, every: int, last: int | None = None) -> bool:
    """Step 1, every `every`-th step and `last`: the steps that print a progress line, or that W&B charts."""
    return step == 1 or step % every == 0 or step == last


def progress_line(record: dict[str, Any], steps: int) -> str:
    return (
        f"step {record['step']:>{len(str(steps))}}/{steps} | loss {record['loss']:.4f} | "
        f"grad_norm {record['grad_norm']:.3g} | {record['tokens_per_s'] / 1e3:.1f}k tok/s"
    )
