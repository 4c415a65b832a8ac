"""The effect of the CANN/NNAL set_env.sh scripts, captured so a systemd unit can carry it.

systemd does not source shell scripts, so we run them in a clean shell and keep what changed.
The script paths are passed as positional arguments to a fixed shell program: never interpolated.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from npuops.hardware.probe import Probe

# A clean, fixed environment for the capture, so the result does not depend on the caller's shell.
_CLEAN_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C", "HOME": "/root"}
_SOURCE_ALL = 'for f in "$@"; do . "$f" >/dev/null 2>&1 || exit 3; done; env -0'


def parse_env0(text: str) -> dict[str, str]:
    """`env -0` output: NUL-separated NAME=value entries."""
    values: dict[str, str] = {}
    for entry in text.split("\0"):
        name, sep, value = entry.partition("=")
        if sep and name and "\n" not in name:
            values[name] = value
    return values


def env_changes(before: Mapping[str, str], after: Mapping[str, str]) -> dict[str, str]:
    """Variables the scripts set or changed (the shell's own bookkeeping left out)."""
    ignored = {"_", "SHLVL", "PWD", "OLDPWD"}
    return {k: v for k, v in after.items() if k not in ignored and before.get(k) != v}


def capture_set_env(probe: Probe, scripts: Sequence[str]) -> tuple[dict[str, str], str | None]:
    """Run the scripts in a clean bash and return (changed variables, error or None)."""
    if not scripts:
        return {}, None
    host_scripts = [str(probe.settings.host_path(s)) for s in scripts]
    base = probe.runner.run(["/bin/bash", "--noprofile", "--norc", "-c", _SOURCE_ALL, "npuops"],
                            timeout=probe.settings.command_timeout_s, env=_CLEAN_ENV)
    after = probe.runner.run(["/bin/bash", "--noprofile", "--norc", "-c", _SOURCE_ALL, "npuops", *host_scripts],
                             timeout=probe.settings.command_timeout_s, env=_CLEAN_ENV)
    if not base.ok:
        return {}, base.describe()
    if not after.ok:
        return {}, f"sourcing {', '.join(scripts)} failed: {after.describe()}"
    return env_changes(parse_env0(base.stdout), parse_env0(after.stdout)), None
