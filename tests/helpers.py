"""Small builders shared by the tests."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
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


def run_module(module: str, args: list[str], cwd: Path, env: dict | None = None, timeout: float = 300):
    """`python -m module *args` in `cwd` as a user starts it: the launcher's rank variables (RANK, WORLD_SIZE...)
    left out of the environment, so it spawns its own world."""
    source = os.environ if env is None else env
    env = {key: value for key, value in source.items() if not key.startswith(("RANK", "WORLD_SIZE"))}
    return subprocess.run(
        [sys.executable, "-m", module, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def step_one_batch(cfg: RunConfig):
    """The global batch of step 1, drawn as the ranks draw it (the runner's data, its data.packing and data.valid_tokens)."""
    from runner.data.batches import GlobalBatches, load_documents

    return GlobalBatches(
        load_documents(cfg.data),
        seq_len=cfg.train.seq_len,
        global_batch=cfg.train.global_batch,
        seed=cfg.seed,
        packing=cfg.data.packing,
        valid_tokens=cfg.data.valid_tokens,
    )(1)


def step_one_through_parts(cfg: RunConfig, meshes, with_reducer: bool = False):
    """On every rank: step 1's forward and backward through the runner's own parts (`build_parts`: the model
    sharded for the mode or custom.fsdp_reduce, the reducer from the config); returns (StepLoss, parts), and
    the reducer that ran with `with_reducer` (its `grad_norm()` for the runner's clipping)."""
    import torch

    from runner.train.components import build_parts
    from runner.train.reduction import forward_backward

    parts = build_parts(cfg, meshes, torch.device("cpu"))
    reducer = parts.reducer(cfg.reduction)
    step = forward_backward(parts.model, parts.local_share(parts.batches(1)), reducer, parts.device)
    return (step, parts, reducer) if with_reducer else (step, parts)


@dataclass(frozen=True)
class CliVerdict:
    """What `python -m runner ARGS` (a single run, no `-m`) ends with before any rank starts, found in-process."""

    code: int  # the exit status: EXIT_INVALID when refused before launch, 0 when the job would start
    message: str  # what it prints about the refusal ("" when admitted)
    status: str | None  # the job folder's summary.json status it writes ("invalid", "skipped"), None if it writes none


def cli_verdict(args: list[str]) -> CliVerdict:
    """The verdict of `python -m runner *args` (single-run mode), by the CLI's own steps without its subprocess:
    runner/__main__.py's `quote_home_paths` and `override_problems`; Hydra's composition of conf/config.yaml with
    the runner's schema (`register_configs`), whose errors it prints as `hydra.main` does and turns into
    EXIT_INVALID as `runner.__main__._main` does; then `runner.sweep.job`'s `admit` (sweeping=False, this
    machine, Hydra's trainer choice) and `machine_shortfall` (a valid job this machine cannot run)."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import CompactHydraException, HydraException
    from omegaconf.errors import OmegaConfBaseException

    from runner.config import register_configs
    from runner.sweep.admission import Refused, admit_composed
    from runner.sweep.machine import machine_shortfall, usable_cpu_cores, visible_cuda_devices
    from runner.sweep.overrides import CONF, override_problems, quote_home_paths
    from runner.sweep.validate import EXIT_INVALID, InvalidConfig

    args = quote_home_paths(args)
    problems = override_problems(args)
    if problems:
        return CliVerdict(EXIT_INVALID, f"runner: {InvalidConfig(problems)}", None)
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        try:
            cfg = compose("config", args, return_hydra_config=True)
        except (HydraException, OmegaConfBaseException) as error:  # printed as hydra's run_and_report does
            message = str(error)
            if isinstance(error, CompactHydraException) and isinstance(error.__cause__, OmegaConfBaseException):
                message += f"\n{error.__cause__}"
            return CliVerdict(EXIT_INVALID, message, None)
    machine = {"cuda_devices": visible_cuda_devices(), "cpu_cores": usable_cpu_cores()}
    verdict = admit_composed(cfg, machine=machine, sweeping=False)  # as the job's admit, from Hydra's node
    if isinstance(verdict, Refused):
        return CliVerdict(EXIT_INVALID, str(InvalidConfig(verdict.problems)), "invalid")
    shortfall = machine_shortfall(verdict.cfg, machine["cuda_devices"])
    if shortfall:
        return CliVerdict(EXIT_INVALID, f"refused: {shortfall}", "skipped")
    return CliVerdict(0, "", None)
