"""Keys a job would not read: refused before launch with the reason, never recorded as if they had acted.

A key set away from its default (by the command line or a preset) is meaningless when the job's other
choices leave it unread: `autograd_all_reduce=identity` with a mode that has no all-reduce in its graph,
`custom.*` with a built-in mode, Adam's betas under SGD. Such a job is refused, naming the key and why, so
that no config.yaml holds a setting that never ran. `tests/test_ignored_keys.py` holds these rules to what
the ranks really read, key by key, for every mode and architecture.

The keys of one mode are set across a sweep's modes on purpose (`SWEPT_ON_PURPOSE`): `autograd_all_reduce`
(`-m reduction=sum,local autograd_all_reduce=funcol,identity`) and `custom.*` (`-m reduction=local,custom
custom.fn=...`). A job of a sweep that does not read them runs, the keys recorded as `ignored` in its
summary.json, and preflight says so once per sweep (`swept_notes`); a sweep in which no job reads them is
refused, and so is a single run that sets them.

`trainer=NAME` sets a trainer's rule (conf/trainer/NAME.yaml); a job whose config replaced any of its keys
(the default experiment's sweep of `reduction`, say) would run another rule under the trainer's name: it is
refused, with the command that runs the trainers' rules (`experiment=trainers`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from runner.config import RunConfig
from runner.data.corpus import has_fields
from runner.modes import has_graph_all_reduce
from runner.ranges import value_at
from runner.sweep.custom_check import custom_fn_facts
from runner.sweep.model_rules import other_architecture_fields
from runner.sweep.rerun import flat_config

Problems = list[tuple[str, str]]
# Keys that a sweep sets for some of its modes on purpose: `-m reduction=sum,local autograd_all_reduce=identity`,
# `-m reduction=local,custom custom.fn=...` (README, "Which differentiable all-reduce" and "Custom reductions").
# The custom.* keys, read by reduction=custom only.
CUSTOM_KEYS = (
    "custom.fn",
    "custom.fsdp_reduce",
    "custom.expect",
    "custom.rule",
    "custom.name",
    "custom.expect_layouts",
    "custom.weighs",
)
SWEPT_ON_PURPOSE = ("autograd_all_reduce", *CUSTOM_KEYS)


@dataclass(frozen=True)
class Rule:
    keys: tuple[str, ...]
    reads: Callable[[DictConfig], bool]  # whether the job reads these keys
    why: Callable[[DictConfig], str]  # why it does not, naming the choice that decides


def _modes(cfg: DictConfig) -> list[str]:
    """The modes whose gradients the job computes: its reduction, and a cost job's arms."""
    return [cfg.reduction.value] + [mode.value for mode in cfg.cost.modes]


def _rule_reads_autograd_all_reduce(cfg: DictConfig) -> bool:
    """Whether the job's custom rule declares graph_all_reduce="configured": its ctx.all_reduce then uses
    autograd_all_reduce (`runner.train.custom_rule`). Asked of the launcher's check of custom.fn, once per spec."""
    if cfg.reduction.value != "custom" or not cfg.custom.fn:
        return False
    return custom_fn_facts(cfg.custom.fn).get("graph_all_reduce") == "configured"


