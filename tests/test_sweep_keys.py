"""A sweep's keys as `python -m runner -m` meets them: trainers without experiment=trainers, and the keys of one
mode swept across others (tests/test_ignored_keys.py holds every key to what the ranks read).

- `-m trainer=xtuner,torchtitan` (Hydra's own hint "add --multirun" leads there) under the default
  experiment's sweep of `reduction` ran the six built-in modes twice in folders named after trainers: it is
  refused before anything starts, with the command that runs those trainers' rules, whose jobs are admitted.
- `-m reduction=sum,local autograd_all_reduce=identity` runs both (local without the all-reduce, said once,
  recorded in its summary.json); `-m reduction=local,detached autograd_all_reduce=identity` reads it nowhere
  and is refused; a single `reduction=local autograd_all_reduce=identity` is refused.
"""

from __future__ import annotations

import json

from helpers import cli_verdict, run_module
from hydra import compose, initialize_config_dir

from runner.config import register_configs
from runner.sweep.admission import Admitted, admit
from runner.sweep.overrides import CONF

QUICK = ["train.steps=2", "wandb.mode=disabled", "metrics.count_comm=false"]


def test_trainers_swept_without_their_experiment_are_refused_with_the_command_that_runs_them(tmp_path):
    done = run_module("runner", ["-m", "trainer=xtuner,torchtitan", *QUICK, "hydra.sweep.dir=s"], tmp_path)
    out = done.stdout + done.stderr
    assert done.returncode == 2 and "no job of this sweep is valid, nothing was started" in out, out
    assert "trainer=xtuner sets reduction=custom, but this job has reduction=sum" in out
    command = "python -m runner -m experiment=trainers trainer=torchtitan,xtuner"
    assert command in out and not list((tmp_path / "s").glob("*/logs"))

    register_configs()  # the command it gives: every job of that sweep is admitted
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        for trainer in ("torchtitan", "xtuner"):
            job = compose("config", ["experiment=trainers", f"trainer={trainer}", *QUICK], return_hydra_config=True)
            assert job.hydra.runtime.choices.get("trainer") == trainer
            assert isinstance(admit(job, machine=None, sweeping=True, trainer=trainer), Admitted), trainer


def test_an_all_reduce_swept_across_modes_runs_where_read_and_is_said_once_where_not(tmp_path):
    numbered = ["hydra.sweep.subdir=${hydra.job.num}", "hydra.sweep.dir=s"]
    both = run_module(
        "runner", ["-m", "reduction=sum,local", "autograd_all_reduce=identity", *QUICK, *numbered], tmp_path
    )
    out = both.stdout + both.stderr
    assert both.returncode == 0, out
    assert out.count("autograd_all_reduce=identity is ignored by reduction=local") == 1, out
    assert "sweep: completed 2, failed 0, diverged 0, invalid 0, skipped 0" in out
    local = json.loads((tmp_path / "s/1/summary.json").read_text())
    assert local["reduction"] == "local" and "autograd_all_reduce" in local["ignored"]
    assert "ignored" not in json.loads((tmp_path / "s/0/summary.json").read_text())

    nowhere = run_module("runner", ["-m", "reduction=local,detached", "autograd_all_reduce=identity", *QUICK], tmp_path)
    assert nowhere.returncode == 2 and "no job of this sweep reads it" in nowhere.stdout + nowhere.stderr

    single = cli_verdict(["reduction=local", "autograd_all_reduce=identity", *QUICK])  # the CLI's steps, in-process
    said = single.message
    assert single.code == 2 and "autograd_all_reduce=identity is not read by this job" in said, said
