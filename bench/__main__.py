"""`python -m bench [step_time|analysis]`: the benchmarks (both when none is named).

- step_time: step time of each reduction mode and the collective counter's cost (bench/results.md)
- analysis: the analysis of 1,000 runs x 1,000 steps (bench/analysis_results.md)
"""

from __future__ import annotations

import argparse

from bench import analysis_scale, step_time

BENCHES = {"step_time": step_time, "analysis": analysis_scale}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="bench")
    for name, module in BENCHES.items():
        module.add_arguments(commands.add_parser(name, help=module.__doc__.splitlines()[0]))
    args = parser.parse_args(argv)
    if args.bench:
        BENCHES[args.bench].run(args)
        return
    for name, module in BENCHES.items():
        sub = argparse.ArgumentParser()
        module.add_arguments(sub)
        module.run(sub.parse_args([]))


if __name__ == "__main__":
    main()
