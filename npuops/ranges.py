"""Device lists as operators write them: "0-3", "0,2,4-5" (--devices of plan, launch and doctor)."""

from __future__ import annotations

import re

from npuops.errors import BadInputError

# More NPUs than any Ascend server holds (an A3 super node's 16 chips are 32 dies; a 384-chip pod is many nodes).
MAX_DEVICES = 64


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
        # Bounded before anything is expanded: "0-99999999999" would otherwise fill the memory first.
        bound = available if available is not None else MAX_DEVICES
        if last >= bound:
            raise BadInputError(
                f"device list {text!r}: device {last} does not exist on a {bound}-device node"
                if available is not None else f"device list {text!r}: device {last} is beyond any node's "
                f"{MAX_DEVICES} devices", f"use ids 0-{bound - 1}")
        ids.extend(range(first, last + 1))
    if len(set(ids)) != len(ids):
        raise BadInputError(f"device list {text!r} names a device twice", "list each device once")
    return tuple(sorted(ids))
