"""Jobs started by other engines: a SLURM step's tasks, Hydra's submitit and joblib launchers.

Real processes, CPU and gloo; no SLURM installation is needed: two processes
get the environment that `srun` gives the tasks of a two-task step on one node.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from runner.world.env import first_host, rank_env

STEPS = 3
QUICK = [f"train.steps={STEPS}", "wandb.mode=disabled", "metrics.sketch_dim=0"]


def summary(job: Path) -> dict:
    return json.loads((job / "summary.json").read_text())


def slurm_task_environ(rank: int, tasks: int, job_id: int) -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE", "MASTER_"))}
    environ.update(
        SLURM_JOB_ID=str(job_id),
        SLURM_PROCID=str(rank),
        SLURM_LOCALID=str(rank),
        SLURM_NTASKS=str(tasks),
        SLURM_JOB_NUM_NODES="1",
        SLURM_JOB_NODELIST="localhost",
    )
    return environ


def test_slurm_variables_give_the_rank_and_a_tcp_rendezvous_at_the_first_node():
    env = rank_env(
        {
            "SLURM_PROCID": "5",
            "SLURM_LOCALID": "1",
            "SLURM_NTASKS": "8",
            "SLURM_JOB_NUM_NODES": "2",
            "SLURM_JOB_NODELIST": "gpu[07-08]",
            "SLURM_JOB_ID": "4242",
        }
    )
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (5, 8, 1, 4)
    assert env.init_method == "tcp://gpu07:24242" and env.launcher == "slurm"
    assert first_host("cpu[3,5-6],gpu1") == "cpu3" and first_host("login2") == "login2"
    # One task is not a world (the runner spawns the ranks on that node); torchrun's variables come first.
    assert rank_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_JOB_NODELIST": "n1"}) is None
    assert rank_env({"RANK": "0", "WORLD_SIZE": "2", "SLURM_PROCID": "1", "SLURM_NTASKS": "2"}).launcher == "torchrun"


def test_two_slurm_tasks_on_localhost_form_one_world_and_train(tmp_path):
    job_id = random.randrange(10_000, 99_999)  # the port derives from it
    command = [sys.executable, "-m", "runner", "world_size=2", *QUICK, "hydra.run.dir=run"]
    tasks = [
        subprocess.Popen(
            command,
            cwd=tmp_path,
            env=slurm_task_environ(rank, 2, job_id),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(2)
    ]
    outputs = [task.communicate(timeout=300)[0] for task in tasks]
    assert [task.returncode for task in tasks] == [0, 0], "\n".join(outputs)
    info = summary(tmp_path / "run")
    assert info["status"] == "completed" and info["steps_done"] == STEPS, info
    assert info["launcher"] == "slurm" and info["world_size"] == 2
    assert not (tmp_path / "run" / "logs").exists()  # nothing was spawned: the tasks are the ranks
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == STEPS


@pytest.mark.parametrize("launcher", ["submitit_local", "joblib"])
def test_a_sweep_through_another_hydra_launcher_completes(tmp_path, launcher):
    sweep = tmp_path / "sweep"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "runner",
            "-m",
            f"hydra/launcher={launcher}",
            "reduction=sum,local",
            "world_size=2",
            *QUICK,
            f"hydra.sweep.dir={sweep}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    jobs = sorted(p for p in sweep.iterdir() if (p / "summary.json").exists())
    assert sorted(summary(job)["reduction"] for job in jobs) == ["local", "sum"]
    assert all(summary(job)["status"] == "completed" and summary(job)["steps_done"] == STEPS for job in jobs)


@pytest.mark.parametrize("world_size, nodes, tasks_per_node", [(16, 2, 8), (4, 1, 4), (12, 2, 8)])
def test_slurm_preset_maps_world_size_to_nodes_and_tasks(world_size, nodes, tasks_per_node):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from runner.config import register_configs

    register_configs()
    with initialize_config_dir(str(Path(__file__).parents[1] / "conf"), version_base="1.3"):
        cfg = compose("config", [f"world_size={world_size}", "hydra/launcher=slurm"], return_hydra_config=True)
    launcher = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
    assert (launcher["nodes"], launcher["tasks_per_node"], launcher["gpus_per_node"]) == (nodes, tasks_per_node, 8)
    assert launcher["_target_"].endswith("SlurmLauncher") and launcher["max_num_timeout"] == 0


def test_a_slurm_sweep_of_mixed_world_sizes_is_refused_before_submission(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "runner",
            "-m",
            "hydra/launcher=slurm",
            "hydra.launcher.gpus_per_node=2",
            "world_size=2,4",
            *QUICK,
            f"hydra.sweep.dir={tmp_path / 'sweep'}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert (
        "#1 world_size=4 but hydra.launcher gives each job nodes x tasks_per_node = 1 x 2 = 2 tasks"
        in done.stdout + done.stderr
    )
    assert not (tmp_path / "sweep" / ".submitit").exists()  # nothing was submitted
