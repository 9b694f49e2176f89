"""Cross-field checks of a run config, done before any rank process starts.

Types and enum values are already checked by OmegaConf against
`runner.config.RunConfig`; this module checks what types cannot say. Every
message names the field, its value and what would be valid.
"""

from __future__ import annotations

import os
from pathlib import Path

from omegaconf import DictConfig

from runner.config import FAULT_KINDS
from runner.data.corpus import corpus_problem
from runner.layout import ParallelLayout
from runner.modes import custom_expectation
from runner.record.wandb_run import has_wandb_credentials
from runner.sweep.custom_check import custom_fn_problem

TEXT_SUFFIXES = (".txt", ".jsonl")
# More gloo ranks than this per core spend their time in the scheduler, not training.
CPU_RANKS_PER_CORE = 4
EXIT_INVALID = 2  # the exit status of a run refused before launch (as argparse's for bad arguments)
BYTE_VOCAB = 256


class InvalidConfig(ValueError):
    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        fields = ", ".join(sorted({name for name, _ in problems}))
        lines = "\n".join(f"  - {message}" for _, message in problems)
        super().__init__(f"invalid config ({fields}):\n{lines}")


def config_problems(cfg: DictConfig) -> list[tuple[str, str]]:
    """(field, message) pairs for every rule the config breaks."""
    problems = ParallelLayout.from_config(cfg).problems(
        global_batch=cfg.train.global_batch, seq_len=cfg.train.seq_len, n_heads=cfg.model.n_heads
    )
    problems += _model_problems(cfg.model)
    problems += _training_problems(cfg)
    problems += _data_problems(cfg.data, seq_len=cfg.train.seq_len)
    problems += cost_problems(cfg)
    problems += custom_problems(cfg)
    problems += _count_problems(cfg.metrics)
    problems += _fault_problems(cfg)
    problems += _positive(cfg.dist.timeout_s, "dist.timeout_s")
    if cfg.wandb.mode.value == "online" and not has_wandb_credentials():
        problems.append(
            (
                "wandb.mode",
                "wandb.mode=online needs WANDB_API_KEY (or `wandb login`); "
                "or run wandb.mode=offline and upload later with `make sync`",
            )
        )
    return problems


def validate(cfg: DictConfig) -> None:
    problems = config_problems(cfg)
    if problems:
        raise InvalidConfig(problems)


def _positive(value: float, name: str) -> list[tuple[str, str]]:
    return [] if value > 0 else [(name, f"{name}={value} must be > 0")]


