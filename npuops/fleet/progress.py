"""Progress of an Ansible run as it happens: one line per task started and per host result, on a stream (stderr).

The one printer every fleet command uses (provision, the fleet doctor, node facts, group launch/status/stop/logs);
each says which results it shows.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import TextIO

from npuops.fleet.events import PlaybookEvent

RESULTS = ("ok", "changed", "failed", "unreachable")
PROBLEMS = ("failed", "unreachable")


@dataclass
class PlaybookProgress:
    """`... TASK` per task started (when `tasks`), `  HOST: RESULT (why)` per host result of the kinds in `results`;
    `changed_as_ok` reports a change as ok (read-only runs, where a change is only Ansible's bookkeeping)."""

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
        else:
            return
        self.out.flush()
