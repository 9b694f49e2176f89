"""Validation before any derived value: every field of the schema at invalid values, through the job itself.

Generated from the config dataclasses: each numeric field just outside each bound of its range (and nan for
floats), each path and string field at its invalid forms (empty, missing, the wrong kind of file). Each
value goes through `runner.sweep.job.run_job` as Hydra calls it in a sweep (Hydra's config of the job set up
in-process), into a fresh job folder and into one that holds an earlier completed run:

- the job is refused (`invalid`) with the field named, and nothing raises on the way (no name, layout or
  message is built from the config before it passed validation: `sp=0` once ended in a ZeroDivisionError);
- a refused rerun touches nothing: the earlier run's files are byte for byte as they were, nothing moved to
  `superseded/`, no rank started;
- enum and boolean fields at invalid values never reach a job: Hydra's composition refuses them.

The real sweep at the end checks the same through `python -m runner -m`: preflight lists the job as invalid,
and the job is refused, not run, with the tally counting it.
"""

from __future__ import annotations

import json
import math
from enum import Enum
from pathlib import Path

import pytest
from helpers import run_module
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from hydra.types import RunMode
from omegaconf import OmegaConf, open_dict, read_write
from omegaconf.errors import OmegaConfBaseException
from schema_values import leaves

from runner.config import RunConfig, register_configs
from runner.ranges import numeric_fields
from runner.sweep.job import run_job
from runner.sweep.overrides import schema_keys
from runner.sweep.rerun import JOB_FILES

CONF = Path(__file__).resolve().parents[1] / "conf"
BASE = ["train.steps=2", "wandb.mode=disabled"]


def outside(name: str, kind: type, valid) -> list:
    """Values just outside each bound of a field's range (nan for floats)."""
    step = 1 if kind is int else 0.5
    values = []
    if valid.ge is not None:
        values.append(valid.ge - step)
    if valid.gt is not None:
        values.append(valid.gt)
    if valid.le is not None:
        values.append(valid.le + step)
    if valid.lt is not None:
        values.append(valid.lt)
    return values + ([math.nan] if kind is float else [])


# The string fields' invalid forms: (field, value, the other overrides that make the field read, says).
# {data} is a folder with a directory that holds no tokenizer.json and no .txt file.
NAMED_BUG = ["known_bug.name=x", "known_bug.buggy.fn=a:b", "known_bug.fixed.fn=a:b"]
STRINGS = [
    ("data.path", "''", [], "data.path"),
    ("data.path", "{data}/missing.txt", [], "does not exist"),
    ("data.path", "{data}/empty_folder", [], "without .txt files"),
    ("data.name", "text", [], "needs data.path"),
    ("data.text_field", "body", ["data.path={data}/records.jsonl"], "no field 'body'"),
    ("data.tokenizer", "''", [], "data.tokenizer"),
    ("data.tokenizer", "{data}/missing.json", [], "does not exist"),
    ("data.tokenizer", "{data}/empty_folder", [], "data.tokenizer"),
    ("model.config", "''", ["model=hf"], "model.config"),
    ("model.config", "{data}/missing.json", ["model=hf"], "does not exist"),
    ("custom.fn", "''", ["reduction=custom"], "custom.fn"),
    ("custom.fn", "no_colon", ["reduction=custom"], "not MODULE:CALLABLE"),
    ("custom.fn", "no_such_module:loss", ["reduction=custom"], "no module named"),
    ("custom.expect", "sideways", ["reduction=custom", "custom.fn=builtins:pow"], "custom.expect=sideways"),
    ("custom.expect_layouts", "sideways", ["reduction=custom", "custom.fn=builtins:pow"], "custom.expect_layouts="),
    ("custom.weighs", "sideways", ["reduction=custom", "custom.fn=builtins:pow"], "custom.weighs=sideways"),
    ("known_bug.buggy.expect", "sideways", [], "known_bug.buggy.expect=sideways"),
    ("known_bug.fixed.expect", "0", [], "known_bug.fixed.expect=0"),
    ("known_bug.buggy.grad_norm", "sideways", [], "known_bug.buggy.grad_norm=sideways"),
    ("known_bug.fixed.grad_norm", "'sqrt(-2)'", [], "sqrt(k)"),
    ("known_bug.buggy.fn", "null", NAMED_BUG, "needs known_bug.buggy.fn"),
    ("known_bug.fixed.fn", "null", NAMED_BUG, "needs known_bug.fixed.fn"),
    (
        "known_bug.evidence",
        "null",
        [*NAMED_BUG, "known_bug.evidence_source=s"],
        "needs known_bug.evidence: one of release",
    ),
    (
        "known_bug.evidence_source",
        "null",
        [*NAMED_BUG, "known_bug.evidence=release"],
        "needs known_bug.evidence_source",
    ),
    ("fault.kind", "explode", [], "fault.kind=explode"),
    ("cost.modes", "[local,custom]", [], "cost.modes"),
    ("cost.modes", "[sum]", [], "must include local"),
]
# Strings any value of which is valid: names and labels.
FREE_TEXT = {"model.name", "wandb.project", "wandb.entity", "custom.rule", "custom.name"}
FREE_TEXT |= {"known_bug.name", "known_bug.reference", "known_bug.signature"}  # read by the analysis as given


NUMERIC = [(name, value) for name, kind, valid, _ in numeric_fields(RunConfig) for value in outside(name, kind, valid)]
CASES = [(name, str(value), [], name) for name, value in NUMERIC] + STRINGS
CLOSED = [
    (name, "not_a_value")
    for name, kind in leaves().items()
    if kind is bool or (isinstance(kind, type) and issubclass(kind, Enum))
]


