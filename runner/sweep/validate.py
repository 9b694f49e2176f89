"""The rules a run config must meet, checked before any rank process starts.

OmegaConf checks types and enum values against `runner.config.RunConfig`;
`runner.ranges` checks every numeric field against the range declared beside
it; this module adds the rules that tie fields together (the layout, the
data, the cost measurement, fault injection, and the model's, in
`runner.sweep.model_rules`). Every message
names the field, its value and what would be valid. Rules about the machine
are in `runner.sweep.machine`.
"""

from __future__ import annotations

import dataclasses
import difflib
from pathlib import Path
from typing import get_type_hints

from omegaconf import DictConfig

from runner.config import FAULT_KINDS, Evidence, RunConfig
from runner.data.corpus import CorpusError, corpus_problem, tokenizer_vocab_size
from runner.layout import ParallelLayout
from runner.modes import custom_expectation, grad_norm_factor
from runner.ranges import range_problems, unoptional, value_at
from runner.record.wandb_run import has_wandb_credentials
from runner.sweep.custom_check import custom_fn_problem
from runner.sweep.hf_check import hf_class_problems
from runner.sweep.ignored import ignored_key_problems
from runner.sweep.model_rules import Problems, model_problems, positions_problems, vocab_problems
from runner.sweep.objective_rules import objective_problems
from runner.sweep.overrides import schema_keys
from runner.sweep.pp_rules import pipeline_parallel_problems
from runner.sweep.tp_rules import tensor_parallel_problems

TEXT_SUFFIXES = (".txt", ".jsonl")
EXIT_INVALID = 2  # the exit status of a run refused before launch (as argparse's for bad arguments)


class InvalidConfig(ValueError):
    def __init__(self, problems: Problems):
        self.problems = problems
        fields = ", ".join(sorted({name for name, _ in problems}))
        lines = "\n".join(f"  - {message}" for _, message in problems)
        super().__init__(f"invalid config ({fields}):\n{lines}")


def config_problems(cfg: DictConfig, *, sweeping: bool = False, explained: tuple[str, ...] = ()) -> Problems:
    """(field, message) pairs for every rule the config breaks.

    Fields outside their ranges, and empty strings, are reported alone: the rules
    between fields assume each field is in range (an sp of 0 divides nothing) and
    each path names something (`Path("")` is the working folder).
    """
    problems = range_problems(cfg, RunConfig) + empty_problems(cfg)
    if problems:
        return problems
    shape, problems = model_problems(cfg.model)
    problems += ParallelLayout.from_config(cfg).problems(
        global_batch=cfg.train.global_batch,
        seq_len=cfg.train.seq_len,
        n_heads=shape.heads if shape else None,
        heads_field=shape.heads_field if shape else "model.n_heads",
    )
    problems += tensor_parallel_problems(cfg, shape)
    problems += pipeline_parallel_problems(cfg, shape)
    if shape is not None and cfg.model.arch.value == "hf":
        problems += hf_class_problems(cfg)  # transformers' config class, asked in a subprocess
    problems += positions_problems(cfg, shape)
    problems += _data_problems(cfg.data, seq_len=cfg.train.seq_len)
    problems += objective_problems(cfg)
    problems += vocab_problems(cfg, shape)
    problems += cost_problems(cfg)
    problems += custom_problems(cfg)
    problems += known_bug_problems(cfg)
    problems += _fault_problems(cfg)
    # Keys this job would not read (`runner.sweep.ignored`; `explained`: keys a trainer's message covers).
    problems += ignored_key_problems(cfg, sweeping=sweeping, besides=explained)[0]
    if cfg.wandb.mode.value == "online" and not has_wandb_credentials():
        problems.append(
            (
                "wandb.mode",
                "wandb.mode=online needs WANDB_API_KEY (or `wandb login`); "
                "or run wandb.mode=offline and upload later with `make sync`",
            )
        )
    return problems


def string_fields(cls: type = RunConfig, prefix: str = "") -> list[tuple[str, bool]]:
    """(dotted name, whether null is valid) of every string field of the schema."""
    found = []
    hints = get_type_hints(cls)
    for field in dataclasses.fields(cls):
        kind = unoptional(hints[field.name])
        if dataclasses.is_dataclass(kind):
            found += string_fields(kind, f"{prefix}{field.name}.")
        elif kind is str:
            found.append((f"{prefix}{field.name}", kind is not hints[field.name]))
    return found


def empty_problems(cfg: DictConfig) -> Problems:
    """A string field given as '' (or blanks) names nothing: `data.path=''` would read every .txt file under the
    working folder. The message says what the field takes, and null where null is valid."""
    found = []
    for name, nullable in string_fields():
        value = value_at(cfg, name)
        if isinstance(value, str) and not value.strip():
            off = f", or {name}=null" if nullable else ""
            found.append((name, f"{name}={value!r} is empty; give a value{off} (`python -m runner --help`)"))
    return found