RULES = (
    Rule(
        ("autograd_all_reduce",),
        lambda cfg: (
            any(has_graph_all_reduce(mode) for mode in _modes(cfg) if mode != "custom")
            or _rule_reads_autograd_all_reduce(cfg)
        ),
        lambda cfg: (
            f'custom.fn={cfg.custom.fn} declares no graph_all_reduce="configured" (only such a rule\'s ctx.all_reduce '
            "reads it)"
            if cfg.reduction.value == "custom"
            else f"reduction={cfg.reduction.value} has no differentiable all-reduce in its graph (only sum has one)"
        ),
    ),
    Rule(
        CUSTOM_KEYS,
        lambda cfg: cfg.reduction.value == "custom",
        lambda cfg: f"reduction={cfg.reduction.value} is a built-in mode; custom.* is read by reduction=custom only",
    ),
    Rule(
        ("train.checkpoint_every",),
        lambda cfg: not cfg.cost.modes,
        lambda cfg: "a cost job measures the modes' step time and keeps no checkpoints",
    ),
    Rule(
        ("train.keep_checkpoints",),
        lambda cfg: not cfg.cost.modes and cfg.train.checkpoint_every > 0,
        lambda cfg: "train.checkpoint_every=0 saves no checkpoint (set it to keep some)",
    ),
    Rule(
        ("objective.group_size", "objective.prompt_len", "objective.min_response", "objective.max_response"),
        lambda cfg: cfg.objective.name.value == "pg",
        lambda cfg: f"objective={cfg.objective.name.value} trains on the documents' targets; objective=pg reads these",
    ),
    Rule(
        ("data.packing", "data.valid_tokens"),
        lambda cfg: cfg.objective.name.value == "ce",
        lambda cfg: "objective=pg builds each row as a prompt and a response whose tokens are all its targets",
    ),
    Rule(
        ("loss_parallel",),
        lambda cfg: cfg.tp > 1,
        lambda cfg: "tp=1 has no tensor-parallel logits to leave sharded (set tp > 1)",
    ),
    Rule(
        ("pp_schedule", "pp_microbatches", "pp_scale_grads"),
        lambda cfg: cfg.pp > 1,
        lambda cfg: "pp=1 has no pipeline schedule (set pp > 1)",
    ),
    Rule(
        ("optim.beta1", "optim.beta2", "optim.eps"),
        lambda cfg: cfg.optim.name.value == "adamw",
        lambda cfg: f"optim={cfg.optim.name.value} has no Adam moments (optim=adamw reads them)",
    ),
    Rule(
        ("optim.momentum",),
        lambda cfg: cfg.optim.name.value == "sgd",
        lambda cfg: f"optim={cfg.optim.name.value} has no SGD momentum (optim=sgd reads it)",
    ),
    Rule(
        ("fault.rank", "fault.step"),
        lambda cfg: cfg.fault.kind != "none",
        lambda cfg: "fault.kind=none injects no fault (set fault.kind=raise, exit, kill, hang or nan)",
    ),
    Rule(
        ("fault.kind", "fault.rank", "fault.step"),
        lambda cfg: not cfg.cost.modes,
        lambda cfg: "a cost job (cost.modes) injects no fault; fault injection needs a training job",
    ),
    Rule(
        ("cost.warmup_steps", "cost.floor_calls"),
        lambda cfg: bool(cfg.cost.modes),
        lambda cfg: "cost.modes is empty: this job trains, it measures no cost (experiment=cost does)",
    ),
    Rule(
        ("wandb.project", "wandb.entity", "wandb.log_every"),
        lambda cfg: cfg.wandb.mode.value != "disabled",
        lambda cfg: "wandb.mode=disabled starts no W&B run",
    ),
    Rule(
        ("metrics.sketch_seed",),
        lambda cfg: cfg.metrics.sketch_dim > 0,
        lambda cfg: "metrics.sketch_dim=0 takes no gradient sketch",
    ),
    Rule(
        ("metrics.count_first", "metrics.count_every"),
        lambda cfg: cfg.metrics.count_comm,
        lambda cfg: "metrics.count_comm=false counts no collectives",
    ),
    Rule(
        ("data.text_field",),
        lambda cfg: has_fields(cfg.data.path),
        lambda cfg: f"data.path={cfg.data.path} is not a .jsonl file (only JSONL records have fields)",
    ),
    Rule(
        (
            "metrics.sketch_dim",
            "metrics.sketch_seed",
            "metrics.count_comm",
            "metrics.count_first",
            "metrics.count_every",
            "metrics.gather_every",
        ),
        lambda cfg: not cfg.cost.modes,
        lambda cfg: (
            "a cost job (cost.modes) times the modes; it takes no gradient sketch, collective count or "
            "gathered step figures"
        ),
    ),
)


def _set(cfg: DictConfig, key: str, defaults: DictConfig) -> bool:
    return value_at(cfg, key) != value_at(defaults, key)


@functools.cache
def _defaults() -> DictConfig:
    """RunConfig's defaults, built once (each build deep-copies the schema: tens of ms) and read-only."""
    defaults = OmegaConf.structured(RunConfig)
    OmegaConf.set_readonly(defaults, True)
    return defaults


def _unread_by_rule(cfg: DictConfig, besides: tuple[str, ...] = ()) -> list[tuple[Rule, list[str]]]:
    defaults = _defaults()
    found = []
    for rule in RULES:
        if not rule.reads(cfg):
            unread = [key for key in rule.keys if key not in besides and _set(cfg, key, defaults)]
            if unread:
                found.append((rule, unread))
    return found


