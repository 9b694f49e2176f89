"""`python -m bench [b1 .. b11] [--quick]`: the benchmarks, into bench/RESULTS.md (all when none is named).

- b1 harness: the runner's step vs a bare FSDP2 loop, interleaved (goal <= 1.05x)
- b2 fixed_cost: a job's fixed cost vs a trivial torchrun job of the same W (goal <= 1.5x)
- b3 overhead: sum vs local at W=2, grad_accum 1 and 4, interleaved, against the floor
- b4 analysis_scale: the analysis of 1,000 runs x 1,000 steps (goal < 5 s), and of 100 runs
- b5 make_run: a fresh clone's first `make run`, setup included (goal <= 150 s)
- b6 memory: peak resident memory per rank, tiny and small models
- b7 clean_ends: 30 consecutive two-rank jobs end with no failure at exit
- b8 launcher: torch's elastic launcher vs the runner's, paired, as a share of the fixed cost (limit 20%)
- b9 cost_reruns: five reruns of the default cost job: the null control 5/5, sum's verdict class the same >= 4/5
- b10 detached_parts: what detached's extra time is made of (its synchronisation point, its process group)
- b11 checkpoint_cost: a checkpoint's save and load time and size against a step's, tiny and hf_llama
- b12 layouts: a step at DP(2)-TP(2) and DP(2)-PP(2) against DP(4), interleaved, with a null control

--quick runs each at a small size (a smoke test: the figures mean nothing) and
writes to --out (default: a temporary file, so RESULTS.md keeps real figures).
"""

from __future__ import annotations

import argparse
import importlib
import tempfile
from pathlib import Path

from bench import report

BENCHES = {
    "b1": "harness",
    "b2": "fixed_cost",
    "b3": "overhead",
    "b4": "analysis_scale",
    "b5": "make_run",
    "b6": "memory",
    "b7": "clean_ends",
    "b8": "launcher",
    "b9": "cost_reruns",
    "b10": "detached_parts",
    "b11": "checkpoint_cost",
    "b12": "layouts",
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("benches", nargs="*", choices=[*BENCHES, []], help="which (default: all)")
    parser.add_argument("--quick", action="store_true", help="small sizes, a smoke test")
    parser.add_argument(
        "--out", type=Path, help="results file (default: bench/RESULTS.md; with --quick a temporary file)"
    )
    args = parser.parse_args(argv)
    out = args.out or (Path(tempfile.mkdtemp()) / "RESULTS.md" if args.quick else report.RESULTS)
    for key in args.benches or list(BENCHES):
        module = importlib.import_module(f"bench.{BENCHES[key]}")
        name, title, command, body = module.run(args.quick)
        text = report.section(name, title, command, body)
        print(text, flush=True)
        report.write({name: text}, out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
