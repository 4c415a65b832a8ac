"""The flags every fleet command shares (`-i/--inventory`, `--host`, `--limit`, `--group`, `--forks`,
`--artifacts`), where a run keeps its artifacts, and its progress on stderr: one definition for node, doctor,
provision, launch and the group commands."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import click

F = Callable[..., Any]

INVENTORY = click.option("-i", "--inventory", type=click.Path(path_type=Path),
                         help="Ansible inventory: the hosts to work on (a file or directory Ansible reads).")
HOSTS = click.option("--host", "hosts", multiple=True,
                     help="A host to work on over Ansible (repeatable); localhost uses a local connection.")
LIMIT = click.option("--limit", help="Ansible host pattern to limit the inventory to.")
GROUP = click.option("--group", help="With -i: the inventory group that serves one instance together (its first "
                                     "host is the Ray head or data-parallel leader).")
FORKS = click.option("--forks", type=click.IntRange(1, 500), default=10, show_default=True,
                     help="With -i/--host: hosts worked on in parallel.")
ARTIFACTS = click.option("--artifacts", type=click.Path(file_okay=False, path_type=Path),
                         help="Where to keep the Ansible runs' artifacts [default: /var/lib/npuops/ansible as root, "
                              "else $XDG_STATE_HOME/npuops/ansible or ~/.local/state/npuops/ansible].")


def fleet_flags(*options: Callable[[F], F]) -> Callable[[F], F]:
    """Apply shared flags in the order given (the order `--help` shows)."""

    def apply(func: F) -> F:
        for option in reversed(options):
            func = option(func)
        return func

    return apply


def artifacts_dir(settings: Any, given: Path | None) -> Path:
    """--artifacts, else the default for this user."""
    from npuops.fleet.runner import default_artifacts_dir

    return given or default_artifacts_dir(settings.environ, is_root=os.geteuid() == 0)


def playbook_progress(*, tasks: bool = True, results: Collection[str] | None = None, changed_as_ok: bool = False,
                      quiet: bool = False) -> Any:
    """The progress printer of a fleet command (stderr, so stdout keeps the one document); None when `quiet`."""
    from npuops.fleet.progress import RESULTS, PlaybookProgress

    if quiet:
        return None
    return PlaybookProgress(sys.stderr, tasks=tasks, results=RESULTS if results is None else results,
                            changed_as_ok=changed_as_ok)


def local_npuops(hosts: Collection[str]) -> str | None:
    """This very npuops, when every host named is this machine (--host localhost); else None: the inventory says."""
    if hosts and all(h in ("localhost", "127.0.0.1") for h in hosts):
        return str(Path(sys.executable).parent / "npuops")
    return None
