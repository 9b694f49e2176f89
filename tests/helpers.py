"""Small builders shared by the tests."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from runner.config import RunConfig, rank_config

MODEL_PRESETS = Path(__file__).resolve().parents[1] / "conf" / "model"


def run_config(model: str | None = None, **dotted: object) -> RunConfig:
    """The typed default run config, as a rank reads it: `model` names a preset of conf/model/ (as `model=NAME`),
    then `key=value` overrides (dots as in `train.seq_len`, or `__` for keyword arguments: `train__seq_len`)."""
    cfg = OmegaConf.structured(RunConfig)
    if model is not None:
        cfg = OmegaConf.merge(cfg, {"model": OmegaConf.load(MODEL_PRESETS / f"{model}.yaml")})
    for key, value in dotted.items():
        OmegaConf.update(cfg, key.replace("__", "."), value, merge=False)
    return rank_config(cfg)


def train_tokenizer(path: Path, vocab_size: int = 384) -> Path:
    """A byte-level BPE tokenizer.json trained on the embedded corpus on the fly (nothing downloaded; ~0.2 s)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from runner.data.corpus import document_texts

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>"],
        show_progress=False,
    )
    tokenizer.train_from_iterator(document_texts(None, "text"), trainer)
    tokenizer.save(str(path))
    return path
