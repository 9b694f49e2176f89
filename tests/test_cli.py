"""The paths a user takes off `make run`, as real `python -m runner` / `python -m analysis` processes.

Bad input refused with the field named and no traceback; a single run, a job
folder and a cost job analysed on their own; reruns that never overwrite a
finished job of another config; a tally of this invocation only; the help.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from helpers import cli_verdict, run_module

from runner.modes import MODES

CONF = Path(__file__).resolve().parents[1] / "conf"
QUICK = ["train.steps=2", "wandb.mode=disabled", "metrics.count_comm=false"]


def output(done: subprocess.CompletedProcess) -> str:
    return done.stdout + done.stderr


@pytest.mark.parametrize(
    "args, field, says",
    [
        (["metrics.sketch_dim=100000000"], "metrics.sketch_dim", "<= 1_024"),
        (["optim.weight_decay=-1"], "optim.weight_decay", ">= 0"),
        (["optim.beta1=1.5"], "optim.beta1", "< 1"),
        (["optim=sgd", "optim.momentum=-1"], "optim.momentum", ">= 0"),
        (["optim.eps=0"], "optim.eps", "> 0"),
        (["reductions=sum"], "reductions", "did you mean reduction"),
    ],
)
def test_bad_input_is_refused_before_any_rank_with_the_field_named(args, field, says):
    """The examples of a newcomer's first hour (tests/test_refusals.py holds one of each kind), through the CLI's
    steps before any rank in-process (`cli_verdict`; tests/test_refusals.py launches each way it refuses)."""
    verdict = cli_verdict([*args, *QUICK])
    assert verdict.code == 2, verdict.message
    assert field in verdict.message and says in verdict.message, verdict.message
    assert "Traceback" not in verdict.message


def test_home_paths_expand_and_binary_text_is_refused_with_its_offset(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "corpus.txt").write_text("\n\n".join(f"Paragraph {i} of a small corpus of text." for i in range(40)))
    (home / "binary.txt").write_bytes(b"a text start, then \xff\xfe binary")
    env = {**os.environ, "HOME": str(home)}
    done = run_module("runner", ["data.path=~/corpus.txt", *QUICK, "hydra.run.dir=run"], tmp_path, env)
    assert done.returncode == 0, output(done)
    config = (tmp_path / "run" / "config.yaml").read_text()
    assert "name: text" in config and "path: ~/corpus.txt" in config  # data.path alone: the text is the user's
    refused = run_module("runner", ["data.path=~/binary.txt", *QUICK, "hydra.run.dir=bin"], tmp_path, env)
    assert refused.returncode == 2 and "is not UTF-8 text (byte 19" in output(refused), output(refused)
    assert "Traceback" not in output(refused)


def test_a_single_run_a_job_folder_and_a_cost_job_are_analysed_on_their_own(tmp_path):
    single = run_module("runner", [*QUICK, "hydra.run.dir=outputs/one"], tmp_path)
    assert single.returncode == 0, output(single)
    newest = run_module("analysis", ["--no-plots", "--wandb", "disabled"], tmp_path)  # the newest result: outputs/one
    assert newest.returncode == 0, output(newest)
    assert "reference" in newest.stdout and (tmp_path / "outputs/one/analysis/report.md").exists()
    assert "plots" not in newest.stdout.splitlines()[-1]  # --no-plots: it says what it wrote
    assert "## Plots" not in (tmp_path / "outputs/one/analysis/report.md").read_text()

    sweep = run_module("runner", ["-m", "reduction=sum,local", *QUICK, "hydra.sweep.dir=s"], tmp_path)
    assert sweep.returncode == 0, output(sweep)
    job = next((tmp_path / "s").glob("1_*"))
    inside = run_module("analysis", [str(job), "--no-plots", "--wandb", "disabled"], tmp_path)
    assert inside.returncode == 0 and "unfinished" not in inside.stdout, output(inside)

    cost_args = ["experiment=cost", "train.steps=12", "cost.floor_calls=20", "cost.modes=[sum,local,fsdp_sum]"]
    cost = run_module("runner", [*cost_args, "wandb.mode=disabled", "hydra.run.dir=outputs/cost"], tmp_path)
    assert cost.returncode == 0, output(cost)
    alone = run_module("analysis", ["outputs/cost", "--wandb", "disabled"], tmp_path)
    assert alone.returncode == 0, output(alone)
    written = {p.name for p in (tmp_path / "outputs/cost/analysis").iterdir()}
    assert {"report.md", "cost.csv", "floor.csv", "interleaved_cost.png"} <= written and "verdicts.csv" not in written
    both = run_module("analysis", ["s", "outputs/cost", "--no-plots", "--wandb", "disabled"], tmp_path)
    assert both.returncode == 0, output(both)
    report = (tmp_path / "s/analysis-combined/report.md").read_text()
    assert "## Cost, measured interleaved" in report and "| fsdp_sum" in report

    for given, says in (("README.md", "is a file"), ("nowhere", "does not exist")):
        (tmp_path / "README.md").write_text("not a sweep")
        refused = run_module("analysis", [given], tmp_path)
        assert refused.returncode == 2 and says in refused.stderr and "sweep directory" in refused.stderr


def test_a_rerun_with_another_config_keeps_the_earlier_run_and_the_tally_counts_this_invocation(tmp_path):
    corpus = tmp_path / "a.txt"
    corpus.write_text("\n\n".join(f"Paragraph {i} of the first corpus." for i in range(40)))
    fixed = ["hydra.sweep.subdir=${hydra.job.num}"]  # a job folder named by its number alone, as a custom subdir may
    first = run_module(
        "runner", ["-m", "reduction=sum,local", f"data.path={corpus}", *QUICK, "hydra.sweep.dir=s", *fixed], tmp_path
    )
    assert first.returncode == 0, output(first)
    earlier_metrics = (tmp_path / "s/0/metrics.jsonl").read_bytes()
    other = tmp_path / "b.txt"
    other.write_text("\n\n".join(f"Paragraph {i} of another corpus entirely." for i in range(40)))
    again = run_module(
        "runner", ["-m", "reduction=sum,local", f"data.path={other}", *QUICK, "hydra.sweep.dir=s", *fixed], tmp_path
    )
    assert again.returncode == 0, output(again)
    assert "held an earlier run of another identity (data.path:" in output(again)
    kept = list((tmp_path / "s/superseded").glob("0-*"))
    assert len(kept) == 1 and (kept[0] / "metrics.jsonl").read_bytes() == earlier_metrics
    assert "sweep: completed 2, failed 0, diverged 0, invalid 0, skipped 0" in output(again)
    same = run_module(
        "runner", ["-m", "reduction=sum,local", f"data.path={other}", *QUICK, "hydra.sweep.dir=s", *fixed], tmp_path
    )
    assert "sweep: completed 0, failed 0, diverged 0, invalid 0, skipped 2" in output(same), output(same)
    assert json.loads((tmp_path / "s/0/summary.json").read_text())["status"] == "completed"


def test_job_names_tell_every_swept_key_apart(tmp_path):
    for name in ("a.txt", "b.txt"):
        (tmp_path / name).write_text("\n\n".join(f"Paragraph {i} of {name}." for i in range(40)))
    paths = f"data.path={tmp_path / 'a.txt'},{tmp_path / 'b.txt'}"
    done = run_module("runner", ["-m", paths, "reduction=sum", *QUICK, "hydra.sweep.dir=s"], tmp_path)
    assert done.returncode == 0, output(done)
    names = sorted(p.name for p in (tmp_path / "s").iterdir() if p.is_dir())
    assert len(names) == 2 and "a.txt" in names[0] and "b.txt" in names[1] and "/" not in "".join(names)


def test_help_lists_the_modes_axes_experiments_and_examples(tmp_path):
    done = run_module("runner", ["--help"], tmp_path)
    assert done.returncode == 0
    for word in [
        *MODES,
        *(p.stem for p in (CONF / "experiment").glob("*.yaml")),
        "world_size",
        "grad_accum",
        "tp (tensor parallelism",
        "loss_parallel",
        "pp (pipeline stages",
        "Examples",
    ]:
        assert word in done.stdout, word
    # every preset of the groups the help lists by name: `name[_suffix]` names name and name_suffix
    named = set()
    for base, suffix in re.findall(r"([A-Za-z]\w*)(?:\[(_\w+)\])?", done.stdout):
        named |= {base, base + suffix} if suffix else {base}
    for group in ("trainer", "bug", "layout", "model", "bug_arm"):
        missing = sorted({p.stem for p in (CONF / group).glob("*.yaml")} - named)
        assert not missing, f"--help does not name {group}={missing}"


def test_analysis_replaces_its_wandb_run_when_run_again(tmp_path):
    assert run_module("runner", ["train.steps=2", "hydra.run.dir=r"], tmp_path).returncode == 0  # W&B offline
    for _ in range(2):
        done = run_module("analysis", ["r", "--no-plots"], tmp_path)
        assert done.returncode == 0, output(done)
    assert len(list((tmp_path / "r/analysis/wandb").glob("offline-run-*"))) == 1
