"""The hosts of one inventory group (npuops.fleet.inventory): `group_hosts` on what the real `ansible-inventory --list`
prints for small YAML and INI inventories written here, and `read_inventory_group` end to end."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from npuops.errors import BadInputError
from npuops.fleet.inventory import InventoryHost, group_hosts, read_inventory_group
from npuops.fleet.runner import BASE_ENVVARS
from tests.support.paths import VENV_BIN

ANSIBLE_INVENTORY = VENV_BIN / "ansible-inventory"

# Host order differs from alphabetical on purpose: the first host of a serving group is the head / leader.
YAML_INVENTORY = """\
all:
  children:
    serve:
      hosts:
        node-c:
          ansible_host: 10.213.0.13
          ansible_port: 2222
        node-a:
          ansible_host: 10.213.0.11
          npuops_serving_ifname: ens5
      children:
        serve_extra:
          hosts:
            node-b: {}
            node-a: {}
        serve_more:
          children:
            serve_deep:
              hosts:
                node-d:
                  ansible_host: 10.213.0.14
    hollow:
      children:
        nothing_here: {}
    other:
      hosts:
        node-z:
          ansible_host: 10.213.0.99
  vars:
    ansible_connection: ssh
"""

INI_INVENTORY = """\
[serve]
node-c ansible_host=10.213.0.13 ansible_port=2222
node-a ansible_host=10.213.0.11 npuops_serving_address=10.99.0.11

[serve:children]
serve_extra

[serve_extra]
node-b
node-a

[other]
node-z ansible_host=10.213.0.99

[broken_port]
node-p ansible_port=ssh
"""


def _listing(inventory: Path) -> dict[str, Any]:
    done = subprocess.run([str(ANSIBLE_INVENTORY), "-i", str(inventory), "--list"], capture_output=True, text=True,
                          env={**os.environ, **BASE_ENVVARS}, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    listing: dict[str, Any] = json.loads(done.stdout)
    return listing


@pytest.fixture(scope="module")
def yaml_listing(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    path = tmp_path_factory.mktemp("inv") / "hosts.yml"
    path.write_text(YAML_INVENTORY)
    return _listing(path)


@pytest.fixture(scope="module")
def ini_listing(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    path = tmp_path_factory.mktemp("inv") / "hosts.ini"
    path.write_text(INI_INVENTORY)
    return _listing(path)


def test_yaml_group_in_inventory_order_with_children(yaml_listing: dict[str, Any]) -> None:
    hosts = group_hosts(yaml_listing, "serve")
    # Its own hosts first, then its children's depth first; node-a (also in serve_extra) once.
    assert [h.name for h in hosts] == ["node-c", "node-a", "node-b", "node-d"]
    node_c, node_a, node_b, node_d = hosts
    assert (node_c.address, node_c.port) == ("10.213.0.13", 2222)
    assert (node_a.address, node_a.port) == ("10.213.0.11", 22)
    assert (node_b.address, node_b.port) == ("node-b", 22)  # no ansible_host: the name
    assert node_d.address == "10.213.0.14"
    assert node_a.vars["npuops_serving_ifname"] == "ens5"
    assert node_a.vars["ansible_connection"] == "ssh"  # group vars reach the host
    assert "node-z" not in [h.name for h in hosts]


def test_yaml_child_groups_alone(yaml_listing: dict[str, Any]) -> None:
    assert [h.name for h in group_hosts(yaml_listing, "serve_extra")] == ["node-b", "node-a"]
    assert [h.name for h in group_hosts(yaml_listing, "serve_more")] == ["node-d"]
    assert group_hosts(yaml_listing, "other") == [
        InventoryHost("node-z", "10.213.0.99", 22, {"ansible_connection": "ssh", "ansible_host": "10.213.0.99"})]


def test_ini_group_in_inventory_order_with_children(ini_listing: dict[str, Any]) -> None:
    hosts = group_hosts(ini_listing, "serve")
    assert [h.name for h in hosts] == ["node-c", "node-a", "node-b"]
    assert (hosts[0].address, hosts[0].port) == ("10.213.0.13", 2222)
    assert hosts[1].address == "10.213.0.11" and hosts[1].vars["npuops_serving_address"] == "10.99.0.11"
    assert (hosts[2].address, hosts[2].port, dict(hosts[2].vars)) == ("node-b", 22, {})


def test_unknown_group_lists_the_groups(yaml_listing: dict[str, Any], ini_listing: dict[str, Any]) -> None:
    with pytest.raises(BadInputError, match="the inventory has no group 'servers'") as err:
        group_hosts(yaml_listing, "servers")
    assert err.value.fix == "use one of: hollow, nothing_here, other, serve, serve_deep, serve_extra, serve_more"
    with pytest.raises(BadInputError, match="no group 'serving'") as err:
        group_hosts(ini_listing, "serving")
    assert err.value.fix == "use one of: broken_port, other, serve, serve_extra"
    with pytest.raises(BadInputError, match="no group '_meta'"):
        group_hosts(ini_listing, "_meta")


def test_a_group_whose_children_hold_no_host_is_an_error(yaml_listing: dict[str, Any]) -> None:
    with pytest.raises(BadInputError, match="inventory group 'hollow' has no hosts"):
        group_hosts(yaml_listing, "hollow")


def test_an_empty_group_is_reported_as_empty(yaml_listing: dict[str, Any]) -> None:
    assert "nothing_here" in yaml_listing["hollow"]["children"]
    with pytest.raises(BadInputError, match="inventory group 'nothing_here' has no hosts"):
        group_hosts(yaml_listing, "nothing_here")


def test_a_port_that_is_not_a_number(ini_listing: dict[str, Any]) -> None:
    with pytest.raises(BadInputError, match="host node-p: ansible_port 'ssh' is not a number"):
        group_hosts(ini_listing, "broken_port")


def test_read_inventory_group_end_to_end(tmp_path: Path) -> None:
    yml = tmp_path / "hosts.yml"
    yml.write_text(YAML_INVENTORY)
    hosts = read_inventory_group(yml, "serve")
    assert [(h.name, h.address, h.port) for h in hosts] == [
        ("node-c", "10.213.0.13", 2222), ("node-a", "10.213.0.11", 22), ("node-b", "node-b", 22),
        ("node-d", "10.213.0.14", 22)]
    ini = tmp_path / "hosts"
    ini.write_text(INI_INVENTORY)
    assert [h.name for h in read_inventory_group(ini, "serve_extra")] == ["node-b", "node-a"]
    with pytest.raises(BadInputError, match="no group 'nope'"):
        read_inventory_group(ini, "nope")


def test_read_inventory_group_refuses_bad_input(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yml"
    broken.write_text("all:\n  hosts: [unclosed\n")
    with pytest.raises(BadInputError, match=r"Ansible cannot read inventory .*broken\.yml") as err:
        read_inventory_group(broken, "serve")
    assert "ansible-inventory -i INVENTORY --list" in err.value.fix
    with pytest.raises(BadInputError, match="does not exist"):
        read_inventory_group(tmp_path / "missing.yml", "serve")
    good = tmp_path / "hosts.yml"
    good.write_text(YAML_INVENTORY)
    for name in ("serve;rm", "all servers", "-serve", ""):
        with pytest.raises(BadInputError, match="is not an inventory group name"):
            read_inventory_group(good, name)
