"""Valid ranges of the numeric config fields, declared beside each field and checked before launch.

A field is declared `lr: float = ranged(3e-3, gt=0)`. OmegaConf checks types;
`range_problems` checks every declared range of a config, walking its
dataclasses, so no value of a typed field reaches a rank and dies there. Every
numeric field must declare one (tests/test_ranges.py walks the dataclasses and
tries values outside and at the edges of each range). Rules that tie fields
together (sp divides world_size, fault.rank < world_size) live in
`runner.sweep.validate`.
"""

from __future__ import annotations

import dataclasses
import math
import types
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Union, get_args, get_origin, get_type_hints


@dataclass(frozen=True)
class Range:
    ge: float | None = None  # value >= ge
    gt: float | None = None  # value > gt
    le: float | None = None  # value <= le
    lt: float | None = None  # value < lt
    why: str = ""  # what the bound means, for the message

    def holds(self, value: float) -> bool:
        if isinstance(value, float) and not math.isfinite(value):
            return False  # no field takes nan or inf
        return (
            (self.ge is None or value >= self.ge)
            and (self.gt is None or value > self.gt)
            and (self.le is None or value <= self.le)
            and (self.lt is None or value < self.lt)
        )

    def describe(self) -> str:
        parts = [
            f"{symbol} {_number(bound)}"
            for symbol, bound in ((">=", self.ge), (">", self.gt), ("<=", self.le), ("<", self.lt))
            if bound is not None
        ]
        return " and ".join(parts) or "finite"


def _number(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else f"{value:,}".replace(",", "_")


def ranged(default: Any, *, ge=None, gt=None, le=None, lt=None, why: str = "") -> Any:
    """A dataclass field with `default` and a valid range (None: the field is off, always valid)."""
    return dataclasses.field(default=default, metadata={"range": Range(ge, gt, le, lt, why)})


def numeric_fields(cls: type, prefix: str = "") -> Iterator[tuple[str, type, Range | None, Any]]:
    """(dotted name, int or float, its declared Range or None, default) of every numeric field, nested ones too."""
    hints = get_type_hints(cls)
    for field in dataclasses.fields(cls):
        kind = unoptional(hints[field.name])
        if dataclasses.is_dataclass(kind):
            yield from numeric_fields(kind, f"{prefix}{field.name}.")
        elif kind in (int, float):
            default = field.default if field.default is not dataclasses.MISSING else None
            yield f"{prefix}{field.name}", kind, field.metadata.get("range"), default


def unoptional(hint: Any) -> Any:
    """int for Optional[int] (null switches the field off)."""
    if get_origin(hint) in (Union, types.UnionType):
        args = [a for a in get_args(hint) if a is not type(None)]
        return args[0] if len(args) == 1 else hint
    return hint


def value_at(cfg: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def range_problems(cfg: Any, schema: type) -> list[tuple[str, str]]:
    """(field, message) for every value of `cfg` outside its field's declared range in `schema`."""
    found = []
    for name, _, valid, _ in numeric_fields(schema):
        value = value_at(cfg, name)
        if valid is None or value is None or valid.holds(value):
            continue
        why = f" ({valid.why})" if valid.why else ""
        found.append((name, f"{name}={value} must be {valid.describe()}{why}"))
    return found