def unread_keys(cfg: DictConfig, *, besides: tuple[str, ...] = ()) -> Problems:
    """(key, message) for the keys set away from their defaults that this job would not read, one message per
    rule (`besides`: keys already explained, e.g. by `trainer_problems`)."""
    found = []
    for rule, unread in _unread_by_rule(cfg, besides):
        given = ", ".join(f"{key}={_brief(_shown(value_at(cfg, key)))}" for key in unread)
        verb = "is" if len(unread) == 1 else "are"
        found.append((unread[0], f"{given} {verb} not read by this job: {rule.why(cfg)}; drop {' and '.join(unread)}"))
    return found


def meaningless_keys(cfg: DictConfig) -> set[str]:
    """Every key this job refuses as unread: these rules' and the other architecture's model fields
    (`runner.sweep.model_rules.other_architecture_fields`)."""
    keys = {key for _, unread in _unread_by_rule(cfg) for key in unread}
    return keys | {field for field, _ in other_architecture_fields(cfg.model)}


def _brief(value: object, limit: int = 40) -> str:
    text = str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def ignored_key_problems(
    cfg: DictConfig, *, sweeping: bool, besides: tuple[str, ...] = ()
) -> tuple[Problems, Problems]:
    """(refused, ignored): the unread keys that refuse the job, and those a sweep sets on purpose (recorded)."""
    unread = unread_keys(cfg, besides=besides)
    if not sweeping:
        return unread, []
    return [p for p in unread if p[0] not in SWEPT_ON_PURPOSE], [p for p in unread if p[0] in SWEPT_ON_PURPOSE]


def swept_notes(jobs: list[tuple[int, DictConfig, Problems]]) -> tuple[list[str], Problems]:
    """Over a sweep's admitted jobs ((number, config, its ignored keys)): one line per key swept on purpose that
    some jobs ignore, and the problem of such a key that no job of the sweep reads (it is then refused)."""
    lines, problems = [], []
    for key in SWEPT_ON_PURPOSE:
        ignoring = [(number, cfg) for number, cfg, ignored in jobs if key in dict(ignored)]
        if not ignoring:
            continue
        rule = next(rule for rule in RULES if key in rule.keys)
        values = ",".join(sorted({_brief(_shown(value_at(cfg, key))) for _, cfg in ignoring}))
        modes = ",".join(sorted({cfg.reduction.value for _, cfg in ignoring}))
        numbers = ", ".join(f"#{number}" for number, _ in ignoring)
        said = f"{key}={values} is ignored by reduction={modes} ({rule.why(ignoring[0][1])})"
        lines.append(f"{said}: jobs {numbers} run without it")
        if not any(rule.reads(cfg) for _, cfg, _ in jobs):
            problems.append((key, f"{said}, and no job of this sweep reads it; drop it"))
    return lines, problems


def _shown(value: object) -> object:
    return value.value if hasattr(value, "value") else value


def trainer_keys(trainer: str | None, conf: Path) -> dict:
    """The keys conf/trainer/NAME.yaml sets, with their values ({} without a trainer)."""
    preset = conf / "trainer" / f"{trainer}.yaml"
    return flat_config(OmegaConf.to_container(OmegaConf.load(preset))) if trainer and preset.exists() else {}


def trainer_problems(cfg: DictConfig, trainer: str | None, *, conf: Path, sweeping: bool) -> Problems:
    """`trainer=NAME` whose rule this job's config replaced (a key of conf/trainer/NAME.yaml set otherwise)."""
    wanted = trainer_keys(trainer, conf)
    replaced = [(key, value) for key, value in wanted.items() if _as_set(cfg, key, value) != value]
    if not replaced:
        return []
    sets = ", ".join(f"{key}={value}" for key, value in replaced)
    has = ", ".join(f"{key}={_shown(value_at(cfg, key))}" for key, _ in replaced)
    how = (
        f"to sweep trainers' rules use experiment=trainers (python -m runner -m experiment=trainers trainer={trainer},...)"
        if sweeping
        else f"give trainer={trainer} without {', '.join(key for key, _ in replaced)}"
    )
    return [
        (
            "trainer",
            f"trainer={trainer} sets {sets}, but this job has {has}, so {trainer}'s rule would not run; {how}",
        )
    ]


def _as_set(cfg: DictConfig, key: str, preset_value: object) -> object:
    """The job's value of `key` as the preset would have set it: resolved, or, where the preset's value is an
    interpolation (`${runner_if_equal:...}`, resolved against the job's layout), the job's unresolved text."""
    if isinstance(preset_value, str) and "${" in preset_value and isinstance(cfg, DictConfig):
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(cfg, parent) if parent else cfg
        return OmegaConf.to_container(node, resolve=False).get(leaf) if isinstance(node, DictConfig) else None
    return _shown(value_at(cfg, key))