def _model_problems(model: DictConfig) -> list[tuple[str, str]]:
    found = _positive(model.n_layers, "model.n_layers") + _positive(model.n_heads, "model.n_heads")
    found += _positive(model.d_model, "model.d_model")
    if found:
        return found
    if model.d_model % model.n_heads:
        found.append(
            ("model.d_model", f"model.d_model={model.d_model} is not divisible by model.n_heads={model.n_heads}")
        )
    elif (model.d_model // model.n_heads) % 2:
        found.append(
            (
                "model.n_heads",
                f"head dim model.d_model/model.n_heads={model.d_model // model.n_heads} must be even for RoPE",
            )
        )
    if model.vocab_size < BYTE_VOCAB:
        found.append(
            ("model.vocab_size", f"model.vocab_size={model.vocab_size} must be >= {BYTE_VOCAB} (byte-level tokens)")
        )
    if model.ffn_hidden is not None and model.ffn_hidden < 1:
        found.append(("model.ffn_hidden", f"model.ffn_hidden={model.ffn_hidden} must be >= 1 or null"))
    return found


def _training_problems(cfg: DictConfig) -> list[tuple[str, str]]:
    found = _positive(cfg.train.steps, "train.steps") + _positive(cfg.train.seq_len, "train.seq_len")
    found += _positive(cfg.train.global_batch, "train.global_batch") + _positive(cfg.train.log_every, "train.log_every")
    found += _positive(cfg.wandb.log_every, "wandb.log_every")
    found += _positive(cfg.optim.lr, "optim.lr") + _positive(cfg.timeout_s, "timeout_s")
    if cfg.optim.clip < 0:
        found.append(
            ("optim.clip", f"optim.clip={cfg.optim.clip} must be >= 0 (the max grad norm; 0 disables clipping)")
        )
    if cfg.optim.warmup_steps < 0:
        found.append(("optim.warmup_steps", f"optim.warmup_steps={cfg.optim.warmup_steps} must be >= 0"))
    if cfg.metrics.sketch_dim < 0:
        found.append(("metrics.sketch_dim", f"metrics.sketch_dim={cfg.metrics.sketch_dim} must be >= 0 (0 disables)"))
    return found


def _data_problems(data: DictConfig, *, seq_len: int) -> list[tuple[str, str]]:
    if data.path is None and data.name != "embedded":
        return [("data.path", f"data={data.name} needs data.path=FILE_OR_FOLDER (.txt, a folder of .txt, or .jsonl)")]
    found = [] if data.path is None else _data_path_problems(data.path)
    if not found and seq_len > 0:
        # Reads the data once per sweep (cached on the files' size and mtime), as the ranks will.
        problem = corpus_problem(data.path, data.text_field, seq_len=seq_len, packing=data.packing)
        found += [("data.path", problem)] if problem else []
    return found


def _data_path_problems(given: str) -> list[tuple[str, str]]:
    path = Path(given).expanduser()
    if not path.exists():
        return [
            (
                "data.path",
                f"data.path={given} does not exist; give a .txt file, a folder of .txt files or a .jsonl file",
            )
        ]
    if path.is_file() and path.suffix not in TEXT_SUFFIXES:
        return [
            (
                "data.path",
                f"data.path={given} has suffix {path.suffix!r}; valid: {', '.join(TEXT_SUFFIXES)} or a folder",
            )
        ]
    if path.is_dir() and not any(path.rglob("*.txt")):
        return [("data.path", f"data.path={given} is a folder without .txt files")]
    return []


def visible_cuda_devices() -> int:
    # Without an NVIDIA device node there is no CUDA device: skip importing torch
    # in the launcher (about a second of every single job's fixed cost).
    if not any(Path("/dev").glob("nvidia[0-9]*")):
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def usable_cpu_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def machine_problems(cfg: DictConfig, *, cuda_devices: int, cpu_cores: int) -> list[tuple[str, str]]:
    """Rules about the machine the ranks start on (checked there: by the launcher, or by the job on a cluster node)."""
    on_cpu = cfg.device.value == "cpu" or (cfg.device.value == "auto" and cuda_devices == 0)
    limit = CPU_RANKS_PER_CORE * cpu_cores
    if on_cpu and cfg.world_size > limit and not cfg.dist.oversubscribe:
        return [
            (
                "world_size",
                f"world_size={cfg.world_size} would start {cfg.world_size} CPU ranks on this machine's {cpu_cores} cores; "
                f"valid: world_size<={limit} ({CPU_RANKS_PER_CORE} ranks per core), or dist.oversubscribe=true to run it anyway",
            )
        ]
    return []


def machine_shortfall(cfg: DictConfig, cuda_devices: int) -> str | None:
    """Why this machine cannot run a valid config (the job is then skipped), or None."""
    if cfg.device.value == "cuda" and cuda_devices == 0:
        return "device=cuda but no CUDA device is visible; use device=auto or device=cpu"
    uses_cuda = cfg.device.value == "cuda" or (cfg.device.value == "auto" and cuda_devices > 0)
    if uses_cuda and cfg.world_size > cuda_devices:
        return (
            f"world_size={cfg.world_size} needs one GPU per rank but {cuda_devices} are visible; "
            f"use world_size<={cuda_devices} or device=cpu"
        )
    return None


def cost_problems(cfg: DictConfig) -> list[tuple[str, str]]:
    """The interleaved cost measurement (`cost.modes`) needs its baseline and the mode it trains on."""
    modes = [m.value for m in cfg.cost.modes]
    if not modes:
        return []
    if "custom" in modes or cfg.reduction.value == "custom":
        return [
            (
                "cost.modes",
                f"cost.modes={modes} with reduction={cfg.reduction.value}: the cost job times the runner's own modes, "
                "not a custom callable; train reduction=custom with cost.modes=[] and list only built-in modes here",
            )
        ]
    found = []
    if "sum" in modes and cfg.autograd_all_reduce.value != "funcol":
        found.append(
            (
                "autograd_all_reduce",
                f"autograd_all_reduce={cfg.autograd_all_reduce.value} with cost.modes={modes}: the cost job times and "
                "records sum's collectives as funcol's (forward and backward); use autograd_all_reduce=funcol",
            )
        )
    if "local" not in modes:
        found.append(("cost.modes", f"cost.modes={modes} must include local (the baseline of every overhead)"))
    if cfg.reduction.value not in modes:
        found.append(
            (
                "cost.modes",
                f"cost.modes={modes} must include reduction={cfg.reduction.value} (its gradients train the model)",
            )
        )
    if len(set(modes)) < len(modes):
        found.append(("cost.modes", f"cost.modes={modes} names a mode twice; list each once"))
    if cfg.cost.warmup_steps < 0 or cfg.cost.warmup_steps >= cfg.train.steps:
        found.append(
            (
                "cost.warmup_steps",
                f"cost.warmup_steps={cfg.cost.warmup_steps} must be >= 0 and < train.steps={cfg.train.steps}",
            )
        )
    if cfg.cost.floor_calls < 0:
        found.append(("cost.floor_calls", f"cost.floor_calls={cfg.cost.floor_calls} must be >= 0 (0 skips the floor)"))
    return found


def _count_problems(metrics: DictConfig) -> list[tuple[str, str]]:
    found = []
    if metrics.count_first < 0:
        found.append(("metrics.count_first", f"metrics.count_first={metrics.count_first} must be >= 0"))
    if metrics.count_every < 1:
        found.append(
            ("metrics.count_every", f"metrics.count_every={metrics.count_every} must be >= 1 (1 counts every step)")
        )
    if metrics.gather_every < 1:
        found.append(
            ("metrics.gather_every", f"metrics.gather_every={metrics.gather_every} must be >= 1 (1 gathers every step)")
        )
    return found


def _fault_problems(cfg: DictConfig) -> list[tuple[str, str]]:
    fault = cfg.fault
    if fault.kind not in FAULT_KINDS:
        return [("fault.kind", f"fault.kind={fault.kind} is not a fault; valid: {', '.join(FAULT_KINDS)}")]
    if fault.kind == "none":
        return []
    found = []
    if cfg.cost.modes:
        found.append(
            (
                "fault.kind",
                f"fault.kind={fault.kind} needs a training job; cost.modes must be empty (it is {[m.value for m in cfg.cost.modes]})",
            )
        )
    if not 0 <= fault.rank < cfg.world_size:
        found.append(
            (
                "fault.rank",
                f"fault.rank={fault.rank} is not a rank of world_size={cfg.world_size}; valid: 0 to {cfg.world_size - 1}",
            )
        )
    if not 1 <= fault.step <= cfg.train.steps:
        found.append(
            (
                "fault.step",
                f"fault.step={fault.step} is not a step of train.steps={cfg.train.steps}; valid: 1 to {cfg.train.steps}",
            )
        )
    return found


def custom_problems(cfg: DictConfig) -> list[tuple[str, str]]:
    """reduction=custom needs an importable callable fn(logits, labels, ctx), and a readable `custom.expect`."""
    if cfg.reduction.value != "custom":
        return []  # custom.* is ignored by the other modes
    found = []
    if cfg.custom.fn is None:
        found.append(
            ("custom.fn", "reduction=custom needs custom.fn=MODULE:CALLABLE, e.g. examples.reductions.torchtitan:loss")
        )
    else:
        problem = custom_fn_problem(cfg.custom.fn)  # a subprocess, once per callable: the module may import torch
        if problem:
            found.append(("custom.fn", problem))
    if cfg.custom.expect is not None:
        try:
            custom_expectation(cfg.custom.expect, cfg.world_size)
        except ValueError as error:
            found.append(("custom.expect", f"custom.expect={cfg.custom.expect}: {error}"))
    return found
