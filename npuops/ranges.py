"""Device lists as operators write them: "0-3", "0,2,4-5"."""

from __future__ import annotations

import re

from npuops.errors import BadInputError


def parse_device_ranges(text: str) -> tuple[int, ...]:
    ids: list[int] = []
    for part in text.split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d{1,5})(?:-(\d{1,5}))?", part)
        if not m:
            raise BadInputError(f"device list {text!r}: {part!r} is not N or N-M", "write devices like 0-3 or 0,2,4-5")
        first, last = int(m.group(1)), int(m.group(2) or m.group(1))
        if last < first:
            raise BadInputError(f"device list {text!r}: range {part} is reversed", f"write it as {last}-{first}")
        ids.extend(range(first, last + 1))
    if len(set(ids)) != len(ids):
        raise BadInputError(f"device list {text!r} names a device twice", "list each device once")
    return tuple(ids)
