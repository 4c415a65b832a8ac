"""The Markdown page of each check (checks/docs/<id>.md): what it checks, why it matters, how to fix."""

from __future__ import annotations

from pathlib import Path

from npuops.doctor.registry import discover_checks
from npuops.errors import BadInputError
from npuops.resources import shipped_dir


def doc_page(check_id: str) -> Path:
    """Where a check's page is (shipped beside the checks); every check has one (tests/doctor hold them to it)."""
    return shipped_dir("checks") / "docs" / f"{check_id}.md"


def explain_page(check_id: str) -> str:
    ids = {c.id for c in discover_checks()}
    if check_id not in ids:
        raise BadInputError(f"no check with id {check_id!r}", "list the ids with `npuops doctor --list`")
    page = doc_page(check_id)
    try:
        text = page.read_text(encoding="utf-8")
    except OSError:
        raise BadInputError(f"check {check_id!r} has no page at {page}", "reinstall npuops") from None
    return text.rstrip("\n") + "\n\n" + SUPPORT_NEXT


# Every page ends with the next step where its fixes do not help.
SUPPORT_NEXT = ("**If none of this fixes it.** `npuops collect` gathers the node model, this report, the instances' "
                "journals and logs,\nCANN's logs, kernel messages and the vendor tools' outputs into one bundle, "
                "secrets redacted, for a support case\n(`-i INVENTORY --group G` for every host of a serving "
                "group).\n")
