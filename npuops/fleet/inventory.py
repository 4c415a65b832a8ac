"""The hosts of one inventory group, in inventory order, with the variables multi-node serving reads.

Order matters: the first host of a serving group is the Ray head or the data-parallel leader. Ansible's
own `ansible-inventory --list` (the ansible-core npuops runs) parses the inventory, in any format Ansible
reads; `group_hosts` (pure) walks its JSON.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from npuops.errors import BadInputError, EnvironmentMissingError
from npuops.fleet.runner import BASE_ENVVARS, default_ansible_playbook

_GROUP_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


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
        raise BadInputError(f"ansible-inventory printed no JSON for {inventory}",
                            "run `ansible-inventory -i INVENTORY --list` to see why") from None
    return group_hosts(listing, group)
