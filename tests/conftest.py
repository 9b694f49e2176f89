"""GPU-marked tests run only where CUDA is (bench/gpu_smoke.sh runs them); the CPU suite skips them. A test in a
module that starts processes (worlds of ranks, `python -m runner` launches, subprocesses) is marked `launches`,
which `make test-fast` leaves out with the `slow` ones: the in-process tier, for a contributor's inner loop."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

STARTS_PROCESSES = re.compile(r"\b(run_in_world|run_module|subprocess|multiprocessing|Popen)\b")


@cache
def _starts_processes(path: Path) -> bool:
    return bool(STARTS_PROCESSES.search(path.read_text()))


def pytest_collection_modifyitems(config, items):
    import torch

    for item in items:
        if _starts_processes(Path(item.fspath)):
            item.add_marker(pytest.mark.launches)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