def test_every_field_of_the_schema_is_tried():
    tried = {name for name, *_ in CASES} | {name for name, _ in CLOSED} | FREE_TEXT | {"model.overrides"}
    assert set(leaves()) - tried == set()
    assert {name for name, *_ in CASES} >= {name for name, _ in NUMERIC}
    keys, _ = schema_keys()
    assert set(leaves()) <= keys


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("data")
    (folder / "empty_folder").mkdir()
    (folder / "records.jsonl").write_text(json.dumps({"text": "a record of some text"}) + "\n")
    return folder


@pytest.fixture
def hydra_job(monkeypatch):
    """Hydra's config of a sweep's job #0, set as Hydra sets it before calling the job; restored after. A
    config that reaches its ranks fails the test (none of these may)."""
    register_configs()

    def no_ranks(*args, **kwargs):
        raise AssertionError("a config that should be refused reached its ranks")

    monkeypatch.setattr("runner.sweep.job.run_world", no_ranks)
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        yield
    HydraConfig.instance().cfg = None


def sweep_job(overrides: list[str], job_dir: Path):
    """The task config of a sweep's job with these overrides, Hydra's config pointing at `job_dir` (which
    Hydra creates before it calls the job)."""
    job_dir.mkdir(parents=True, exist_ok=True)
    cfg = compose("config", overrides, return_hydra_config=True)
    with read_write(cfg.hydra), open_dict(cfg.hydra):
        cfg.hydra.mode = RunMode.MULTIRUN
        cfg.hydra.job.num = 0
        cfg.hydra.sweep.dir = str(job_dir.parent)
        cfg.hydra.runtime.output_dir = str(job_dir)
    HydraConfig.instance().set_config(cfg)
    task = OmegaConf.masked_copy(cfg, [key for key in cfg if key != "hydra"])
    return task


def earlier_completed_run(job_dir: Path) -> dict[str, bytes]:
    """A folder holding a completed run's files; returns their bytes."""
    job_dir.mkdir(parents=True, exist_ok=True)
    (job_dir / "config.yaml").write_text("reduction: sum\nworld_size: 2\n")
    (job_dir / "summary.json").write_text(json.dumps({"status": "completed", "identity": {"digest": "earlier"}}))
    (job_dir / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 5.5}) + "\n")
    return files_of(job_dir)


def files_of(job_dir: Path) -> dict[str, bytes]:
    """The job's own files (Hydra's .hydra/ and its log, runner.log, are Hydra's: it rewrites them for every job)."""
    return {p.name: p.read_bytes() for p in job_dir.iterdir() if p.is_file() and p.name in JOB_FILES}


@pytest.mark.parametrize("name, value, extra, says", CASES, ids=[f"{n}={v}" for n, v, *_ in CASES])
def test_an_invalid_value_is_refused_by_the_job_before_anything_is_built_from_it(
    hydra_job, data_dir, tmp_path, name, value, extra, says
):
    overrides = [*BASE, *(e.format(data=data_dir) for e in extra), f"{name}={value.format(data=data_dir)}"]

    fresh = tmp_path / "sweep" / "0_fresh"
    assert run_job(sweep_job(overrides, fresh)) == {"status": "invalid"}
    summary = json.loads((fresh / "summary.json").read_text())
    assert summary["status"] == "invalid" and summary["outcome"] == "invalid"
    assert says in summary["error"] and not (fresh / "logs").exists(), summary["error"]

    rerun = tmp_path / "sweep" / "1_rerun"
    task = sweep_job(overrides, rerun)
    before = earlier_completed_run(rerun)
    assert run_job(task) == {"status": "invalid"}
    assert files_of(rerun) == before  # the earlier run, byte for byte
    assert not (tmp_path / "sweep" / "superseded").exists() and not (rerun / "logs").exists()


@pytest.mark.parametrize("name, value", CLOSED, ids=[f"{n}" for n, _ in CLOSED])
def test_an_enum_or_boolean_at_an_invalid_value_never_composes(hydra_job, name, value):
    with pytest.raises((HydraException, OmegaConfBaseException)):
        compose("config", [*BASE, f"{name}={value}"])


def test_a_sweep_refuses_the_job_preflight_lists_and_a_refused_rerun_keeps_the_earlier_run(tmp_path):
    numbered = ["reduction=sum", "hydra.sweep.dir=s", "hydra.sweep.subdir=${hydra.job.num}"]
    first = run_module("runner", ["-m", "sp=0,1", *BASE, *numbered], tmp_path)
    out = first.stdout + first.stderr
    assert first.returncode == 0, out
    assert "Traceback" not in out and "1 of 2 jobs are invalid" in out and "#0 reduction=sum sp=0" in out
    assert "sweep: completed 1, failed 0, diverged 0, invalid 1, skipped 0" in out
    assert json.loads((tmp_path / "s/0/summary.json").read_text())["problems"] == ["sp"]
    assert not (tmp_path / "s/0/logs").exists()

    kept = files_of(tmp_path / "s/1")  # sp=1: completed
    again = run_module("runner", ["-m", "sp=0,3", *BASE, *numbered], tmp_path)  # sp=3 does not divide 2
    out = again.stdout + again.stderr
    assert again.returncode == 2 and "no job of this sweep is valid" in out, out
    assert files_of(tmp_path / "s/1") == kept  # preflight stopped the sweep: nothing touched

    third = run_module("runner", ["-m", "sp=1,3", *BASE, *numbered], tmp_path)  # #0 now runs; #1 is refused
    out = third.stdout + third.stderr
    assert third.returncode == 0 and "sweep: completed 1, failed 0, diverged 0, invalid 1, skipped 0" in out, out
    assert files_of(tmp_path / "s/1") == kept and not (tmp_path / "s/superseded").exists()
    assert "the earlier run in" in out and "is left as it was" in out