def validate(cfg: DictConfig) -> None:
    problems = config_problems(cfg)
    if problems:
        raise InvalidConfig(problems)


def _data_problems(data: DictConfig, *, seq_len: int) -> Problems:
    if data.path is None and data.name != "embedded":
        return [("data.path", f"data={data.name} needs data.path=FILE_OR_FOLDER (.txt, a folder of .txt, or .jsonl)")]
    found = [] if data.path is None else _data_path_problems(data.path)
    tokenizer_readable = data.tokenizer is None or _readable_tokenizer(data.tokenizer)
    if not found and tokenizer_readable:  # an unreadable tokenizer is vocab_problems' to report
        # Reads (and tokenizes) the data once per sweep (cached on the files' size and mtime), as the ranks will.
        problem = corpus_problem(
            data.path, data.text_field, seq_len=seq_len, packing=data.packing, tokenizer=data.tokenizer
        )
        found += [("data.path", problem)] if problem else []
    return found


def _readable_tokenizer(path: str) -> bool:
    try:
        tokenizer_vocab_size(path)
    except CorpusError:
        return False
    return True


def _data_path_problems(given: str) -> Problems:
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


def cost_problems(cfg: DictConfig) -> Problems:
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
    if cfg.cost.warmup_steps >= cfg.train.steps:
        found.append(
            (
                "cost.warmup_steps",
                f"cost.warmup_steps={cfg.cost.warmup_steps} must be < train.steps={cfg.train.steps}",
            )
        )
    return found


def _fault_problems(cfg: DictConfig) -> Problems:
    fault = cfg.fault
    if fault.kind not in FAULT_KINDS:
        return [("fault.kind", f"fault.kind={fault.kind} is not a fault; valid: {', '.join(FAULT_KINDS)}")]
    if fault.kind == "none":
        return []
    found = []  # a cost job reads no fault.* (`runner.sweep.ignored`)
    if fault.rank >= cfg.world_size:
        found.append(
            (
                "fault.rank",
                f"fault.rank={fault.rank} is not a rank of world_size={cfg.world_size}; valid: 0 to {cfg.world_size - 1}",
            )
        )
    if fault.step > cfg.train.steps:
        found.append(
            (
                "fault.step",
                f"fault.step={fault.step} is not a step of train.steps={cfg.train.steps}; valid: 1 to {cfg.train.steps}",
            )
        )
    return found


def custom_problems(cfg: DictConfig) -> Problems:
    """reduction=custom needs an importable callable fn(logits, labels, ctx), and a readable `custom.expect`."""
    if cfg.reduction.value != "custom":
        return []  # custom.* is ignored by the other modes
    found = []
    if cfg.custom.fn is None:
        found.append(
            ("custom.fn", "reduction=custom needs custom.fn=MODULE:CALLABLE, e.g. runner.trainers.megatron:per_token")
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


def known_bug_problems(cfg: DictConfig) -> Problems:
    """A known bug (conf/bug/NAME.yaml) names both arms' rules, and each arm's expectation is readable."""
    found = []
    for key in ("evidence", "evidence_source"):
        if cfg.known_bug.name is not None and cfg.known_bug.get(key) is None:
            kinds = ", ".join(kind.value for kind in Evidence)
            what = f"one of {kinds}" if key == "evidence" else "where to rerun it (a test, a release and its lines)"
            found.append((f"known_bug.{key}", f"known_bug.name={cfg.known_bug.name} needs known_bug.{key}: {what}"))
    for arm in ("buggy", "fixed"):
        given = cfg.known_bug[arm]
        if cfg.known_bug.name is not None and given.fn is None:
            found.append(
                (
                    f"known_bug.{arm}.fn",
                    f"known_bug.name={cfg.known_bug.name} needs known_bug.{arm}.fn=MODULE:CALLABLE, the {arm} arm's rule",
                )
            )
        try:
            custom_expectation(given.expect, cfg.world_size)
        except ValueError as error:
            found.append((f"known_bug.{arm}.expect", f"known_bug.{arm}.expect={given.expect}: {error}"))
        if given.get("grad_norm") is not None:
            try:
                grad_norm_factor(given.grad_norm)
            except ValueError as error:
                found.append((f"known_bug.{arm}.grad_norm", f"known_bug.{arm}.grad_norm={given.grad_norm}: {error}"))
    return found


def schema_problems(error: Exception) -> Problems:
    """The (field, message) of an OmegaConf error about a key or value the schema does not take
    (a key added with `+`, say), with the closest valid keys."""
    key = str(getattr(error, "full_key", "") or "") or "config"
    keys, _ = schema_keys()
    close = difflib.get_close_matches(key, sorted(keys), n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    reason = str(getattr(error, "msg", error)).splitlines()[0]
    return [(key, f"{key}: {reason}{hint} (`python -m runner --cfg job` shows every key)")]
