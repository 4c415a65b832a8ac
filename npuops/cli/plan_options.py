"""The flags plan and launch share, made from the core's declarations (npuops/plan/fields.py).

The model argument, then the request's own fields (npuops/plan/request.py), the workload's and the vLLM options an
operator may fix (npuops/plan/server_options.py): each flag's name, help, type and limits come from its field, so
a limit is written once. This is the only place that turns them into click options.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from typing import Any

import click

from npuops.plan.fields import Limits, UserFlag, flagged_fields, limits_of
from npuops.plan.inputs import PlanRequest, Workload
from npuops.plan.server_options import ServerOptions

F = Callable[..., Any]


def _click_type(kind: Any, limits: Limits | None) -> Any:
    if limits is not None and limits.choices:
        return click.Choice(list(limits.choices))
    low = limits.minimum if limits else None
    high = limits.maximum if limits else None
    if kind is int:
        return click.IntRange(None if low is None else int(low), None if high is None else int(high))
    if kind is float:
        return click.FloatRange(low, high, min_open=bool(limits and limits.minimum_open))
    return str


def _base_type(annotation: Any) -> Any:
    """int for `int | None`, and so on."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    return args[0] if args else annotation


def _option(f: dataclasses.Field[Any], flag: UserFlag, kind: Any) -> Callable[[F], F]:
    name = f"--{flag.name}"
    if kind is bool:
        return click.option(name, is_flag=True, help=flag.help)
    has_default = f.default is not dataclasses.MISSING and f.default is not None
    return click.option(name, type=_click_type(kind, limits_of(f)), help=flag.help,
                        default=f.default if has_default else None, show_default=has_default)


def declared_type(cls: type[Any], name: str) -> Any:
    """The click type of one declared field (another command's flag for the same value keeps its limits)."""
    hints = typing.get_type_hints(cls)
    field = next(f for f in dataclasses.fields(cls) if f.name == name)
    return _click_type(_base_type(hints[name]), limits_of(field))


def declared_options(cls: type[Any]) -> list[Callable[[F], F]]:
    """A click option for each of `cls`'s declared flags, in field order."""
    hints = typing.get_type_hints(cls)
    return [_option(f, flag, _base_type(hints[f.name])) for f, flag in flagged_fields(cls)]


PLAN_FLAGS: list[Callable[[F], F]] = [
    click.argument("model"),
    *declared_options(PlanRequest),
    *declared_options(Workload),
    *declared_options(ServerOptions),
]


def plan_flags(func: F) -> F:
    for decorator in reversed(PLAN_FLAGS):
        func = decorator(func)
    return func


def plan_flags_model_optional(func: F) -> F:
    """The plan flags with MODEL optional (launch takes it from --tuned FILE)."""
    decorators: list[Callable[[F], F]] = [click.argument("model", required=False), *PLAN_FLAGS[1:]]
    for decorator in reversed(decorators):
        func = decorator(func)
    return func


def plan_override_flags(func: F) -> F:
    """The plan flags without MODEL, plus --model DIR: what a rollout changes of the revision serving now."""
    decorators: list[Callable[[F], F]] = [
        click.option("--model", help="The new model directory (it keeps serving under the name clients use)."),
        *PLAN_FLAGS[1:]]
    for decorator in reversed(decorators):
        func = decorator(func)
    return func


def request_from_flags(flags: dict[str, Any]) -> PlanRequest:
    """The request from a command's plan flags."""
    return PlanRequest.from_flags(flags["model"], flags)
