from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from npuops.cli.fleet_flags import (
    ARTIFACTS,
    FORKS,
    HOSTS,
    INVENTORY,
    LIMIT,
    artifacts_dir,
    fleet_flags,
    playbook_progress,
)
from npuops.cli.main import load_context_settings
from npuops.errors import ExitCode, UsageError


@click.command()
@fleet_flags(INVENTORY, HOSTS, LIMIT)
@click.option("--packages", "packages_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Directory of vendor .run packages (and wheels) with a SHA256SUMS manifest.")
@click.option("--arch", type=click.Choice(["x86_64", "aarch64"]),
              help="The hosts' architecture, when --packages holds packages for both.")
@click.option("--stack", help="The compatibility row to install, by vllm-ascend version (e.g. 0.9.1) "
              "[default: the newest row of the CANN being installed].")
@click.option("--tags", help="Roles to run, comma-separated: preflight,users,driver,npu-network,cann,environment,"
              "python,tuning,verify (preflight always runs; npu-network only where the inventory gives NPU port "
              "addresses).")
@click.option("--install-path", type=click.Path(path_type=Path),
              help="Where the vendor installers install [default: /usr/local/Ascend, or the inventory's].")
@click.option("--check", is_flag=True, help="Show what would change (installers that would run); change nothing.")
@click.option("--diff", is_flag=True, help="Show the differences in files that change.")
@FORKS
@click.option("--allow-reboot", is_flag=True, help="Reboot hosts that need it after a driver/firmware change.")
@click.option("--no-hardware-check", is_flag=True,
              help="Waive the preflight check for NPUs on the PCI bus (image builds, tests); nothing else.")
@ARTIFACTS
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_context
def provision(ctx: click.Context, /, inventory: Path | None, hosts: tuple[str, ...], limit: str | None,
              packages_dir: Path | None, arch: str | None, stack: str | None, tags: str | None,
              install_path: Path | None, check: bool, diff: bool, forks: int, allow_reboot: bool,
              no_hardware_check: bool, artifacts: Path | None, as_json: bool) -> None:
    """Install the NPU driver and firmware, CANN (toolkit, kernels/ops, NNAL), the environment and one stack row on
    every host, with the Ansible roles in playbooks/ run through ansible-runner.

    Packages are checked against SHA256SUMS before any host is touched. Exit 0 only when every host converged.
    """
    from npuops.provision.run import ProvisionOptions, run_provisioning
    from npuops.provision.text import render_report_text

    if (inventory is None) == (not hosts):
        raise UsageError("say which hosts: -i INVENTORY or --host HOST (not both)",
                         "e.g. `npuops provision --host localhost --packages DIR`")
    settings = load_context_settings(ctx)
    options = ProvisionOptions(
        inventory=inventory if inventory is not None else list(hosts), artifacts_dir=artifacts_dir(settings, artifacts),
        packages_dir=packages_dir, stack=stack,
        tags=tuple(t.strip() for t in tags.split(",") if t.strip()) if tags else (), limit=limit,
        install_path=install_path, check=check, diff=diff, forks=forks, allow_reboot=allow_reboot,
        hardware_check=not no_hardware_check, arch=arch)
    # A change or a failure per host and task: ok results of an idempotent re-run would drown them.
    progress = playbook_progress(results=("changed", "failed", "unreachable"), quiet=as_json)
    report = run_provisioning(options, on_event=progress)
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        click.echo(render_report_text(report, waived_hardware_check=no_hardware_check))
    if not report.ok:
        ctx.exit(int(ExitCode.CHECKS_FAILED))


@click.group()
def packages() -> None:
    """The vendor packages a provisioning run installs."""


@packages.command("index")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True)
def index(directory: Path, as_json: bool) -> None:
    """Write DIRECTORY/SHA256SUMS for its .run and .whl files (check them against the vendor's checksums first)."""
    from npuops.provision.packages import classify_package, index_packages

    sums = index_packages(directory)
    rows: list[dict[str, Any]] = []
    for name, digest in sums.items():
        package = classify_package(name)
        rows.append({"name": name, "sha256": digest, "kind": package.kind if package else
                     ("wheel" if name.endswith(".whl") else None), "version": package.version if package else None})
    if as_json:
        click.echo(json.dumps({"ok": True, "manifest": str(directory / "SHA256SUMS"), "packages": rows}, indent=2))
        return
    for row in rows:
        click.echo(f"{row['sha256'][:16]}  {row['kind'] or '?':<9} {row['version'] or '':<14} {row['name']}")
    click.echo(f"wrote {directory / 'SHA256SUMS'}")
