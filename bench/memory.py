"""B6: peak resident memory per rank (summary.json's `peak_rss_mib`) for the tiny and small models, W=2."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path


def run(quick: bool) -> tuple[str, str, str]:
    steps = 2 if quick else 10
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in ("tiny", "small"):
            job = Path(tmp) / model
            command = [sys.executable, "-m", "runner", f"model={model}", f"train.steps={steps}", "wandb.mode=disabled",
                       f"hydra.run.dir={job}"]  # fmt: skip
            subprocess.run(command, check=True, capture_output=True, cwd=tmp)
            summary = json.loads((job / "summary.json").read_text())
            peaks = summary["peak_rss_mib"]
            rows.append(f"| {model} | {' / '.join(f'{p:.0f}' for p in peaks)} | {max(peaks):.0f} |")
    body = f"""
`python -m runner model=<m> train.steps={steps}` (W=2, grad_accum 2, seq 128, global batch 16, AdamW, W&B off,
collective counter and gradient sketch on); peak resident set size of each rank process (getrusage).

| model | peak RSS per rank (MiB, rank 0 / rank 1) | max |
|---|---|---|
{chr(10).join(rows)}
"""
    return "B6", "Peak resident memory per rank", "python -m bench b6" + (" --quick" if quick else ""), body
