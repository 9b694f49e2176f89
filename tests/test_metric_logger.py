"""MetricLogger: JSONL lines at once, W&B calls in order off the caller's thread, held records never lost."""

from __future__ import annotations

import json
import threading

import pytest

from runner.record.metrics import MetricLogger


class RecordingRun:
    """Stands in for a wandb Run: records what it is given, and on which thread."""

    def __init__(self, fail_at_step: int | None = None):
        self.logged, self.threads, self.finished_after = [], set(), None
        self.fail_at_step = fail_at_step

    def log(self, payload):
        if payload["step"] == self.fail_at_step:
            raise RuntimeError(f"W&B refused step {payload['step']}")
        self.logged.append(payload["step"])
        self.threads.add(threading.current_thread().name)

    def finish(self):
        self.finished_after = list(self.logged)


def lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_wandb_gets_every_record_in_order_on_its_writer_thread_before_finish(tmp_path):
    run = RecordingRun()
    logger = MetricLogger(tmp_path / "metrics.jsonl", run)
    for step in range(1, 201):
        logger.log({"step": step, "loss": 1.0 / step})
    assert [r["step"] for r in lines(tmp_path / "metrics.jsonl")] == list(range(1, 201))  # written at once
    logger.close()
    assert run.logged == list(range(1, 201)) and run.finished_after == run.logged
    assert run.threads and threading.current_thread().name not in run.threads


@pytest.mark.parametrize("last_step, held", [(25, False), (23, True)])
def test_wandb_charts_every_nth_step_and_the_last_while_the_file_holds_every_step(tmp_path, last_step, held):
    run = RecordingRun()
    logger = MetricLogger(tmp_path / "metrics.jsonl", run, wandb_every=10)
    for step in range(1, last_step + 1):
        (logger.hold if held and step > 20 else logger.log)({"step": step, "loss": 1.0 / step})
    logger.close()  # a failed job's held steps are written here, its last one charted
    assert [r["step"] for r in lines(tmp_path / "metrics.jsonl")] == list(range(1, last_step + 1))
    assert run.logged == [1, 10, 20, last_step] and run.finished_after == run.logged


def test_a_failed_wandb_call_is_raised_and_the_run_still_finishes(tmp_path):
    run = RecordingRun(fail_at_step=3)
    logger = MetricLogger(tmp_path / "metrics.jsonl", run)
    for step in range(1, 6):
        logger.log({"step": step, "loss": 0.5})
    with pytest.raises(RuntimeError, match="W&B refused step 3"):
        logger.close()
    assert run.finished_after == [1, 2, 4, 5]
    assert len(lines(tmp_path / "metrics.jsonl")) == 5  # the file has every step regardless


def test_held_records_are_written_at_close_as_they_are(tmp_path):
    logger = MetricLogger(tmp_path / "metrics.jsonl", None)
    logger.log({"step": 1, "step_time_s": 0.1})
    for step in (2, 3):
        logger.hold({"step": step, "step_time_s": None})  # a failed job's last steps, world figures never gathered
    logger.close()
    assert lines(tmp_path / "metrics.jsonl") == [
        {"step": 1, "step_time_s": 0.1},
        {"step": 2, "step_time_s": None},
        {"step": 3, "step_time_s": None},
    ]
