"""The config schema's keys and values, for tests generated from it."""

from __future__ import annotations

import dataclasses
import typing
from enum import Enum

from runner.config import RunConfig
from runner.ranges import unoptional


def leaves(cls: type = RunConfig, prefix: str = "") -> dict[str, type]:
    """Every leaf key of the schema (dotted), with its type."""
    found = {}
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        kind = unoptional(hints[field.name])
        if dataclasses.is_dataclass(kind):
            found.update(leaves(kind, f"{prefix}{field.name}."))
        else:
            found[f"{prefix}{field.name}"] = kind
    return found


def another_value(kind: type, value):
    """A value of the key's type other than `value` (valid or not: a quick try sets such values)."""
    if kind is bool:
        return not value
    if isinstance(kind, type) and issubclass(kind, Enum):
        return next(member for member in kind if member != value)
    if kind in (int, float):
        return (value or 1) * 2
    if kind is str:
        return f"{value}_other" if value else "other"
    if typing.get_origin(kind) is list:
        return ["sum", "local", "detached"]
    if typing.get_origin(kind) is dict or kind is dict:
        return {"num_hidden_layers": 3}
    raise AssertionError(f"no other value for {kind}")
