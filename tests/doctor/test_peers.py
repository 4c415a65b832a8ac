"""`npuops doctor --peers`: the JSON the network checks between hosts read, its errors, and the CLI around it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from npuops.doctor.context import PeerGroup, PeerHost, parse_peers
from npuops.errors import BadInputError
from tests.support.paths import REPO


def test_list_form_with_defaults() -> None:
    group = parse_peers('[{"name": "node-b", "address": "10.213.0.12", "port": 2222, '
                        '"npu_ips": {"0": "29.1.112.214", "1": "29.1.112.215", "2": null}},'
                        ' {"address": "node-c.example"}]')
    assert group == PeerGroup(peers=(
        PeerHost("node-b", "10.213.0.12", 2222, {0: "29.1.112.214", 1: "29.1.112.215"}),
        PeerHost("node-c.example", "node-c.example", 22, {}),
    ))
    assert group.ifname is None


def test_object_form_names_the_local_interface() -> None:
    group = parse_peers('{"ifname": "enp189s0f0", "peers": [{"name": "b", "address": "10.0.0.2"}]}')
    assert group.ifname == "enp189s0f0" and [p.name for p in group.peers] == ["b"]
    assert parse_peers('{"peers": []}') == PeerGroup(peers=())
    assert parse_peers("[]") == PeerGroup(peers=())


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("{bad", "not valid JSON (Expecting property name enclosed in double quotes at line 1 column 2)"),
        ("", "not valid JSON"),
        ('"10.0.0.2"', "expected a list of peers, got str"),
        ("[1]", "peer #1 is int, not an object"),
        ('[{"name": "b"}]', 'peer #1 needs "address"'),
        ('[{"address": "10.0.0.2 10.0.0.3"}]', 'peer #1 needs "address"'),
        ('[{"address": "10.0.0.2", "name": ""}]', '"name" that is not a non-empty string'),
        ('[{"address": "10.0.0.2", "port": 0}]', '"port" 0, not a TCP port 1-65535'),
        ('[{"address": "10.0.0.2", "port": 70000}]', '"port" 70000'),
        ('[{"address": "10.0.0.2", "port": "22"}]', "\"port\" '22'"),
        ('[{"address": "10.0.0.2", "port": true}]', '"port" True'),
        ('[{"address": "10.0.0.2", "npu_ips": ["29.1.1.1"]}]', '"npu_ips" that is not an object'),
        ('[{"address": "10.0.0.2", "npu_ips": {"npu0": "29.1.1.1"}}]', "npu_ips key 'npu0', not a device id"),
        ('[{"address": "10.0.0.2", "npu_ips": {"0": "29.1.1.300"}}]', "'29.1.1.300', not an IPv4 address"),
        ('[{"address": "10.0.0.2", "npu_ips": {"0": 7}}]', "7, not an IPv4 address"),
        ('[{"adress": "10.0.0.2"}]', "peer #1 has unknown key(s) 'adress' (known: name, address, port, npu_ips)"),
        ('{"peer": []}', "the object has unknown key(s) 'peer'"),
        ('{"ifname": "eth0"}', 'the object has no "peers" list'),
        ('{"ifname": 3, "peers": []}', '"ifname" 3 is not an interface name'),
        ('{"peers": {"address": "10.0.0.2"}}', "expected a list of peers, got dict"),
        ('[{"name": "b", "address": "10.0.0.2"}, {"name": "b", "address": "10.0.0.3"}]', "'b' given more than once"),
    ],
)
def test_bad_peers_name_the_problem_and_the_fix(text: str, problem: str) -> None:
    with pytest.raises(BadInputError) as err:
        parse_peers(text)
    assert err.value.problem.startswith("--peers: ") and problem in err.value.problem
    assert '"npu_ips"' in err.value.fix and "ifname" in err.value.fix
    assert "\n" not in err.value.one_line()


def _doctor(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "npuops", "doctor", *args], capture_output=True, text=True,
                          env=dict(os.environ), cwd=REPO, timeout=120, check=False)


@pytest.mark.parametrize("value", ["{bad", "[1]", '[{"address": "10.0.0.2", "port": 0}]'])
def test_cli_bad_peers_is_exit_3_one_line(value: str) -> None:
    proc = _doctor("--peers", value)
    assert proc.returncode == 3
    assert proc.stderr.startswith("npuops: error: --peers: ") and proc.stderr.count("\n") == 1
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    as_json = _doctor("--json", "--peers", value)
    assert as_json.returncode == 3
    assert json.loads(as_json.stdout)["error"]["problem"].startswith("--peers: ")


def test_cli_without_peers_the_peer_checks_skip() -> None:
    proc = _doctor("--json", "--only", "npu-peer-ping,host-peer-reach")
    assert proc.returncode == 0, proc.stderr
    checks = {c["id"]: c for c in json.loads(proc.stdout)["checks"]}
    assert {c["status"] for c in checks.values()} == {"skip"}
    assert all("--peers" in c["message"] for c in checks.values())


def test_cli_with_peers_reaches_a_listener_on_this_machine() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        peers = json.dumps([{"name": "self", "address": "127.0.0.1", "port": port, "npu_ips": {"0": "29.1.1.2"}}])
        proc = _doctor("--json", "--only", "npu-peer-ping,host-peer-reach", "--peers", peers)
    assert proc.returncode == 0, proc.stderr
    checks = {c["id"]: c for c in json.loads(proc.stdout)["checks"]}
    assert checks["host-peer-reach"]["status"] == "pass"
    assert checks["host-peer-reach"]["evidence"]["peers"]["self"]["outcome"] == "connected"
    # No NPU here: the NIC ping says why it cannot run instead of failing.
    assert checks["npu-peer-ping"]["status"] == "skip" and checks["npu-peer-ping"]["remediation"]


def test_cli_list_and_explain_the_peer_checks() -> None:
    listing = _doctor("--list", "--json")
    assert listing.returncode == 0
    found = {c["id"]: c for c in json.loads(listing.stdout)}
    assert found["npu-peer-ping"]["requires"] == ["hccn_tool"] and found["npu-peer-ping"]["level"] == 2
    assert found["host-peer-reach"]["requires"] == [] and found["host-peer-reach"]["area"] == "network"
    for check_id, phrase in (("npu-peer-ping", "hccn_tool -i <device> -ping -g address"),
                             ("host-peer-reach", "GLOO_SOCKET_IFNAME")):
        page = _doctor("--explain", check_id)
        assert page.returncode == 0 and page.stdout.startswith(f"# {check_id}: ") and phrase in page.stdout
