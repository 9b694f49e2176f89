"""`make run ARGS=...` gives its interleaved cost job only the overrides that job accepts, and says what it left out.

Generated from the schema: every key set to another value (valid or not, as a quick try may set it) is given
as ARGS. What the cost job is given must compose into a cost job that is admitted (so `make run` never ends
without a report because the cost job was refused), and every override left out must be one the cost job
refuses (so nothing it could run with is dropped). `train.steps=5` (no step after the warm-up),
`autograd_all_reduce=identity`, `trainer=xtuner` and `reduction=custom ...` were passed as they were, and the
cost job refused them.
"""

from __future__ import annotations

import pytest
from helpers import run_module
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from schema_values import another_value, leaves

from runner.config import RunConfig, register_configs
from runner.ranges import value_at
from runner.sweep.admission import Admitted, admit
from runner.sweep.cost_overrides import cost_job_overrides
from runner.sweep.overrides import CONF

pytestmark = pytest.mark.slow
MACHINE = {"cuda_devices": 0, "cpu_cores": 2}


def as_override(key: str, value) -> str:
    if isinstance(value, list):
        return f"{key}=[{','.join(map(str, value))}]"
    if isinstance(value, dict):
        return ""  # a dict is given key by key
    shown = value.value if hasattr(value, "value") else value
    return f"{key}={str(shown).lower() if isinstance(shown, bool) else shown}"


def quick_tries() -> list[list[str]]:
    defaults = OmegaConf.structured(RunConfig)
    tries = [[as_override(key, another_value(kind, value_at(defaults, key)))] for key, kind in leaves().items()]
    tries = [t for t in tries if t[0]]
    tries += [["train.steps=5"], ["autograd_all_reduce=identity"], ["trainer=xtuner"]]
    tries += [["reduction=custom", "custom.fn=runner.trainers.torchtitan:loss", "train.steps=20"]]
    tries += [["model=small", "train.steps=200", "optim.lr=1e-3"]]
    return tries


def test_the_cost_job_gets_what_it_accepts_and_leaves_out_only_what_it_refuses():
    register_configs()
    tries = quick_tries()
    assert len(tries) >= 60
    left_out_somewhere = 0
    for args in tries:
        accepted, left_out = cost_job_overrides(args)
        assert set(accepted) | {arg for arg, _ in left_out} == set(args), args
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            verdict = admit(compose("config", ["experiment=cost", *accepted]), machine=MACHINE)
            assert isinstance(verdict, Admitted), (args, accepted, verdict.problems)
            for arg, why in left_out:
                alone = admit(compose("config", ["experiment=cost", arg]), machine=MACHINE)
                assert not isinstance(alone, Admitted), (arg, why)
                assert why, arg
        left_out_somewhere += bool(left_out)
    assert left_out_somewhere >= 10


def test_make_run_says_what_the_cost_job_left_out(tmp_path):
    done = run_module(
        "runner.sweep.cost_overrides", ["train.steps=5", "optim.lr=1e-3", "reduction=sum,local"], tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["optim.lr=1e-3"]
    assert "the cost job leaves out train.steps=5 (cost.warmup_steps=5 must be < train.steps=5)" in done.stderr
