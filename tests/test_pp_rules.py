"""Pipeline parallelism's rules, checked before launch (`runner.layout`, `runner.sweep.pp_rules`), in-process."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest

from runner.config import config_with
from runner.sweep.ignored import meaningless_keys, unread_keys
from runner.sweep.pp_rules import pipeline_parallel_problems
from runner.sweep.validate import config_problems

GLOBAL_BATCH, LAYERS = 12, 3  # 12 rows: dp x grad_accum of 1 to 8 split them into 12, 6, 4, 3 or not at all
ONE_F_ONE_B = "one_f_one_b"


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _expected(world_size: int, pp: int, grad_accum: int, microbatches: int | None, schedule: str):
    """(pp_rules' fields, with their counts; the layout's fields; the valid pipeline micro-batch counts, where
    the rows of one gradient-accumulation micro-batch divide evenly), from the rules' definitions."""
    count = microbatches or pp
    rules: Counter = Counter()
    if LAYERS < pp:
        rules["pp"] += 1  # a stage without a layer
    layout, valid = set(), None
    if world_size % pp:
        layout.add("pp")
    else:
        dp = world_size // pp
        if GLOBAL_BATCH % (dp * grad_accum):
            layout.add("train.global_batch")
        else:
            rows = GLOBAL_BATCH // (dp * grad_accum)
            valid = [d for d in _divisors(rows) if schedule != ONE_F_ONE_B or d >= pp]
            if rows % count:
                rules["pp_microbatches"] += 1  # unequal pipeline micro-batches
    if schedule == ONE_F_ONE_B and count < pp:
        rules["pp_microbatches"] += 1  # Schedule1F1B's own rule
    return rules, layout, valid


@pytest.mark.parametrize(
    "world_size, pp, grad_accum, microbatches, schedule",
    # (W = 1 divides no pp > 1: its pp, 3 and 4 stages on W = 2, 4 or 6 stand for it)
    list(itertools.product((2, 3, 4, 6, 8), (2, 3, 4), (1, 2), (None, 1, 2, 3, 4), ("gpipe", ONE_F_ONE_B))),
)
def test_a_pipeline_is_refused_exactly_when_a_rule_says_so(world_size, pp, grad_accum, microbatches, schedule):
    """Generated over W, pp, grad_accum, pp_microbatches and the schedule with the tiny model at 3 layers and a
    global batch of 12: refused by pp_rules iff a stage would have no layer, pp_microbatches (null: pp) does not
    divide the rows of one gradient-accumulation micro-batch on a dp rank (12 / (dp x grad_accum), where that
    is whole), or 1F1B gets fewer micro-batches than stages; the layout's rules refuse pp not dividing W and the
    batch not splitting over dp x grad_accum. Each refusal names its field, and its value in the message."""
    cfg = config_with(
        {
            "world_size": world_size,
            "pp": pp,
            "grad_accum": grad_accum,
            "pp_microbatches": microbatches,
            "pp_schedule": schedule,
            "train.global_batch": GLOBAL_BATCH,
            "model.n_layers": LAYERS,
        }
    )
    rules, layout, valid = _expected(world_size, pp, grad_accum, microbatches, schedule)
    found = pipeline_parallel_problems(cfg, None)
    assert Counter(field for field, _ in found) == rules, found
    for field, message in found:
        assert f"{field}=" in message, message
        if field == "pp_microbatches" and "cannot split" in message:
            shown = ", ".join(map(str, valid)) if valid else "none"
            assert f": {shown}" in message, message
    assert {field for field, _ in config_problems(cfg)} == set(rules) | layout, config_problems(cfg)


def test_a_layer_per_stage_names_the_valid_pp():
    found = pipeline_parallel_problems(config_with({"world_size": 8, "pp": 4}), None)  # tiny: 2 layers
    assert found == [
        (
            "pp",
            "pp=4 stages need at least one layer each, and model.n_layers=2; valid pp (divisors of world_size=8 "
            "up to 2): 1, 2, or raise model.n_layers to 4 or more",
        )
    ]


def test_the_rows_message_names_r_and_its_formula():
    cfg = config_with({"world_size": 4, "pp": 2, "grad_accum": 1, "train.global_batch": 12, "pp_microbatches": 4})
    [(field, message)] = pipeline_parallel_problems(cfg, None)
    assert field == "pp_microbatches"
    assert "train.global_batch / (dp x grad_accum) = 12 / (2 x 1) = 6" in message, message
    assert "dp = world_size / (sp x tp x pp) = 4 / (1 x 1 x 2) = 2" in message, message
    assert message.endswith("valid pp_microbatches: 1, 2, 3, 6"), message


@pytest.mark.parametrize(
    "overrides, field, says",
    [
        ({"model.arch": "hf", "model.name": "hf_llama"}, "pp", "Hugging Face model: use pp=1"),
        ({"reduction": "custom"}, "pp", "reduction=custom (a trainer rule"),  # (custom.fn's own rule aside)
        ({"world_size": 4, "sp": 2}, "sp", "use sp=1 with pp>1"),
        ({"world_size": 4, "tp": 2}, "tp", "use tp=1 with pp>1"),
        ({"objective.name": "pg", "train.seq_len": 64}, "objective", "use objective=ce with pp>1"),
        ({"cost.modes": ["sum", "local"]}, "cost.modes", "interleaved loop is not pipelined"),
        ({"model.tie_embeddings": True}, "model.tie_embeddings", "the head on the last"),
        ({"model.n_layers": 1}, "pp", "at least one layer each, and model.n_layers=1"),
    ],
    ids=["hf", "custom", "sp", "tp", "pg", "cost", "tied", "layers"],
)
def test_what_a_pipeline_cannot_run_is_refused_naming_the_field(overrides, field, says):
    with_pp = config_with({"world_size": 2, "pp": 2, **overrides})
    said = [message for f, message in config_problems(with_pp) if f == field]
    assert any(says in message for message in said), config_problems(with_pp)
    assert any(says in message for f, message in pipeline_parallel_problems(with_pp, None) if f == field)
    without = config_with({**overrides, "pp": 1})
    assert pipeline_parallel_problems(without, None) == []
    assert not any(says in message for _, message in config_problems(without))


@pytest.mark.parametrize("key, value", [("pp_schedule", ONE_F_ONE_B), ("pp_microbatches", 2), ("pp_scale_grads", True)])
def test_the_pipeline_keys_are_refused_as_unread_at_pp_1(key, value):
    """As loss_parallel at tp=1 (tests/test_ignored_keys.py holds every key to what the ranks read)."""
    at_pp_1 = config_with({key: value})
    assert key in meaningless_keys(at_pp_1)
    [(field, message)] = unread_keys(at_pp_1)
    assert field == key and "pp=1 has no pipeline schedule (set pp > 1)" in message, message
    at_pp_2 = config_with({"world_size": 2, "pp": 2, key: value})
    assert key not in meaningless_keys(at_pp_2)
    assert not any(f == key for f, _ in config_problems(at_pp_2)), config_problems(at_pp_2)
