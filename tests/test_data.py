"""The data contract: a global batch fixed by (seed, step), split evenly, with varying valid-token counts."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import run_config

from runner.data.batches import IGNORE_INDEX, GlobalBatches, load_documents, local_micro_batches

SPLITS = [(1, 1), (2, 1), (4, 1), (1, 4), (2, 2), (2, 4), (4, 4), (8, 2)]


@pytest.fixture(scope="module")
def batches():
    cfg = run_config()
    return GlobalBatches(load_documents(cfg.data), seq_len=128, global_batch=16, seed=0, packing=False)


def reassembled(batches, step, world_size, grad_accum):
    """Every rank's micro-batches of step `step`, put back together in rank order."""
    parts = [
        local_micro_batches(batches(step), dp=world_size, dp_rank=r, sp=1, sp_rank=0, grad_accum=grad_accum)
        for r in range(world_size)
    ]
    micro = [mb for rank in parts for mb in rank]
    assert len(micro) == world_size * grad_accum
    assert len({mb.inputs.shape[0] for mb in micro}) == 1  # an even split
    return torch.cat([mb.inputs for mb in micro]), torch.cat([mb.labels for mb in micro])


@pytest.mark.parametrize("step", [1, 2, 7])
def test_every_split_trains_on_the_same_tokens(batches, step):
    whole = batches(step)
    for world_size, grad_accum in SPLITS:
        inputs, labels = reassembled(batches, step, world_size, grad_accum)
        assert torch.equal(inputs, whole.inputs), (world_size, grad_accum)
        assert torch.equal(labels, whole.labels), (world_size, grad_accum)


def test_global_batch_depends_on_seed_and_step_only(batches):
    cfg = run_config()
    again = GlobalBatches(load_documents(cfg.data), seq_len=128, global_batch=16, seed=0, packing=False)
    assert torch.equal(batches(3).inputs, again(3).inputs)
    assert not torch.equal(batches(3).inputs, batches(4).inputs)
    other_seed = GlobalBatches(load_documents(cfg.data), seq_len=128, global_batch=16, seed=1, packing=False)
    assert not torch.equal(batches(3).inputs, other_seed(3).inputs)


def test_valid_token_counts_vary_between_micro_batches(batches):
    counts = [mb.valid_tokens for mb in local_micro_batches(batches(1), dp=4, dp_rank=0, sp=1, sp_rank=0, grad_accum=4)]
    counts += [
        mb.valid_tokens for mb in local_micro_batches(batches(1), dp=4, dp_rank=3, sp=1, sp_rank=0, grad_accum=4)
    ]
    assert len(set(counts)) > 1
    assert 0 < batches(1).valid_tokens < 16 * 128  # padded, not packed


def test_labels_are_next_tokens(batches):
    batch = batches(1)
    valid = batch.labels[:, :-1] != IGNORE_INDEX
    following = batch.labels[:, 1:] != IGNORE_INDEX
    both = valid & following
    assert torch.equal(batch.inputs[:, 1:][both], batch.labels[:, :-1][both])


def test_packing_fills_every_position():
    cfg = run_config()
    packed = GlobalBatches(load_documents(cfg.data), seq_len=64, global_batch=8, seed=0, packing=True)(1)
    assert packed.valid_tokens == 8 * 64


def test_sequence_chunks_carry_their_position_offset(batches):
    chunks = [local_micro_batches(batches(1), dp=1, dp_rank=0, sp=4, sp_rank=r, grad_accum=1)[0] for r in range(4)]
    assert [c.position_offset for c in chunks] == [0, 32, 64, 96]
    assert torch.equal(torch.cat([c.labels for c in chunks], dim=1), batches(1).labels)


def test_user_text_sources(tmp_path):
    (tmp_path / "a.txt").write_text("First paragraph.\n\nSecond paragraph.\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.txt").write_text("Third.\n")
    folder = load_documents(run_config(**{"data.path": str(tmp_path)}).data)
    assert [bytes(d.tolist()).decode() for d in folder] == ["First paragraph.", "Second paragraph.", "Third."]
    records = tmp_path / "c.jsonl"
    records.write_text(json.dumps({"text": "one record"}) + "\n\n" + json.dumps({"text": "two"}) + "\n")
    assert len(load_documents(run_config(**{"data.path": str(records)}).data)) == 2


def test_jsonl_without_the_text_field_names_it(tmp_path):
    records = tmp_path / "c.jsonl"
    records.write_text(json.dumps({"body": "x"}) + "\n")
    # The launcher refuses this before launch (tests/test_refusals.py); a rank reading it raises the same.
    with pytest.raises(ValueError, match=r"c\.jsonl line 1 has no field 'text' \(data\.text_field\); it has: body"):
        load_documents(run_config(**{"data.path": str(records)}).data)


def _valid_tokens_batches(rule: str) -> GlobalBatches:
    return GlobalBatches(
        load_documents(run_config().data), seq_len=64, global_batch=16, seed=0, packing=False, valid_tokens=rule
    )


# (world_size, sp, grad_accum) of every layout of a 16-row, 64-position batch up to 8 ranks.
ALL_LAYOUTS = [
    (w, sp, ga)
    for w in (1, 2, 4, 8)
    for sp in (1, 2, 4)
    for ga in (1, 2, 4)
    if w % sp == 0 and 16 % (w // sp * ga) == 0
]


@pytest.mark.parametrize("rule", ["skewed", "one_empty"])
def test_valid_tokens_masks_by_row_and_position_alone(rule):
    full, masked = _valid_tokens_batches("full")(1), _valid_tokens_batches(rule)(1)
    assert torch.equal(full.inputs, masked.inputs)
    rows, positions = torch.meshgrid(torch.arange(16), torch.arange(64), indexing="ij")
    keep = positions % (rows + 1) == 0  # row i keeps every (i+1)-th target
    if rule == "one_empty":
        keep &= rows < 12  # the last quarter of the rows keeps none
    assert torch.equal(masked.labels, full.labels.masked_fill(~keep, IGNORE_INDEX))
    for world_size, sp, grad_accum in ALL_LAYOUTS:  # every layout's shards together are the same targets
        dp = world_size // sp
        shares = [
            local_micro_batches(masked, dp=dp, dp_rank=r, sp=sp, sp_rank=s, grad_accum=grad_accum)
            for r in range(dp)
            for s in range(sp)
        ]
        assert sum(mb.valid_tokens for share in shares for mb in share) == int((masked.labels != IGNORE_INDEX).sum())


def test_skewed_counts_differ_a_lot_and_one_empty_empties_the_last_micro_batch():
    skewed, one_empty = _valid_tokens_batches("skewed")(1), _valid_tokens_batches("one_empty")(1)
    quarters = (skewed.labels != IGNORE_INDEX).reshape(4, -1).sum(dim=1)  # 4 micro-batches of 4 rows
    assert quarters.min() > 0 and quarters.max() > 4 * quarters.min()
    for world_size, sp, grad_accum in ALL_LAYOUTS:
        dp = world_size // sp
        last = local_micro_batches(one_empty, dp=dp, dp_rank=dp - 1, sp=sp, sp_rank=sp - 1, grad_accum=grad_accum)[-1]
        if dp * grad_accum >= 4:
            assert last.whole_valid_tokens == 0, (world_size, sp, grad_accum)  # every sp shard of it is empty
        first = local_micro_batches(one_empty, dp=dp, dp_rank=0, sp=1, sp_rank=0, grad_accum=1)[0]
        assert first.valid_tokens > 0
