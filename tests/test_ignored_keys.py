"""No key is silently ignored: every key of the schema, against every mode and architecture, held to what the
ranks really read.

Generated, not listed: each base job (every reduction mode on the runner's decoder and on a Hugging Face
Llama, and the switches that change what a job reads: SGD, W&B on, no sketch, no collective counts, an
injected fault, JSONL data, cost jobs) runs its whole rank side (`run_rank`, two ranks, four steps) on a
config that notes every key read (tests/config_reads.py). Then every key of the schema is set to another
value on that base, and the launcher must refuse it as unread (`runner.sweep.ignored.meaningless_keys`)
exactly when the ranks did not read it, apart from the keys read outside the ranks, named below with who
reads them. On today's main the ranks' reads already disagree with what is accepted: `custom.*` with a
built-in mode, `autograd_all_reduce` without an all-reduce, Adam's betas under SGD and more were accepted.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from config_reads import rank_reads
from gloo_world import run_in_world
from helpers import MODEL_PRESETS
from omegaconf import OmegaConf
from schema_values import another_value, leaves

from runner.config import config_with
from runner.modes import Reduction
from runner.ranges import value_at
from runner.sweep.ignored import meaningless_keys

pytestmark = pytest.mark.slow

BASE = {"train.steps": 4, "train.seq_len": 32, "train.global_batch": 8, "grad_accum": 2, "wandb.mode": "disabled"}
CUSTOM = {"custom.fn": "runner.trainers.torchtitan:loss", "custom.fsdp_reduce": "sum"}
# objective=pg's: a rule that reads the responses (a cross-entropy rule under pg is stopped at its first step)
PG_CUSTOM = {"custom.fn": "runner.trainers.papers:dr_grpo", "custom.fsdp_reduce": "sum"}
COST = {"cost.modes": ["sum", "local"], "cost.warmup_steps": 1, "cost.floor_calls": 5, "train.steps": 3}
# Keys a rank does not read but the launcher or the analysis does, and when.
OUTSIDE_THE_RANKS = {
    "timeout_s": lambda cfg: True,  # the rank spawner stops the job then
    "dist.oversubscribe": lambda cfg: True,  # the launcher's machine rule
    "model.name": lambda cfg: True,  # the run's label in the analysis
    "data.name": lambda cfg: True,  # the data's label (data=text needs data.path)
    "custom.expect": lambda cfg: cfg.reduction.value == "custom",  # the analysis judges the run by it
    "custom.rule": lambda cfg: cfg.reduction.value == "custom",  # the trainers table's line
    "custom.name": lambda cfg: cfg.reduction.value == "custom",  # the run's mode label
    "custom.expect_layouts": lambda cfg: cfg.reduction.value == "custom",  # the analysis judges the run by it
    "custom.weighs": lambda cfg: cfg.reduction.value == "custom",  # the analysis' post-training table
    "cost.warmup_steps": lambda cfg: bool(cfg.cost.modes),  # the analysis leaves these steps out
    **{
        f"known_bug.{key}": lambda cfg: True  # the known-bugs table
        for key in ("name", "reference", "signature", "evidence", "evidence_source")
    },
    **{
        f"known_bug.{arm}.{key}": lambda cfg: True
        for arm in ("buggy", "fixed")
        for key in ("fn", "fsdp_reduce", "expect", "grad_norm")
    },
}


def base(name: str, model: str | None = None, **dotted) -> tuple[str, object]:
    cfg = config_with({**BASE, **{key.replace("__", "."): value for key, value in dotted.items()}})
    if model is not None:
        cfg.model = OmegaConf.merge(cfg.model, OmegaConf.load(MODEL_PRESETS / f"{model}.yaml"))
    return name, cfg


def bases(data: Path) -> list[tuple[str, object]]:
    found = []
    for mode in Reduction:
        extra = CUSTOM if mode is Reduction.custom else {}
        for arch, model in (("decoder", None), ("hf", "hf_llama")):
            found.append(base(f"{mode.value}-{arch}", model, reduction=mode.value, **extra))
    found += [
        base("sum-sgd", optim__name="sgd", optim__lr=0.2, optim__momentum=0.9, optim__clip=0.0),
        base("custom-hf-sgd", "hf_llama", reduction="custom", optim__name="sgd", **CUSTOM),
        # a rule that declares graph_all_reduce="configured": its ctx.all_reduce reads autograd_all_reduce
        base(
            "custom-configured",
            reduction="custom",
            custom__fn="runner.trainers.counterexample:sum_backward_under_fsdp_sum",
        ),
        base("sum-wandb", wandb__mode="offline"),
        base("sum-no-sketch", metrics__sketch_dim=0),
        base("sum-no-counts", metrics__count_comm=False),
        base("sum-fault", fault__kind="nan", fault__step=4),
        base("sum-jsonl", data__path=str(data / "records.jsonl"), data__name="text"),
        base("pg-local", reduction="local", objective__name="pg", train__seq_len=64, objective__max_response=32),
        base(
            "pg-custom",
            reduction="custom",
            objective__name="pg",
            train__seq_len=64,
            objective__max_response=32,
            **PG_CUSTOM,
        ),
        base("cost-sum", **COST),
        base("cost-local", reduction="local", **COST),
    ]
    return found


@pytest.fixture(scope="module")
def reads(tmp_path_factory) -> tuple[list, dict[str, set[str]]]:
    folder = tmp_path_factory.mktemp("reads")
    (folder / "records.jsonl").write_text(
        "\n".join(
            json.dumps({"text": f"Record {i} of a small set of records, long enough to train on."}) for i in range(60)
        )
    )
    cases = bases(folder)
    per_rank = run_in_world(rank_reads, 2, cases, str(folder), timeout_s=900)
    return cases, {name: set().union(*(ranks[name] for ranks in per_rank)) for name, _ in cases}


def test_every_key_is_refused_as_unread_exactly_when_the_ranks_do_not_read_it(reads):
    cases, read = reads
    schema = leaves()
    assert len(cases) >= 20 and len(schema) >= 60
    wrong = []
    for name, cfg in cases:
        for key, kind in schema.items():
            changed = copy.deepcopy(cfg)
            OmegaConf.update(changed, key, another_value(kind, value_at(cfg, key)), merge=False)
            used = key in read[name] or OUTSIDE_THE_RANKS.get(key, lambda cfg: False)(cfg)
            refused = key in meaningless_keys(changed)
            if used == refused:
                wrong.append(f"{name}: {key} {'read, but refused' if used else 'not read, but accepted'}")
    assert wrong == [], "\n".join(wrong)


def test_the_outside_readers_are_needed(reads):
    """Each key named as read outside the ranks is indeed one no rank reads (else the list would hide a rule)."""
    cases, read = reads
    for key, applies in OUTSIDE_THE_RANKS.items():
        assert any(applies(cfg) and key not in read[name] for name, cfg in cases), key
