"""The Markdown page of each check (checks/docs/<id>.md): what it checks, why it matters, how to fix."""

from __future__ import annotations

from npuops.doctor.registry import discover_checks
from npuops.errors import BadInputError
from npuops.resources import shipped_dir


def explain_page(check_id: str) -> str:
    ids = {c.id for c in discover_checks()}
    if check_id not in ids:
        raise BadInputError(f"no check with id {check_id!r}", "list the ids with `npuops doctor --list`")
    page = shipped_dir("checks") / "docs" / f"{check_id}.md"
    try:
        return page.read_text(encoding="utf-8")
    except OSError:
        raise BadInputError(f"check {check_id!r} has no page at {page}", "reinstall npuops") from None
