from __future__ import annotations

import json
import socket
import sys
import time
from pathlib import Path

import click

from npuops.cli.fleet_flags import ARTIFACTS, FORKS, GROUP, INVENTORY, LIMIT, artifacts_dir, fleet_flags
from npuops.cli.main import load_context_settings
from npuops.errors import UsageError


def _default_output(label: str) -> Path:
    return Path.cwd() / f"npuops-collect-{label}-{time.strftime('%Y%m%d-%H%M%S')}.tar.gz"


@click.command()
@click.argument("names", nargs=-1)
@fleet_flags(INVENTORY, GROUP, LIMIT, FORKS, ARTIFACTS)
@click.option("--since", default="2h", show_default=True, metavar="DURATION",
              help="Journal, kernel and CANN log lines of this long ago on (30m, 2h, 1d).")
@click.option("--output", type=click.Path(dir_okay=False, path_type=Path),
              help="The bundle to write [default: ./npuops-collect-<host>-<time>.tar.gz].")
@click.option("--max-mib", type=click.IntRange(1, 4096), default=256, show_default=True,
              help="The bundle's size cap (each file is cut to 8 MiB, keeping its end).")
@click.option("--force", is_flag=True,
              help="Replace an existing --output that is not a bundle of npuops': a file, a FIFO, or a link to a file "
                   "(the link itself). Never a directory, a device, a link to anything else, or a path under /proc, "
                   "/sys, /dev or /run.")
@click.option("--json", "as_json", is_flag=True, help="Print the bundle's summary as JSON.")
@click.pass_context
def collect(ctx: click.Context, /, names: tuple[str, ...], inventory: Path | None, group: str | None,
            limit: str | None, forks: int, artifacts: Path | None, since: str, output: Path | None, max_mib: int,
            force: bool, as_json: bool) -> None:
    """Gather what a support case needs into one .tar.gz: the node model, the doctor's report, the instances'
    files, journals and engine logs, CANN's logs, kernel messages, npu-smi, hccn_tool and msnpureport, pip freeze.

    NAMES limit the instances (all without). Secrets (API keys, Ray tokens, secret variables of the env files) are
    redacted everywhere; only regular files are read (links, FIFOs and devices are listed as skipped). With -i
    INVENTORY [--group G]: every host's bundle, put into one.
    """
    from npuops.safefiles import printable
    from npuops.support.bundle import check_destination
    from npuops.support.collect import CollectRequest, collect_node, parse_since

    try:
        since_s = parse_since(since)
    except ValueError as exc:
        raise UsageError(str(exc), "pass --since as a number and a unit: s, m, h or d") from None
    if group and inventory is None:
        raise UsageError("--group needs -i INVENTORY", "add -i INVENTORY, or drop --group")
    settings = load_context_settings(ctx)
    # Checked before anything is gathered (and again when the bundle is written).
    destination = output or _default_output((group or "fleet") if inventory is not None else socket.gethostname())
    check_destination(destination, force=force)
    cap = max_mib * 2**20
    quiet = as_json or not sys.stderr.isatty()
    if inventory is not None:
        from npuops.cli.fleet_flags import playbook_progress
        from npuops.support.fleet_collect import collect_fleet, hosts_limit

        args = ["collect", *names, "--since", f"{since_s}s", "--max-mib", str(max_mib)]
        bundle, parts = collect_fleet(inventory, hosts_limit(inventory, group, limit), args,
                                      artifacts_dir=artifacts_dir(settings, artifacts), forks=forks,
                                      bundle_cap=cap, on_event=playbook_progress(tasks=True, quiet=as_json))
        written = bundle.write(destination, force=force)
        hosts = [p.as_dict() for p in parts]
    else:
        def progress(text: str) -> None:
            if not quiet:
                click.echo(f"collect: {text}", err=True)

        bundle = collect_node(settings, CollectRequest(names, since_s, cap), progress)
        written = bundle.write(destination, force=force)
        hosts = []
    size = written.stat().st_size
    # Through the bundle's redactor, as the manifest: a reason may quote a record's value, a host's message a token.
    summary = bundle.redacted({"bundle": str(written), "files": len(bundle.files), "bytes": size,
                               "skipped": [s.as_dict() for s in bundle.skipped], "hosts": hosts})
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    click.echo(f"bundle: {printable(summary['bundle'])} ({summary['files']} files, {size / 2**20:.1f} MiB compressed)")
    for host in summary["hosts"]:
        # Names and messages from other hosts and from directories the service user writes: shown escaped.
        line = f"  {printable(host['host'])}: {host['status']}"
        click.echo(line + (f" - {printable(host['message'])}; {printable(host['fix'])}" if host["status"] != "ok"
                           else f" ({host['files']} files)"))
    skipped = summary["skipped"]
    if skipped:
        click.echo(f"skipped ({len(skipped)}, each with why in manifest.json):")
        for item in skipped[:12]:
            click.echo(printable(f"  {item['what']}: {item['why']}")[:100])
        if len(skipped) > 12:
            click.echo(f"  ... {len(skipped) - 12} more")
