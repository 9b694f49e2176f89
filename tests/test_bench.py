"""`python -m bench --quick` keeps working: every benchmark runs at toy size and writes its section (no timing asserted)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_quick_bench_writes_every_section_but_b5(tmp_path):
    out = tmp_path / "RESULTS.md"
    # B5 runs `make run` in the repository itself; the others named are self-contained.
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "b1",
            "b2",
            "b3",
            "b4",
            "b6",
            "b7",
            "b8",
            "b9",
            "b10",
            "b12",
            "--quick",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    text = out.read_text()
    assert re.findall(r"(?m)^## (B\d+)\. ", text) == ["B1", "B2", "B3", "B4", "B6", "B7", "B8", "B9", "B10", "B12"]
    assert text.count("Command: `python -m bench b") == 10
    assert "Harness overhead:" in text and "Fixed cost:" in text and "| small |" in text
    assert "Elastic launcher's extra cost per job:" in text
    assert "Null control holds in" in text and "Verdict classes per mode" in text
    assert "| DP(2)-PP(2) |" in text and "| DP(2)-TP(2) |" in text
    assert "| own_group |" in text and "| local_again |" in text
