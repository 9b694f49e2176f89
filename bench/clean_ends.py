"""B7: 30 consecutive two-rank jobs end cleanly: every one completed, no rank aborted or warned at exit.

One sweep of 30 short jobs (seed=0..29, 3 steps each). A clean end is a
summary with status completed and exit code 0 on both ranks, and no line in
any rank's log after training that shows a teardown fault (an abort, a
terminate, a gloo connection error, or a process-group warning at exit).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

JOBS = 30
TEARDOWN_FAULTS = re.compile(
    r"terminate called|Aborted|core dumped|Connection (closed|reset)|destroy_process_group|ProcessGroup.*(leak|not destroyed)",
    re.I,
)


def run(quick: bool) -> tuple[str, str, str, str]:
    jobs = 3 if quick else JOBS
    with tempfile.TemporaryDirectory() as folder:
        sweep = Path(folder) / "sweep"
        started = time.perf_counter()
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "runner",
                "-m",
                "reduction=sum",
                f"seed=range(0,{jobs})",
                "world_size=2",
                "train.steps=3",
                "wandb.mode=disabled",
                "metrics.sketch_dim=0",
                f"hydra.sweep.dir={sweep}",
            ],
            capture_output=True,
            text=True,
        )
        wall = time.perf_counter() - started
        summaries = [json.loads(p.read_text()) for p in sorted(sweep.glob("*/summary.json"))]
        completed = sum(s["status"] == "completed" and s.get("returncodes") == [0, 0] for s in summaries)
        faults = [
            f"{log.parent.parent.name}/{log.name}: {line.strip()}"
            for log in sorted(sweep.glob("*/logs/rank*.log"))
            for line in log.read_text(errors="replace").splitlines()
            if TEARDOWN_FAULTS.search(line)
        ]
    verdict = "met" if completed == jobs and not faults and done.returncode == 0 else "NOT met"
    listing = "\n".join(f"- `{fault}`" for fault in faults[:10]) or "none"
    body = f"""
`python -m runner -m reduction=sum seed=range(0,{jobs}) world_size=2 train.steps=3 wandb.mode=disabled`:
{jobs} consecutive jobs, {wall:.0f} s in all (sweep exit status {done.returncode}).

**{completed} of {jobs} jobs completed with exit code 0 on both ranks; teardown faults in the rank logs: {len(faults)}
(goal: {jobs} of {jobs} and none: {verdict}).**

Teardown faults found: {listing}
"""
    return (
        "B7",
        f"{jobs} consecutive two-rank jobs end cleanly",
        "python -m bench b7" + (" --quick" if quick else ""),
        body,
    )
