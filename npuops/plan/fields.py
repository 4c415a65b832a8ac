"""Declared fields: a value's limits and the flag an operator sets it with, kept in a dataclass field's metadata.

One declaration serves three readers: the dataclass checks its own values (`check_fields`, from `__post_init__`),
the CLI turns the declarations into its options (npuops/cli/plan_options.py: the only place that knows click), and
the explanations quote the same limits. So a limit lives in one place, the way vLLM's `EngineArgs` is the one
source of its flags.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from npuops.errors import BadInputError

LIMITS_KEY = "npuops.limits"
FLAG_KEY = "npuops.flag"


@dataclass(frozen=True)
class Limits:
    """What values a field accepts. Numbers: `minimum`/`maximum` (inclusive unless `*_open`); text: `choices`,
    with `aliases` that are accepted and replaced by what they stand for."""

    minimum: float | None = None
    maximum: float | None = None
    minimum_open: bool = False
    choices: tuple[str, ...] = ()
    aliases: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def describe(self) -> str:
        if self.choices:
            return "one of " + ", ".join(self.choices)
        low = None if self.minimum is None else f"{'above' if self.minimum_open else 'at least'} {self.minimum:g}"
        high = None if self.maximum is None else f"at most {self.maximum:g}"
        if low and high and not self.minimum_open:
            return f"a value from {self.minimum:g} to {self.maximum:g}"
        return " and ".join(p for p in (low, high) if p) or "any value"

    def admit(self, value: Any, flag: str) -> Any:
        """The value as the field keeps it (an alias replaced), or BadInputError naming the flag and the limit."""
        if self.choices:
            text = str(value).strip()
            text = self.aliases.get(text.lower(), text)
            if text not in self.choices:
                raise BadInputError(f"{flag} {value!r}", f"use {self.describe()}")
            return text
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise BadInputError(f"{flag} {value!r} is not a number", f"use {self.describe()}")
        below = self.minimum is not None and (value <= self.minimum if self.minimum_open else value < self.minimum)
        above = self.maximum is not None and value > self.maximum
        if below or above:
            raise BadInputError(f"{flag} {value:g}", f"use {self.describe()}")
        return value


@dataclass(frozen=True)
class UserFlag:
    """The `npuops plan`/`launch` flag that sets a field; `name` without the dashes."""

    name: str
    help: str


def declared(*, limits: Limits | None = None, flag: UserFlag | None = None, default: Any = None,
             **metadata: Any) -> Any:
    """A dataclass field with its limits and flag (and further metadata, e.g. a vLLM option's name)."""
    meta: dict[str, Any] = dict(metadata)
    if limits is not None:
        meta[LIMITS_KEY] = limits
    if flag is not None:
        meta[FLAG_KEY] = flag
    return field(default=default, metadata=meta)


def limits_of(f: dataclasses.Field[Any]) -> Limits | None:
    limits = f.metadata.get(LIMITS_KEY)
    return limits if isinstance(limits, Limits) else None


def flag_of(f: dataclasses.Field[Any]) -> UserFlag | None:
    flag = f.metadata.get(FLAG_KEY)
    return flag if isinstance(flag, UserFlag) else None


def flagged_fields(cls: type[Any]) -> Iterator[tuple[dataclasses.Field[Any], UserFlag]]:
    """The fields of a dataclass an operator sets by flag, in declaration order."""
    for f in dataclasses.fields(cls):
        flag = flag_of(f)
        if flag is not None:
            yield f, flag


def check_fields(instance: Any, flag_name: Any = None) -> None:
    """Check every set (non-None) value of a frozen dataclass against its limits; aliases are replaced in place.
    `flag_name(field)` names a field in errors (default: its user flag, else its name)."""
    for f in dataclasses.fields(instance):
        limits = limits_of(f)
        value = getattr(instance, f.name)
        if limits is None or value is None or isinstance(value, bool):
            continue
        flag = flag_of(f)
        shown = flag_name(f) if flag_name else (f"--{flag.name}" if flag else f.name)
        admitted = limits.admit(value, shown)
        if admitted != value:
            object.__setattr__(instance, f.name, admitted)
