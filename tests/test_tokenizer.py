"""`data.tokenizer`: a tokenizer.json's ids instead of bytes, under the same (seed, step) contract.

The tokenizer is a byte-level BPE trained here on the embedded corpus
(tests/helpers.py: `train_tokenizer`); nothing is downloaded.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch
from helpers import run_config, run_module, train_tokenizer

from runner.config import config_with
from runner.data.batches import IGNORE_INDEX, PAD_TOKEN, GlobalBatches, load_documents, packing_separator
from runner.data.corpus import document_texts, load_tokenizer, tokenizer_vocab_size
from runner.sweep.validate import config_problems

VOCAB = 384


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> str:
    return str(train_tokenizer(tmp_path_factory.mktemp("tokenizer") / "tokenizer.json", VOCAB))


def batches(cfg, packing=False, seed=0) -> GlobalBatches:
    documents = load_documents(cfg.data)
    separator = packing_separator(cfg.data)
    return GlobalBatches(documents, seq_len=64, global_batch=8, seed=seed, packing=packing, separator=separator)


def test_documents_are_the_tokenizers_ids(tokenizer):
    cfg = run_config(data__tokenizer=tokenizer)
    documents = load_documents(cfg.data)
    first_text = document_texts(None, "text")[0]
    assert (
        documents[0].dtype == torch.int32 and documents[0].tolist() == load_tokenizer(tokenizer).encode(first_text).ids
    )
    assert load_tokenizer(tokenizer).decode(documents[0].tolist()) == first_text  # byte-level BPE is lossless
    assert max(int(doc.max()) for doc in documents) < tokenizer_vocab_size(tokenizer) == VOCAB
    # Fewer tokens than bytes: the merges are used.
    assert sum(doc.numel() for doc in documents) < 0.7 * sum(doc.numel() for doc in load_documents(run_config().data))


def test_the_global_batch_depends_on_seed_and_step_only(tokenizer):
    cfg = run_config(data__tokenizer=tokenizer)
    first, again, other = batches(cfg), batches(cfg), batches(cfg, seed=1)
    assert torch.equal(first(3).inputs, again(3).inputs) and torch.equal(first(3).labels, again(3).labels)
    assert not torch.equal(first(3).inputs, first(4).inputs)
    assert not torch.equal(first(3).inputs, other(3).inputs)
    batch = first(1)
    padded = batch.labels == IGNORE_INDEX
    assert padded.any() and (batch.inputs[padded] == PAD_TOKEN).all()  # padding: ignored targets after a document
    assert int(batch.inputs.max()) < VOCAB


def test_packing_separates_documents_with_the_separators_tokens(tokenizer):
    cfg = run_config(data__tokenizer=tokenizer)
    separator = packing_separator(cfg.data)
    assert separator.tolist() == load_tokenizer(tokenizer).encode("\n\n", add_special_tokens=False).ids
    assert batches(cfg, packing=True)(1).valid_tokens == 8 * 64


def test_the_tokenizers_vocab_must_fit_the_models(tokenizer):
    def fields(**overrides):
        return [field for field, _ in config_problems(config_with({"data.tokenizer": tokenizer, **overrides}))]

    assert fields() == ["model.vocab_size"]  # 256 < 384
    assert fields(**{"model.vocab_size": VOCAB}) == []
    hf = {"model.arch": "hf", "model.name": "hf", "model.overrides": {"model_type": "llama", "num_attention_heads": 4}}
    assert fields(**hf, **{"model.overrides.vocab_size": 256}) == ["model.overrides"]
    assert fields(**hf, **{"model.overrides.vocab_size": 512}) == []


def test_the_tokenizers_library_never_imports_torch():
    """The launcher reads the tokenizer (its vocab, the data's token count) without torch."""
    probe = "import sys, tokenizers, runner.data.corpus; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False", done.stderr


@pytest.mark.slow
def test_a_run_with_a_tokenizer_completes(tokenizer, tmp_path):
    overrides = [f"data.tokenizer={tokenizer}", f"model.vocab_size={VOCAB}", "train.steps=2", "wandb.mode=disabled"]
    done = run_module("runner", [*overrides, "hydra.run.dir=run"], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert records[0]["loss"] == pytest.approx(math.log(VOCAB), abs=0.3)  # about uniform over the vocab at init
