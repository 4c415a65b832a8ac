"""Inventory host names become paths on the controller (OUTPUT/<host>/, a fleet bundle's hosts/<host>/, the file a
host's bundle is fetched to) and arguments (--limit): one that is no DNS name or IP address (`..`, `/`, `a/b`, a
newline, `-x`) refuses the inventory in one line, for every command that reads it, before any host is touched."""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npuops.errors import BadInputError
from npuops.fleet.inventory import group_hosts, host_argument_problem, host_name_problem, read_inventory_group
from npuops.fleet.runner import hosts_inventory, run_playbook
from tests.support.paths import REPO

HOSTILE_NAMES = ["..", ".", "/", "a/b", "../../etc/cron.d/x", "-x", "node-1.-x", "a\nb", "a\rb", "x y", "a..b",
                 "fe80::1%a/b", "fe80::1%\n", "node,other", "node&other", "!node", "a\x00b", "", "é.example"]
GOOD_NAMES = ["node-1", "node-1.example.com", "node_1", "10.0.0.1", "fe80::1", "fe80::1%eth0", "::1", "localhost",
              "NODE2"]

PIECES = ["..", ".", "/", "-", "_", "a", "0", ":", "%", "\n", " ", ",", "é", "\x00", "[", "]", "*", "~", "'"]
HOSTILE = st.one_of(st.text(max_size=40), st.lists(st.sampled_from(PIECES), max_size=10).map("".join),
                    st.binary(max_size=20).map(os.fsdecode))
LABEL = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,20}", fullmatch=True)
FAST = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _inventory(tmp_path: Path, hostile: str) -> Path:
    """A YAML inventory (any name can be a YAML key) with the hostile host outside the group that is asked for."""
    path = tmp_path / "hosts.yml"
    path.write_text("all:\n  children:\n    serve:\n      hosts:\n        node-a: {}\n"
                    f"    other:\n      hosts:\n        {hostile!r}: {{}}\n".replace("'", '"'))
    return path


@FAST
@given(HOSTILE)
def test_an_accepted_host_name_is_one_path_part_and_no_option(name: str) -> None:
    if host_name_problem(name) is not None:
        return
    assert name not in (".", "..") and "/" not in name and "\x00" not in name and name.isprintable()
    assert not name.startswith("-") and " " not in name and "," not in name
    assert Path(name).name == name


@FAST
@given(st.lists(LABEL, min_size=1, max_size=4).map(".".join))
def test_dns_names_are_accepted(name: str) -> None:
    assert host_name_problem(name) is None


@FAST
@given(st.one_of(st.ip_addresses(v=4), st.ip_addresses(v=6)))
def test_ip_addresses_are_accepted(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> None:
    assert host_name_problem(str(address)) is None


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_a_hostile_host_in_a_group_is_refused_in_one_line(name: str) -> None:
    listing: dict[str, Any] = {"_meta": {"hostvars": {}}, "serve": {"hosts": ["node-a", name]}}
    with pytest.raises(BadInputError) as refused:
        group_hosts(listing, "serve")
    assert repr(name) in refused.value.problem and "\n" not in refused.value.one_line()
    assert "DNS name or IP address" in refused.value.fix


def test_good_names_and_ports_pass() -> None:
    listing = {"_meta": {"hostvars": {}}, "serve": {"hosts": GOOD_NAMES}}
    assert [h.name for h in group_hosts(listing, "serve")] == GOOD_NAMES
    assert host_argument_problem("node-1:2222") is None and host_argument_problem("10.0.0.1:22") is None
    assert host_argument_problem("node-1:0") is not None and host_argument_problem("..:22") is not None


@pytest.mark.parametrize("name", ["..", ".", "-x"])
def test_a_hostile_host_given_with_host_is_refused(name: str) -> None:
    with pytest.raises(BadInputError, match="is not a host name or address"):
        hosts_inventory([name])


def test_the_whole_inventory_is_checked_when_a_group_is_read(tmp_path: Path) -> None:
    """A hostile host outside the group is refused too: a --limit or another command could reach it."""
    with pytest.raises(BadInputError, match=r"host name '\.\.'") as refused:
        read_inventory_group(_inventory(tmp_path, ".."), "serve")
    assert "\n" not in refused.value.one_line()


def test_a_playbook_run_refuses_the_inventory_before_any_host_is_touched(tmp_path: Path) -> None:
    """Commands without --group (node, doctor, collect, provision) go straight to a playbook run."""
    ran = tmp_path / "ansible-playbook-ran"
    fake = tmp_path / "ansible-playbook"
    fake.write_text(f"#!/bin/sh\ntouch {ran}\n")
    fake.chmod(0o755)
    with pytest.raises(BadInputError, match=r"host name '-x' starts a part with '-'"):
        run_playbook("node-facts.yml", inventory=_inventory(tmp_path, "-x"), artifacts_dir=tmp_path / "artifacts",
                     ansible_playbook=fake)
    assert not ran.exists()


def test_the_cli_refuses_it_in_one_line(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "npuops", "node", "-i", str(_inventory(tmp_path, "a/b"))],
                          capture_output=True, text=True, cwd=REPO, timeout=120, check=False)
    assert proc.returncode == 3
    assert proc.stderr.splitlines() == [
        f"npuops: error: inventory {tmp_path / 'hosts.yml'}: host name 'a/b' holds characters no host name has ('/',"
        " spaces, control characters, ...); fix: name the host by its DNS name or IP address in the inventory "
        "(letters, digits, '-', '_' and '.'; an alias that differs sets ansible_host to the address)"]
