"""Run one playbook through ansible-runner: `run_playbook` checks its inputs, starts ansible-playbook, hands each
typed event (events.py) to the caller as it happens and returns the per-host results (host_results.py).

It is the only part of the fleet code that starts a process. ansible_runner is imported inside `run_playbook`, so
importing this module (and `npuops --help`) stays cheap.
"""

from __future__ import annotations

import math
import os
import shlex
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from npuops.errors import BadInputError, EnvironmentMissingError
from npuops.fleet.events import PlaybookEvent
from npuops.fleet.host_results import EventCollector, PlaybookRun
from npuops.fleet.inventory import host_argument_problem, read_inventory
from npuops.resources import shipped_dir

# `--host localhost` means this machine over a local connection. The interpreter is the one
# running ansible-playbook: discovery would otherwise pick whatever `python3` is first on PATH
# (a pyenv shim on some machines) and fail.
LOCALHOST = "localhost"
LOCALHOST_VARS: Mapping[str, str] = {
    "ansible_connection": "local",
    "ansible_python_interpreter": "{{ ansible_playbook_python }}",
}

# Environment for every run, on top of the caller's process environment (ansible-runner copies it).
BASE_ENVVARS: Mapping[str, str] = {
    # An unparsable inventory must stop the run; by default Ansible warns and carries on with an
    # empty inventory, which would look like a fleet where nothing was wrong.
    "ANSIBLE_INVENTORY_UNPARSED_FAILED": "True",
    # Error text travels in `verbose` events and the artifacts; colour codes would only garble it.
    "ANSIBLE_NOCOLOR": "True",
    # A failed run must never write a .retry file beside a playbook inside an installed package.
    "ANSIBLE_RETRY_FILES_ENABLED": "False",
}

# --- inputs ---------------------------------------------------------------------------------------


def resolve_playbook(playbook: str) -> Path:
    """A shipped playbook by name (`node-facts` or `node-facts.yml`), or a path to a playbook file."""
    if not playbook:
        raise BadInputError("no playbook given", "name a playbook shipped with npuops, e.g. node-facts.yml")
    if "/" in playbook or playbook.startswith("."):
        path = Path(playbook).expanduser()
        if not path.is_file():
            raise BadInputError(f"playbook {playbook} does not exist", "pass the path of an existing playbook file")
        return path.resolve()
    shipped = shipped_dir("playbooks")
    for name in (playbook, f"{playbook}.yml", f"{playbook}.yaml"):
        if (shipped / name).is_file():
            return (shipped / name).resolve()
    known = sorted(p.name for p in shipped.glob("*.yml"))
    raise BadInputError(f"npuops ships no playbook named {playbook!r}",
                        f"use one of: {', '.join(known) or '(none installed)'}")


def _check_hosts(hosts: Sequence[str]) -> list[str]:
    if isinstance(hosts, str):
        # A bare string is a caller's bug (an inventory path not wrapped in Path, or one host not in
        # a list); guessing which would run the playbook on the wrong machines.
        raise TypeError("hosts must be a list of host names; pass an inventory file as a Path")
    unique: list[str] = []
    for host in hosts:
        problem = host_argument_problem(host)
        if problem is not None:
            raise BadInputError(f"--host {host!r} is not a host name or address: it {problem}",
                                "give a DNS name or IP address per --host, or use an inventory file with -i")
        if host not in unique:
            unique.append(host)
    if not unique:
        raise BadInputError("no hosts given", "name hosts with --host, or pass an inventory file with -i")
    return unique


def hosts_inventory(hosts: Sequence[str]) -> dict[str, Any]:
    """The inventory for hosts named on the command line. `localhost` is this machine, locally. Pure."""
    return {"all": {"hosts": {h: dict(LOCALHOST_VARS) if h == LOCALHOST else {} for h in _check_hosts(hosts)}}}


def _check_inventory(inventory: Path) -> Path:
    path = Path(inventory).expanduser()
    if not path.exists():
        raise BadInputError(f"inventory {inventory} does not exist",
                            "pass an existing inventory file or directory with -i, or name hosts with --host")
    if not os.access(path, os.R_OK):
        raise BadInputError(f"inventory {inventory} is not readable", "fix its permissions")
    # Host names become paths and arguments here (fetched files, --limit): checked before any host is touched.
    read_inventory(path)
    return path.resolve()


