"""Entry point: a lazy click group, so `npuops --help` never imports what a command needs.

Subcommands live in modules named in COMMANDS and are imported only when run (as in vLLM's CLI
and pip's command table). Expected errors (NpuopsError) become one line and their exit code;
anything else is a bug and prints a traceback saying so.
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys
import traceback
from pathlib import Path
from typing import Any

import click

from npuops import __version__
from npuops.errors import ExitCode, NpuopsError

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


def load_context_settings(ctx: click.Context, **flags: Any) -> Any:
    """Settings for a command: defaults < config files < NPUOPS_* < global and command flags."""
    from npuops.settings import load_settings

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
    if not obj.get("environment_warned"):
        from npuops.settings import environment_warnings

        for warning in environment_warnings(os.environ):
            click.echo(f"npuops: warning: {warning}", err=True)
        if root_ctx.obj is not None:
            root_ctx.obj["environment_warned"] = True
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


def main(args: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if args is None else args)
    try:
        rv = cli.main(args=argv, prog_name="npuops", standalone_mode=False)
    except NpuopsError as exc:
        if _wants_json(argv):
            import json

            click.echo(json.dumps({"ok": False, "error": {"problem": exc.problem, "fix": exc.fix,
                                                          "exit_code": int(exc.exit_code)}}))
        click.echo(f"npuops: error: {exc.one_line()}", err=True)
        sys.exit(int(exc.exit_code))
    except click.exceptions.UsageError as exc:
        # click's own message (with its one "Did you mean ...?" for a misspelt option), on one line.
        cmd = exc.ctx.command_path if exc.ctx else "npuops"
        message = " ".join(exc.format_message().split()).rstrip(".")
        click.echo(f"npuops: usage error: {message}; see `{cmd} --help`", err=True)
        sys.exit(int(ExitCode.USAGE))
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except (click.exceptions.Abort, KeyboardInterrupt):
        click.echo("npuops: interrupted", err=True)
        sys.exit(int(ExitCode.INTERRUPTED))
    except click.exceptions.ClickException as exc:
        click.echo(f"npuops: error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except BrokenPipeError:
        # `npuops node | head`: the reader went away; not an error worth a traceback.
        sys.stderr.close()
        sys.exit(int(ExitCode.OK))
    except Exception:  # noqa: BLE001 - the one place that turns bugs into a report
        traceback.print_exc()
        click.echo(
            "npuops: internal error: this is a bug in npuops, not in your input; "
            "please report it with the traceback above",
            err=True,
        )
        sys.exit(int(ExitCode.INTERNAL_ERROR))
    sys.exit(int(rv) if isinstance(rv, int) else int(ExitCode.OK))
