"""bench/RESULTS.md: one section per benchmark (B1..B10), each with its machine, date and command.

Running some benchmarks replaces their sections and keeps the others, so the
file always holds the latest figure of each and how it was made.
"""

from __future__ import annotations

import os
import platform
import re
from datetime import datetime, timezone
from pathlib import Path

RESULTS = Path(__file__).parent / "RESULTS.md"
HEADER = """# Benchmark results

`make bench` (or `python -m bench [b1 .. b11]`) writes this file, one section per
benchmark. Every figure is a ratio or a time measured within one invocation;
absolute times depend on the machine and its load, so each section names both.
"""


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        memory_kib = int(re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text()).group(1))
        memory = f", {memory_kib / 2**20:.0f} GiB"
    except (OSError, AttributeError):
        memory = ""
    import torch

    return f"{os.cpu_count()} cores ({cpu}){memory}, Python {platform.python_version()}, torch {torch.__version__}"


def section(key: str, title: str, command: str, body: str) -> str:
    stamp = f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC"
    return f"## {key}. {title}\n\nCommand: `{command}`; {stamp}; {machine()}.\n\n{body.strip()}\n"


def write(sections: dict[str, str], path: Path = RESULTS) -> Path:
    """Replace the sections named in `sections` (by key, e.g. "B1"), keep the rest, in key order."""
    kept: dict[str, str] = {}
    if path.exists():
        for block in re.split(r"(?m)^(?=## B\d+\. )", path.read_text()):
            match = re.match(r"## (B\d+)\. ", block)
            if match:
                kept[match.group(1)] = block.strip() + "\n"
    kept.update(sections)
    path.write_text(HEADER + "\n" + "\n".join(kept[key] for key in sorted(kept, key=lambda key: int(key[1:]))))
    return path