def _check_options(limit: str | None, extravars: Mapping[str, Any], tags: Sequence[str] | None, forks: int) -> None:
    if limit is not None and not limit.strip():
        raise BadInputError("--limit is empty", "give a host pattern to --limit, or leave it out")
    for key in extravars:
        if not isinstance(key, str) or not key.isidentifier():
            raise BadInputError(f"extra variable name {key!r} is not a valid Ansible variable name",
                                "use letters, digits and underscores, not starting with a digit")
    for tag in tags or ():
        if not tag or "," in tag or tag != tag.strip():
            raise BadInputError(f"tag {tag!r} is not a tag name",
                                "give tags as separate names, e.g. --tags driver,cann")
    if isinstance(forks, bool) or not isinstance(forks, int) or forks < 1:
        raise BadInputError(f"--forks {forks!r} is not a positive number", "pass --forks 1 or more")


def default_ansible_playbook() -> Path:
    """The ansible-playbook installed beside this interpreter: it works in a venv that is not on PATH,
    and it is the ansible-core npuops was installed with."""
    return Path(sys.executable).parent / "ansible-playbook"


def _check_ansible_playbook(binary: Path | None) -> Path:
    path = binary if binary is not None else default_ansible_playbook()
    if not path.is_file() or not os.access(path, os.X_OK):
        raise EnvironmentMissingError(
            f"ansible-playbook not found at {path}",
            f"install ansible-core into npuops' environment: {sys.executable} -m pip install "
            "'ansible-core>=2.19,<2.20' 'ansible-runner==2.4.*'",
        )
    return path


def default_artifacts_dir(environ: Mapping[str, str], *, is_root: bool) -> Path:
    """Where run artifacts (events, stdout) are kept unless the user says: /var/lib for root,
    the XDG state directory otherwise. Pure: the CLI passes its captured environment."""
    if is_root:
        return Path("/var/lib/npuops/ansible")
    state = environ.get("XDG_STATE_HOME")
    if state:
        return Path(state) / "npuops" / "ansible"
    home = environ.get("HOME")
    if home:
        return Path(home) / ".local" / "state" / "npuops" / "ansible"
    raise EnvironmentMissingError("no place for Ansible run artifacts: neither XDG_STATE_HOME nor HOME is set",
                                  "set HOME, or pass an artifacts directory")


def _new_ident(playbook: Path) -> str:
    # Sortable by time and readable in `ls`; the random tail keeps two runs in one second apart.
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{playbook.stem}-{uuid.uuid4().hex[:6]}"


def _import_ansible_runner() -> Any:
    try:
        import ansible_runner  # type: ignore[import-untyped]  # ships no type information
    except ImportError:
        raise EnvironmentMissingError(
            "ansible-runner is not installed in npuops' environment",
            f"{sys.executable} -m pip install 'ansible-runner==2.4.*' 'ansible-core>=2.19,<2.20'",
        ) from None
    return ansible_runner


# --- running --------------------------------------------------------------------------------------


