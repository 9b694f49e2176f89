"""B8's rank program: join the world as the runner's worker does, barrier, leave, and write when each happened.

`python -m bench.launcher_rank OUT_DIR [--spawned-at T]` (the second part is what `runner.sweep.spawn.run_world`
adds; it is ignored). The rank reads its place with `runner.world.env.rank_env` and joins with
`init_world`, as `runner.world.worker` does: a FileStore when `run_world` spawned it, `env://` (the elastic
agent's TCPStore) when torch's elastic agent did. Rank r writes OUT_DIR/phases/rank<r>.json: epoch
seconds at its first line, after importing torch.distributed, after joining and after leaving, then
ends with `os._exit` as the worker does.
"""

import time

STARTED = time.time()  # before the heavy imports

import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import torch.distributed  # noqa: E402, F401

IMPORTED = time.time()

from runner.world.env import init_world, leave_world, rank_env  # noqa: E402

env = rank_env()
init_world(env, "cpu")
joined = time.time()
leave_world()
record = {"launcher": env.launcher, "started": STARTED, "imported": IMPORTED, "joined": joined, "left": time.time()}
phases = Path(sys.argv[1]) / "phases"
phases.mkdir(parents=True, exist_ok=True)
(phases / f"rank{env.rank}.json").write_text(json.dumps(record))
sys.stdout.flush()
os._exit(0)
