"""The hosts of one inventory group, in inventory order, with the variables multi-node serving reads.

Order matters: the first host of a serving group is the Ray head or the data-parallel leader. Ansible's
own `ansible-inventory --list` (the ansible-core npuops runs) parses the inventory, in any format Ansible
reads; `group_hosts` (pure) walks its JSON.

Host names become paths on the controller (a group launch's OUTPUT/<host>/, a fleet bundle's hosts/<host>/, the
file a host's bundle is fetched to) and arguments (--limit): every name in an inventory is checked when it is
read (`host_name_problem`), whatever the command, and one Ansible takes but no DNS name or IP address looks like
(`..`, `a/b`, `-x`, a newline) refuses the whole inventory before any host is touched.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from npuops.errors import BadInputError, EnvironmentMissingError

_GROUP_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")
# One label of a host name: what DNS names are made of, plus '_' (which Ansible aliases often hold); never a
# leading '-' (it would read as an option where a name becomes an argument).
_HOST_LABEL = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*")
_ZONE = re.compile(r"[A-Za-z0-9_-]{1,15}")
MAX_HOST_NAME = 253
MAX_HOST_LABEL = 63
HOST_NAME_FIX = ("name the host by its DNS name or IP address in the inventory (letters, digits, '-', '_' and '.'; "
                 "an alias that differs sets ansible_host to the address)")


def host_name_problem(name: object) -> str | None:
    """Why `name` cannot name an inventory host (a DNS name, or an IPv4 or IPv6 address), or None. Pure."""
    if not isinstance(name, str) or not name:
        return "is empty" if name == "" else "is not a string"
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        address = None
    if address is not None:
        # An IPv6 link-local address's zone is an interface name (Python's parser takes any text there).
        zone = getattr(address, "scope_id", None)
        return None if not zone or _ZONE.fullmatch(zone) else "has a zone that is not an interface name"
    if len(name) > MAX_HOST_NAME:
        return f"is longer than {MAX_HOST_NAME} characters"
    for label in name.split("."):
        if not label:
            return "has an empty part between dots (as '.' and '..' do)"
        if len(label) > MAX_HOST_LABEL:
            return f"has a part longer than {MAX_HOST_LABEL} characters"
        if label.startswith("-"):
            return "starts a part with '-'"
        if not _HOST_LABEL.fullmatch(label):
            return "holds characters no host name has ('/', spaces, control characters, ...)"
    return None


def host_argument_problem(host: object) -> str | None:
    """Why a host named on the command line (--host) cannot name a host, or None: a DNS name or an IP address,
    with an optional :PORT as in an inventory (an IPv6 address takes none). Pure."""
    if isinstance(host, str) and host.count(":") == 1:
        host, _, port = host.partition(":")
        if not re.fullmatch(r"[0-9]{1,5}", port) or not 0 < int(port) < 65536:
            return f"has a port {port!r} that is not a number from 1 to 65535"
    return host_name_problem(host)


def _listed_hosts(listing: Mapping[str, Any]) -> Iterator[object]:
    meta = listing.get("_meta")
    hostvars = meta.get("hostvars") if isinstance(meta, Mapping) else None
    yield from hostvars if isinstance(hostvars, Mapping) else ()
    for entry in listing.values():
        if isinstance(entry, Mapping) and isinstance(entry.get("hosts"), list):
            yield from entry["hosts"]


def check_host_names(listing: Mapping[str, Any], inventory: object) -> None:
    """Refuse an inventory (`ansible-inventory --list` JSON) with a host name that is not a DNS name or an IP
    address, naming the first. Pure."""
    for name in _listed_hosts(listing):
        problem = host_name_problem(name)
        if problem is not None:
            raise BadInputError(f"inventory {inventory}: host name {name!r} {problem}", HOST_NAME_FIX)


@dataclass(frozen=True)
class InventoryHost:
    name: str
    address: str  # ansible_host, else the name
    port: int  # ansible_port, else 22
    vars: Mapping[str, Any] = field(default_factory=dict)


def group_hosts(listing: Mapping[str, Any], group: str) -> list[InventoryHost]:
    """The hosts of `group` (its own, then its child groups', depth first), each once, from
    `ansible-inventory --list` JSON. Pure."""
    # ansible-inventory lists an empty group only among its parent's children, not as a key of its own.
    children = {c for entry in listing.values() if isinstance(entry, Mapping) for c in entry.get("children", [])}
    if (group not in listing and group not in children) or group == "_meta":
        groups = sorted((set(listing) | children) - {"_meta", "all", "ungrouped"})
        raise BadInputError(f"the inventory has no group {group!r}",
                            f"use one of: {', '.join(groups)}" if groups else "add the group to the inventory")
    hostvars = listing.get("_meta", {}).get("hostvars", {})
    names: list[str] = []
    seen_groups: set[str] = set()

    def walk(name: str) -> None:
        if name in seen_groups:
            return
        seen_groups.add(name)
        entry = listing.get(name) or {}
        for host in entry.get("hosts", []):
            if host not in names:
                names.append(host)
        for child in entry.get("children", []):
            walk(child)

    walk(group)
    if not names:
        raise BadInputError(f"inventory group {group!r} has no hosts", "add the serving hosts to the group")
    check_host_names({group: {"hosts": names}}, f"group {group}")
    hosts = []
    for name in names:
        hv = hostvars.get(name, {}) or {}
        try:
            port = int(hv.get("ansible_port", 22))
        except (TypeError, ValueError):
            raise BadInputError(f"host {name}: ansible_port {hv.get('ansible_port')!r} is not a number",
                                "fix ansible_port in the inventory") from None
        address = str(hv.get("ansible_host", name))
        if "{{" in address:
            # A templated ansible_host is only resolved inside a play; the name is what reaches the host.
            address = name
        hosts.append(InventoryHost(name, address, port, dict(hv)))
    return hosts


def read_inventory_group(inventory: Path, group: str) -> list[InventoryHost]:
    """Run `ansible-inventory -i INVENTORY --list` and return the group's hosts in order."""
    if not _GROUP_NAME.match(group):
        raise BadInputError(f"--group {group!r} is not an inventory group name",
                            "use letters, digits, '_' and '-', starting with a letter")
    return group_hosts(read_inventory(inventory), group)


def read_inventory(inventory: Path) -> dict[str, Any]:
    """`ansible-inventory -i INVENTORY --list`'s JSON, every host name in it checked (check_host_names)."""
    # Imported here: the runner checks every inventory it runs a playbook on through this module.
    from npuops.fleet.runner import BASE_ENVVARS, default_ansible_playbook

    path = Path(inventory).expanduser()
    if not path.exists():
        raise BadInputError(f"inventory {inventory} does not exist", "pass an existing inventory file with -i")
    binary = default_ansible_playbook().parent / "ansible-inventory"
    if not binary.is_file():
        raise EnvironmentMissingError(f"ansible-inventory not found at {binary}",
                                      "install ansible-core into npuops' environment")
    env = {**os.environ, **BASE_ENVVARS}
    try:
        done = subprocess.run([str(binary), "-i", str(path), "--list"], capture_output=True, text=True,
                              timeout=120, env=env, check=False)
    except subprocess.TimeoutExpired:
        raise BadInputError(f"reading inventory {inventory} took over 120 s",
                            "check the inventory (dynamic inventory scripts must answer quickly)") from None
    if done.returncode != 0:
        said = " ".join(line.strip() for line in done.stderr.splitlines() if line.strip())[-300:]
        raise BadInputError(f"Ansible cannot read inventory {inventory}: {said or 'exit ' + str(done.returncode)}",
                            "fix the inventory (`ansible-inventory -i INVENTORY --list` shows the problem)")
    try:
        listing = json.loads(done.stdout)
    except ValueError:
        listing = None
    if not isinstance(listing, dict):
        raise BadInputError(f"ansible-inventory printed no JSON object for {inventory}",
                            "run `ansible-inventory -i INVENTORY --list` to see why")
    check_host_names(listing, inventory)
    return listing
