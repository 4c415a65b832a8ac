"""Device lists as operators write them: "0-3", "0,2,4-5" (--devices of plan, launch and doctor)."""

from __future__ import annotations

import re

from npuops.errors import BadInputError


def parse_device_list(text: str, available: int | None = None) -> tuple[int, ...]:
    """`0-3,6` -> (0, 1, 2, 3, 6). Ids are device (Phy-)ids; `available` bounds them when known."""
    ids: list[int] = []
    for part in text.split(","):
        item = part.strip()
        match = re.fullmatch(r"(\d+)(?:\s*-\s*(\d+))?", item)
        if match is None:
            raise BadInputError(
                f"device list {text!r}: {item!r} is not a device id or a range",
                "write ids and ranges separated by commas, e.g. 0-3,6",
            )
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) is not None else first
        if last < first:
            raise BadInputError(f"device list {text!r}: range {item} runs backwards", f"write {last}-{first}")
        ids.extend(range(first, last + 1))
    if len(set(ids)) != len(ids):
        raise BadInputError(f"device list {text!r} names a device twice", "list each device once")
    if available is not None:
        beyond = [i for i in ids if i >= available]
        if beyond:
            raise BadInputError(
                f"device list {text!r}: device {beyond[0]} does not exist on a {available}-device node",
                f"use ids 0-{available - 1}",
            )
    return tuple(sorted(ids))
