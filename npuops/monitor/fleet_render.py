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
from npuops.monitor.targets import Reach, reach_problem
from npuops.monitor.values import quoted, record_problem
from npuops.wire import WireFormatError, WireObject

TARGETS_ARGS = ("monitor", "targets", "--json")


def node_answer(records: Sequence[InstanceRecord]) -> dict[str, Any]:
    """What `npuops monitor targets --json` prints: this host's name and the records Prometheus should watch."""
    return {"ok": True, "hostname": socket.gethostname(),
            "records": [r.to_json() for r in serving_records(records)]}


def _is_here(host: InventoryHost, hostname: str) -> bool:
    try:
        if ipaddress.ip_address(host.address).is_loopback:
            return True
    except ValueError:
        pass
    return hostname == socket.gethostname()


# More parts than any node serves: an answer beyond it is not a node's (and would be a huge target file).
MAX_RECORDS = 1000
_WHAT = "`npuops monitor targets --json` answer"
_UPGRADE = "upgrade npuops there"


def _clip(text: str, limit: int = 500) -> str:
    """A line about another host's answer, bounded (its values are already shown by repr)."""
    return text if len(text) <= limit else text[:limit] + "..."


def host_part(host: InventoryHost, answer: object) -> tuple[Reach, list[InstanceRecord]]:
    """One host's answer as its reach and records, each checked as untrusted input: the document's types and size,
    each record as npuops reads one, and every value a record puts into Prometheus' files (values.record_problem).
    Anything else is one BadInputError (pure)."""
    try:
        doc = WireObject(answer, _WHAT)
        doc.require("records")
        items, hostname = doc.objects("records"), doc.text("hostname")
    except WireFormatError as exc:
        raise WireFormatError(_WHAT, exc.reason, _UPGRADE) from None
    if len(items) > MAX_RECORDS:
        raise WireFormatError(_WHAT, f"{len(items)} records, more than the {MAX_RECORDS} npuops reads", _UPGRADE)
    try:
        records = [InstanceRecord.from_json(dict(item.data), f"record {i}") for i, item in enumerate(items)]
    except ConfigError as exc:
        raise BadInputError(f"its npuops answered no records npuops reads ({exc.problem})", _UPGRADE) from None
    reach = Reach(host.name, host.address, _is_here(host, hostname))
    problem = reach_problem(reach)
    if problem:
        raise BadInputError(f"not watched: {problem}", "give the host an IP address or DNS name in the inventory "
                            "(ansible_host) and a name of printable text")
    problem = next((f"instance {quoted(r.name)}: {why}" for r in records if (why := record_problem(r))), None)
    if problem:
        raise BadInputError(f"not watched: {problem}", "relaunch that instance there with `npuops launch` (its "
                            "record is not one npuops writes), or upgrade npuops there")
    return reach, records


def hosts_from_answers(hosts: Sequence[InventoryHost], answers: Mapping[str, HostAnswer]
                       ) -> tuple[list[tuple[Reach, list[InstanceRecord]]], list[str]]:
    """Each answering host's reach and records (pure), and the hosts that did not answer or whose answer is not
    one npuops trusts, with why."""
    found: list[tuple[Reach, list[InstanceRecord]]] = []
    failed: list[str] = []
    for host in hosts:
        answer = answers.get(host.name)
        if answer is None or answer.answer is None:
            failed.append(f"{host.name}: {answer.message if answer else 'no answer'}"
                          + (f" ({answer.fix})" if answer and answer.fix else ""))
            continue
        try:
            found.append(host_part(host, answer.answer))
        except BadInputError as exc:
            failed.append(_clip(f"{host.name}: {exc.one_line()}"))
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
