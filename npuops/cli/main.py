"""Entry point: a lazy click group, so `npuops --help` never imports what a command needs.

Subcommands live in modules named in COMMANDS and are imported only when run (as in vLLM's CLI
and pip's command table). Expected errors (NpuopsError) become one line and their exit code;
anything else is a bug and prints a traceback saying so.
"""

from __future__ import annotations

import difflib
import importlib
import os
import signal
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

import click

from npuops import __version__
from npuops.errors import ConfigError, ExitCode, NpuopsError
from npuops.settings import unknown_variables

# name -> (module:attribute, one-line help shown by --help without importing the module)
COMMANDS: dict[str, tuple[str, str]] = {
    "node": ("npuops.cli.node_cmd:node", "Show this node: NPUs, driver, CANN, Python stack, host."),
    "doctor": ("npuops.cli.doctor_cmd:doctor", "Health and precision checks with verdicts and fixes."),
    "plan": ("npuops.cli.plan_cmd:plan", "Work out a tuned vLLM configuration for a model."),
    "models": ("npuops.cli.models_cmd:models", "The model catalog plan knows by name."),
    "launch": ("npuops.cli.launch_cmd:launch", "Run vLLM as a supervised, health-gated service."),
    "rollout": ("npuops.cli.rollout_cmd:rollout", "Switch an instance to a new revision replica by replica."),
    "run": ("npuops.cli.run_cmd:run", "Supervise an instance's engine (what its unit runs)."),
    "status": ("npuops.cli.service_cmds:status", "State, health and live figures of launched instances."),
    "list": ("npuops.cli.service_cmds:list_", "The instances launched on this node."),
    "stop": ("npuops.cli.service_cmds:stop", "Stop a launched instance."),
    "remove": ("npuops.cli.service_cmds:remove", "Uninstall a stopped instance: its units and files."),
    "logs": ("npuops.cli.service_cmds:logs", "Show a launched instance's logs."),
    "profile": ("npuops.cli.profile_cmd:profile", "Profile a live instance with vLLM's profiler: where time goes."),
    "collect": ("npuops.cli.collect_cmd:collect", "Gather a support bundle (logs, reports, tool outputs), redacted."),
    "bench": ("npuops.cli.bench_cmd:bench", "Measure an instance with vLLM's own benchmark beside the plan."),
    "tune": ("npuops.cli.tune_cmd:tune", "Find the best batching for a model with real trials and benches."),
    "monitor": ("npuops.cli.monitor_cmd:monitor", "Prometheus targets and alert rules for this node's instances."),
    "golden": ("npuops.cli.golden_cmd:golden", "Record a served model's answers to check later runs against."),
    "provision": ("npuops.cli.provision_cmd:provision", "Install driver, CANN and the Python stack with Ansible."),
    "packages": ("npuops.cli.provision_cmd:packages", "Index the vendor packages provisioning installs (SHA256SUMS)."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple[str | None, click.Command | None,
                                                                         list[str]]:
        name = click.utils.make_str(args[0])
        if name not in COMMANDS and not name.startswith("-"):
            close = difflib.get_close_matches(name, list(COMMANDS), n=1, cutoff=0.6)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            ctx.fail(f"No such command {name!r}.{hint}")
        return super().resolve_command(ctx, args)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, _, attribute = target[0].partition(":")
        command = getattr(importlib.import_module(module_name), attribute)
        assert isinstance(command, click.Command)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Help text comes from the table, so listing commands imports none of them.
        with formatter.section("Commands"):
            formatter.write_dl([(name, short) for name, (_, short) in COMMANDS.items()])


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--config", "config_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              envvar="NPUOPS_CONFIG", help="Config file (TOML), read after /etc/npuops and ~/.config/npuops.")
@click.option("--ascend-root", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the Ascend driver and CANN are installed [default: /usr/local/Ascend].")
@click.version_option(__version__, prog_name="npuops")
@click.pass_context
def cli(ctx: click.Context, config_file: Path | None, ascend_root: Path | None) -> None:
    """npuops: from bare Ascend NPU servers to healthy vLLM endpoints.

    \b
    Exit codes: 0 ok, 1 checks failed, 2 usage, 3 bad input or config,
    4 something the command needs is missing here, 130 interrupted.
    """
    ctx.obj = {"config_file": config_file, "flags": {"ascend_root": ascend_root}}
    for variable in unknown_variables(os.environ):
        # A near miss before a command that may change the node is said once its subcommand is known.
        if not (variable.near_miss and _may_change_the_node(ctx.invoked_subcommand)):
            click.echo(f"npuops: warning: {variable.warning()}", err=True)


# Commands that change this node (its instances, units, packages, monitoring): before them an environment
# variable that looks like a misspelt setting is refused, not only warned about, since the setting it meant
# (where the state, the units or the service manager are) stays at its default and the change lands there.
CHANGES_THE_NODE = frozenset({"launch", "rollout", "stop", "remove", "provision", "tune", "monitor render",
                              "monitor doctor-timer"})


def _may_change_the_node(command: str | None) -> bool:
    return any(path.split()[0] == command for path in CHANGES_THE_NODE)


def _check_near_misses(ctx: click.Context) -> None:
    """Refuse a near miss of a setting's name before a command that changes the node; warn about it before the
    others that share its top-level name (`monitor targets`)."""
    root_ctx = ctx.find_root()
    if not _may_change_the_node(root_ctx.invoked_subcommand) or (root_ctx.obj or {}).get("near_misses_checked"):
        return
    if root_ctx.obj is not None:
        root_ctx.obj["near_misses_checked"] = True
    command = " ".join(ctx.command_path.split()[1:])
    near = [variable for variable in unknown_variables(os.environ) if variable.near_miss]
    if near and command in CHANGES_THE_NODE:
        first = near[0]
        raise ConfigError(f"environment variable {first.name} is not an npuops setting (did you mean "
                          f"{first.closest}?), and `npuops {command}` changes this node",
                          f"rename it to {first.closest}, or unset it (`unset {first.name}`)")
    for variable in near:
        click.echo(f"npuops: warning: {variable.warning()}", err=True)


def load_context_settings(ctx: click.Context, **flags: Any) -> Any:
    """Settings for a command: defaults < config files < NPUOPS_* < global and command flags."""
    from npuops.settings import load_settings

    _check_near_misses(ctx)
    root_ctx = ctx.find_root()
    obj = root_ctx.obj or {}
    merged = dict(obj.get("flags", {}))
    merged.update({k: v for k, v in flags.items() if v is not None})
    home = os.environ.get("HOME")
    settings = load_settings(
        dict(os.environ),
        config_file=obj.get("config_file"),
        flags=merged,
        home=Path(home) if home else None,
    )
    return settings


def refresh_monitoring_after(settings: Any) -> None:
    """After a command changed what serves here: Prometheus' targets follow, where `npuops monitor render` set them
    up (told on stderr, so --json output stays one document)."""
    import socket

    from npuops.monitor.refresh import refresh_monitoring

    line = refresh_monitoring(settings.state_dir, socket.gethostname())
    if line:
        click.echo(line, err=True)


def _wants_json(args: list[str]) -> bool:
    return "--json" in args


def _end_tools_and_interrupt(signum: int, frame: Any) -> None:
    """SIGINT: end the vendor tools running now first. Each runs in a session of its own, so the terminal's Ctrl-C
    does not reach it, and a worker thread running one would hold the exit until its timeout (npu-smi: 15 s)."""
    probe = sys.modules.get("npuops.hardware.probe")  # not imported: no tool runs, and a handler imports nothing
    if probe is not None:
        probe.RUNNING_TOOLS.stop()
    raise KeyboardInterrupt


def main(args: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if args is None else args)
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, _end_tools_and_interrupt) if in_main_thread else None
    try:
        code = _run(argv)
    finally:
        if previous is not None:  # None: not set from Python (nothing to put back)
            signal.signal(signal.SIGINT, previous)
        probe = sys.modules.get("npuops.hardware.probe")
        if probe is not None:
            probe.RUNNING_TOOLS.resume()  # a caller that goes on (a test calling main) may run tools again
    sys.exit(code)


def _run(argv: list[str]) -> int:
    """Run the command; its exit code. Expected errors become one line, a bug a traceback saying so."""
    try:
        rv = cli.main(args=argv, prog_name="npuops", standalone_mode=False)
    except NpuopsError as exc:
        if _wants_json(argv):
            import json

            click.echo(json.dumps({"ok": False, "error": {"problem": exc.problem, "fix": exc.fix,
                                                          "exit_code": int(exc.exit_code)}}))
        click.echo(f"npuops: error: {exc.one_line()}", err=True)
        return int(exc.exit_code)
    except click.exceptions.UsageError as exc:
        # click's own message (with its one "Did you mean ...?" for a misspelt option), on one line.
        cmd = exc.ctx.command_path if exc.ctx else "npuops"
        message = " ".join(exc.format_message().split()).rstrip(".")
        click.echo(f"npuops: usage error: {message}; see `{cmd} --help`", err=True)
        return int(ExitCode.USAGE)
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except (click.exceptions.Abort, KeyboardInterrupt):
        click.echo("npuops: interrupted", err=True)
        return int(ExitCode.INTERRUPTED)
    except click.exceptions.ClickException as exc:
        click.echo(f"npuops: error: {exc.format_message()}", err=True)
        return exc.exit_code
    except BrokenPipeError:
        # `npuops node | head`: the reader went away; not an error worth a traceback.
        sys.stderr.close()
        return int(ExitCode.OK)
    except Exception:  # noqa: BLE001 - the one place that turns bugs into a report
        traceback.print_exc()
        click.echo(
            "npuops: internal error: this is a bug in npuops, not in your input; "
            "please report it with the traceback above",
            err=True,
        )
        return int(ExitCode.INTERNAL_ERROR)
    return int(rv) if isinstance(rv, int) else int(ExitCode.OK)
