"""Progress of an Ansible run as it happens: one line per task started and per host result, on a stream (stderr).

The one printer every fleet command uses (provision, the fleet doctor, node facts, group launch/status/stop/logs);
each says which results it shows.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TextIO

from npuops.fleet.events import PlaybookEvent

RESULTS = ("ok", "changed", "failed", "unreachable")
PROBLEMS = ("failed", "unreachable")


@dataclass
class PlaybookProgress:
    """`... TASK` per task started (when `tasks`), `  HOST: RESULT (why)` per host result of the kinds in `results`,
    followed by the result's `--diff` as a unified diff; `changed_as_ok` reports a change as ok (read-only runs,
    where a change is only Ansible's bookkeeping)."""

    out: TextIO
    tasks: bool = True
    results: Collection[str] = RESULTS
    changed_as_ok: bool = False

    def __call__(self, event: PlaybookEvent) -> None:
        if event.kind == "task_start":
            if self.tasks:
                self.out.write(f"... {event.task}\n")
        elif event.kind in self.results and event.host:
            kind = "ok" if self.changed_as_ok and event.kind == "changed" else event.kind
            why = f" ({event.message.splitlines()[0][:160]})" if kind in PROBLEMS and event.message else ""
            self.out.write(f"  {event.host}: {kind}{why}\n")
            for line in diff_lines(event.diff):
                self.out.write(f"    {line}\n")
        else:
            return
        self.out.flush()


def diff_lines(diffs: Collection[Mapping[str, Any]]) -> Iterator[str]:
    """A result's `--diff` (Ansible's before/after texts) as unified diff lines. Pure."""
    for diff in diffs:
        before, after = diff.get("before"), diff.get("after")
        if not isinstance(before, str) or not isinstance(after, str):
            continue
        yield from (line.rstrip("\n") for line in difflib.unified_diff(
            before.splitlines(keepends=True), after.splitlines(keepends=True),
            fromfile=str(diff.get("before_header") or "before"), tofile=str(diff.get("after_header") or "after")))