def run_playbook(
    playbook: str,
    *,
    inventory: Path | Sequence[str],
    artifacts_dir: Path,
    limit: str | None = None,
    extravars: Mapping[str, Any] | None = None,
    tags: Sequence[str] | None = None,
    check: bool = False,
    diff: bool = False,
    forks: int = 5,
    on_event: Callable[[PlaybookEvent], None] | None = None,
    timeout_s: float | None = None,
    envvars: Mapping[str, str] | None = None,
    ansible_playbook: Path | None = None,
) -> PlaybookRun:
    """Run `playbook` on `inventory` (an inventory file/directory, or host names as given with --host)
    and return what happened per host. `on_event` sees each PlaybookEvent as it happens.

    Expected problems (bad inventory, unknown playbook, missing ansible-playbook, a limit that
    matches nothing, a playbook Ansible rejects) raise NpuopsError with the problem and the fix.
    Failed and unreachable hosts do not raise: they are in the result.

    `timeout_s` bounds the whole run (status "timeout"); ansible-runner then kills ansible-playbook,
    but a module already running on a host (localhost included) finishes by itself, so a playbook
    bounds its own long tasks with the `timeout:` task keyword. If `on_event` raises, the run is
    cancelled and the exception re-raised once ansible-playbook has stopped.
    """
    playbook_path = resolve_playbook(playbook)
    extravars = dict(extravars or {})
    _check_options(limit, extravars, tags, forks)
    inventory_file = _check_inventory(inventory) if isinstance(inventory, Path) else None
    host_inventory = hosts_inventory(inventory) if not isinstance(inventory, Path) else None
    invocation = _Invocation(
        playbook=playbook_path, inventory_file=inventory_file, host_inventory=host_inventory, extravars=extravars,
        binary=_check_ansible_playbook(ansible_playbook), artifacts_dir=artifacts_dir,
        ident=_new_ident(playbook_path), limit=limit, tags=tuple(tags or ()), check=check, diff=diff, forks=forks,
        envvars={**BASE_ENVVARS, **(envvars or {})}, timeout_s=timeout_s)
    runner_api = _import_ansible_runner()
    try:
        artifacts_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadInputError(f"cannot create the artifacts directory {artifacts_dir}: {exc.strerror}",
                            "pass a directory you can write to") from None

    events = _EventForwarder(on_event)
    started = time.monotonic()
    result = _invoke(runner_api, invocation, events)
    if events.error is not None:
        raise events.error

    run = events.collector.finish(playbook=playbook_path, rc=int(result.rc if result.rc is not None else -1),
                                  status=str(result.status), artifacts=artifacts_dir / invocation.ident,
                                  duration_s=time.monotonic() - started)
    if not run.hosts and run.status not in ("timeout", "canceled"):
        _raise_for_hostless(run, limit, tags, inventory if isinstance(inventory, Path) else None)
    return run


@dataclass(frozen=True)
class _Invocation:
    """One checked ansible-playbook run, as ansible-runner is asked for it."""

    playbook: Path
    inventory_file: Path | None  # None: host_inventory, written to the run's private directory
    host_inventory: Mapping[str, Any] | None
    extravars: Mapping[str, Any]
    binary: Path
    artifacts_dir: Path
    ident: str
    limit: str | None
    tags: tuple[str, ...]
    check: bool
    diff: bool
    forks: int
    envvars: Mapping[str, str]
    timeout_s: float | None


class _EventForwarder:
    """ansible-runner's event handler and cancel callback: each raw event goes to the collector, and its typed
    event to the caller's `on_event`. An exception from `on_event` is kept (and cancels the run) so it can be
    raised once ansible-playbook has stopped cleanly."""

    def __init__(self, on_event: Callable[[PlaybookEvent], None] | None) -> None:
        self.collector = EventCollector()
        self.error: Exception | None = None
        self._on_event = on_event

    def handle(self, raw: dict[str, Any]) -> bool:
        event = self.collector.add(raw)
        if event is not None and self._on_event is not None and self.error is None:
            try:
                self._on_event(event)
            except Exception as exc:  # noqa: BLE001 - re-raised after the run is stopped cleanly
                self.error = exc
        return True  # keep every event in the artifacts

    def cancelled(self) -> bool:
        return self.error is not None


class _Unsafe(str):
    """A string Ansible must take as it is: written with YAML's `!unsafe` tag."""


class _ExtravarsDumper(yaml.SafeDumper):
    pass


# Every string double-quoted: YAML escapes there what a plain scalar would fold or break on (U+0085, control
# characters, a leading "*").
_ExtravarsDumper.add_representer(
    _Unsafe, lambda dumper, data: dumper.represent_scalar("!unsafe", str(data), style='"'))
_ExtravarsDumper.add_representer(
    str, lambda dumper, data: dumper.represent_scalar("tag:yaml.org,2002:str", data, style='"'))


# What Jinja reads as a template in a string.
_JINJA_MARKERS = ("{{", "{%", "{#")


def _mark_unsafe(value: Any) -> Any:
    # Only a string that holds a template gets `!unsafe`: ansible-core 2.19 resolves an `!unsafe` scalar's type
    # from its text despite the quotes ("1" became an int, "" None, "*" an error), and a string without Jinja
    # markers has nothing to template.
    if isinstance(value, str):
        return _Unsafe(value) if any(marker in value for marker in _JINJA_MARKERS) else value
    if isinstance(value, Mapping):
        return {str(k): _mark_unsafe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_mark_unsafe(v) for v in value]
    return value


