"""Commands whose implementation lands with later issues: they exist, say so, and exit 2."""

from __future__ import annotations

import click

from npuops.errors import NotYetError

_LATER = {"ignore_unknown_options": True, "allow_extra_args": True}


def _not_yet(name: str, issue: str) -> click.Command:
    @click.command(name=name, context_settings=_LATER, help=f"Not available yet: lands with the {issue} work.")
    @click.pass_context
    def command(ctx: click.Context) -> None:
        raise NotYetError(f"`npuops {name}` is not available in this version", f"it lands with the {issue} work")

    return command


provision = _not_yet("provision", "provision")
