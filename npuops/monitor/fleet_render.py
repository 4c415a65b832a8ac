"""`npuops monitor render -i INVENTORY --group GROUP`: one Prometheus configuration for a serving group, from what
every host serves (`npuops monitor targets --json` on each, through playbooks/npuops-command.yml).

Prometheus runs on the machine that renders (this one): a host that is this machine is scraped on loopback, the
others at their inventory address. A part bound to loopback on another host (a router's metrics port, a replica
launched without a serving address) cannot be scraped from here, and the render says which: run Prometheus on
that host too (`npuops monitor render` there), or give the part an address others reach.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from npuops.errors import BadInputError, ConfigError
from npuops.fleet.events import PlaybookEvent
from npuops.fleet.group_ops import HostAnswer, run_on_hosts
from npuops.fleet.inventory import InventoryHost, read_inventory_group
from npuops.instance.record import InstanceRecord
from npuops.monitor.refresh import serving_records
from npuops.monitor.targets import Reach

TARGETS_ARGS = ("monitor", "targets", "--json")


def node_answer(records: Sequence[InstanceRecord]) -> dict[str, Any]:
    """What `npuops monitor targets --json` prints: this host's name and the records Prometheus should watch."""
    return {"ok": True, "hostname": socket.gethostname(),
            "records": [r.to_json() for r in serving_records(records)]}


def _is_here(host: InventoryHost, answer: Mapping[str, Any]) -> bool:
    try:
        if ipaddress.ip_address(host.address).is_loopback:
            return True
    except ValueError:
        pass
    return answer.get("hostname") == socket.gethostname()


def hosts_from_answers(hosts: Sequence[InventoryHost], answers: Mapping[str, HostAnswer]
                       ) -> tuple[list[tuple[Reach, list[InstanceRecord]]], list[str]]:
    """Each answering host's reach and records (pure), and the hosts that did not answer, with why."""
    found: list[tuple[Reach, list[InstanceRecord]]] = []
    failed: list[str] = []
    for host in hosts:
        answer = answers.get(host.name)
        if answer is None or answer.answer is None:
            failed.append(f"{host.name}: {answer.message if answer else 'no answer'}"
                          + (f" ({answer.fix})" if answer and answer.fix else ""))
            continue
        try:
            records = [InstanceRecord.from_json(dict(r), f"{host.name}'s instance") for r in answer.answer["records"]]
        except (KeyError, TypeError, ValueError, ConfigError) as exc:
            failed.append(f"{host.name}: its npuops answered no records npuops reads ({exc}); upgrade npuops there")
            continue
        found.append((Reach(host.name, host.address, _is_here(host, answer.answer)), records))
    return found, failed


def gather_group(inventory: Path, group: str, *, artifacts_dir: Path, forks: int,
                 on_event: Callable[[PlaybookEvent], None] | None = None
                 ) -> tuple[list[tuple[Reach, list[InstanceRecord]]], list[str]]:
    hosts = read_inventory_group(inventory, group)
    if not hosts:
        raise BadInputError(f"group {group!r} of {inventory} has no hosts", "give a group that lists the hosts")
    answers = run_on_hosts(inventory, group, TARGETS_ARGS, artifacts_dir=artifacts_dir, forks=forks,
                           on_event=on_event)
    return hosts_from_answers(hosts, answers)