def render_extravars(extravars: Mapping[str, Any]) -> str:
    """The extra-vars file: YAML in which every string value that holds a Jinja template carries `!unsafe`, so
    Ansible never evaluates it.
    Without it a value holding `{{ lookup('pipe', ...) }}` (an env value, a model directory's name, a rendered
    file's text) would run on the controller when a task uses it. Pure."""
    return yaml.dump(_mark_unsafe(dict(extravars)), Dumper=_ExtravarsDumper, sort_keys=False, allow_unicode=True,
                     width=2**30)


def _invoke(runner_api: Any, invocation: _Invocation, events: _EventForwarder) -> Any:
    """ansible_runner.run in a fresh private data dir: ansible-runner would otherwise reuse env/ files (cmdline,
    extravars) from an earlier run; suppress_env_files keeps it from writing them at all."""
    timeout_s = invocation.timeout_s
    with tempfile.TemporaryDirectory(prefix="npuops-ansible-") as private:
        private_dir = Path(private)
        inventory_file = invocation.inventory_file
        if invocation.host_inventory is not None:
            inventory_file = private_dir / "inventory.yml"
            inventory_file.write_text(yaml.safe_dump(dict(invocation.host_inventory), sort_keys=False),
                                      encoding="utf-8")
        # Extra vars go in a private file, not on the command line: `ps` and the artifacts' `command`
        # file would show them, and ansible-runner builds its -e JSON without escaping the keys.
        vars_file = private_dir / "extravars.yml"
        fd = os.open(vars_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle_file:
            handle_file.write(render_extravars(invocation.extravars))
        # With binary= ansible-runner appends no playbook itself; cmdline is split with shlex, so every
        # path is quoted. Nothing here goes through a shell.
        args = [str(invocation.playbook), "-e", f"@{vars_file}"]
        args += ["--check"] if invocation.check else []
        args += ["--diff"] if invocation.diff else []
        try:
            return runner_api.run(
                private_data_dir=str(private_dir),
                artifact_dir=str(invocation.artifacts_dir),
                ident=invocation.ident,
                binary=str(invocation.binary),
                cmdline=" ".join(shlex.quote(a) for a in args),
                inventory=str(inventory_file),
                limit=invocation.limit,
                tags=",".join(invocation.tags) if invocation.tags else None,
                forks=invocation.forks,
                envvars=dict(invocation.envvars),
                timeout=max(1, math.ceil(timeout_s)) if timeout_s else None,
                suppress_env_files=True,
                quiet=True,
                # ansible-runner looks at cancel and timeout only when its wait for output times out
                # (5 s by default): a second keeps a failed display or a timeout from lingering.
                settings={"pexpect_timeout": 1},
                event_handler=events.handle,
                cancel_callback=events.cancelled,
            )
        except runner_api.exceptions.AnsibleRunnerException as exc:
            artifacts = invocation.artifacts_dir / invocation.ident
            raise EnvironmentMissingError(f"ansible-runner could not run {invocation.playbook.name}: {exc}",
                                          f"see the artifacts in {artifacts}") from None


def _raise_for_hostless(run: PlaybookRun, limit: str | None, tags: Sequence[str] | None,
                        inventory: Path | None) -> None:
    """A run that reached no host because of its inputs is not what the caller wanted: say why in
    one line. (A playbook with nothing to do for anyone is left alone.)"""
    where = f"see {run.artifacts / 'stdout'}"
    if run.errors and inventory is not None and "inventory was parsed" in run.errors[0]:
        raise BadInputError(f"Ansible could not parse the inventory {inventory}",
                            f"check it with `ansible-inventory -i {inventory} --graph`; {where}")
    if run.errors:
        raise BadInputError(f"ansible-playbook stopped before running any task: {run.errors[0]}", where)
    if run.rc == 127:
        raise EnvironmentMissingError("ansible-playbook could not be started (rc 127)", where)
    if run.rc != 0:
        raise BadInputError(f"ansible-playbook failed before running any task (rc {run.rc})", where)
    if run.no_hosts_matched:
        scope = f" with --limit {limit}" if limit else ""
        raise BadInputError(f"no host in the inventory{scope} matches the hosts of {run.playbook.name}",
                            "check the inventory's groups and the --limit pattern (`ansible-inventory --graph -i ...`)")
    if tags:
        raise BadInputError(f"no task of {run.playbook.name} has the tags {','.join(tags)}",
                            f"list the playbook's tags with `ansible-playbook --list-tags {run.playbook}`")
