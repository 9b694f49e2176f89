"""The objective's rules (objective=pg: `runner.data.responses`), and the post-training fields of a custom rule,
checked before launch; each message names the field and a valid value."""

from __future__ import annotations

from omegaconf import DictConfig

from runner.modes import layout_expectation, unit_problem
from runner.sweep.model_rules import Problems


def objective_problems(cfg: DictConfig) -> Problems:
    """objective=pg builds its own rows: groups that fill the batch, and a prompt and its longest response within
    train.seq_len (data.packing and data.valid_tokens, which it does not read, are refused as unread:
    `runner.sweep.ignored`). A custom rule's `expect_layouts` and `weighs` readable."""
    found = _custom_problems(cfg) if cfg.reduction.value == "custom" else []
    objective = cfg.objective
    if objective.name.value != "pg":
        return found
    batch, group = cfg.train.global_batch, objective.group_size
    if batch % group:
        found.append(
            (
                "objective.group_size",
                f"objective.group_size={group} must divide train.global_batch={batch} (whole groups of responses "
                f"per prompt), e.g. objective.group_size={_largest_divisor_up_to(batch, group)}",
            )
        )
    if objective.min_response > objective.max_response:
        found.append(
            (
                "objective.min_response",
                f"objective.min_response={objective.min_response} is above objective.max_response="
                f"{objective.max_response}",
            )
        )
    room = cfg.train.seq_len - objective.prompt_len
    if objective.max_response > room:
        found.append(
            (
                "objective.max_response",
                f"objective.prompt_len={objective.prompt_len} + objective.max_response={objective.max_response} "
                f"exceeds train.seq_len={cfg.train.seq_len}: objective.max_response={max(room, 1)} or less"
                + ("" if room >= 1 else f", and objective.prompt_len below {cfg.train.seq_len}"),
            )
        )
    return found


def _custom_problems(cfg: DictConfig) -> Problems:
    found = []
    custom = cfg.custom
    if custom.expect_layouts is not None:
        try:
            layout_expectation(custom.expect_layouts, 1, 1, 1)
        except ValueError as error:
            found.append(("custom.expect_layouts", f"custom.expect_layouts={custom.expect_layouts}: {error}"))
    if custom.weighs is not None and unit_problem(custom.weighs):
        found.append(("custom.weighs", f"custom.weighs={custom.weighs}: {unit_problem(custom.weighs)}"))
    return found


def _largest_divisor_up_to(n: int, limit: int) -> int:
    return max(d for d in range(1, min(n, limit) + 1) if n % d == 0)
