"""CANN's and vllm-ascend's log trees, as collect (root) takes them from what the service user writes (issue 45
review, findings 1 and 7): an instance's ascend_log_path is read as vllm.yaml's own key and followed only below the
service user's home or the instance's status directory, into a directory that user owns; from every tree only log
files that the tree's user owns; each part of a tree walked and ranked on its own, so a flood of files or dates in
the future in one part hides no other's logs, and what was cut is said."""

from __future__ import annotations

import json
import os
import pwd
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npuops.support.bundle import Bundle
from npuops.support.log_trees import ascend_log_path
from tests.collect.test_collect_hostile import Node, everything, skipped

SERVICE = pwd.getpwnam("nobody")  # a user of this machine that is not root, as the engine's service user
OTHER_UID = 4242  # a uid that is neither root nor the service user


def notes(bundle: Bundle, what: str) -> list[str]:
    """Everything the manifest says of `what` (a part can be cut, and hold files left out for other reasons)."""
    return [s.why for s in bundle.skipped if s.what == what]


def _with_log_path(node: Node, value: str, *, name: str = "demo", **overrides: object) -> Path:
    """An instance whose vllm.yaml moves vllm-ascend's logs to `value` (as vLLM's config file holds it: the
    additional config as a JSON string); returns its status directory."""
    status_dir = node.instance(name, service_user=SERVICE.pw_name, **overrides)
    config = json.dumps({"ascend_log_path": value})
    (node.state / name / "vllm.yaml").write_text(f'model: "/models/tiny"\nadditional-config: {json.dumps(config)}\n')
    return status_dir


def _plant(path: Path, text: str, uid: int = SERVICE.pw_uid, mtime: float | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.chown(path, uid, -1)
    if mtime is not None:
        os.utime(path, (mtime, mtime))


def _chown_tree(top: Path, uid: int) -> None:
    for directory, _dirs, _files in os.walk(top):
        os.chown(directory, uid, -1)


def test_an_ascend_log_path_outside_the_service_users_places_pulls_nothing(tmp_path: Path) -> None:
    node = Node(tmp_path)
    _with_log_path(node, "/etc")
    etc = node.root / "etc"
    _plant(etc / "shadow", node.shadow_text, uid=0)
    _plant(etc / "ssh" / "ssh_host_ed25519_key.txt", "-----BEGIN OPENSSH PRIVATE KEY-----\n", uid=0)
    _plant(etc / "owned-by-service.log", "even the service user's file: /etc is no place it logs\n")

    bundle = node.collect("demo")
    assert not [f.path for f in bundle.files if f.path.startswith("ascend-logs/demo-vllm-ascend")]
    assert b"BEGIN OPENSSH" not in everything(bundle) and node.shadow_text.encode() not in everything(bundle)
    why = skipped(bundle)["ascend-logs/demo-vllm-ascend"]
    assert "/etc is not under" in why and "home" in why and "status directory" in why


@pytest.mark.parametrize(("value", "said"), [("{status}/a\0b", "NUL"), ("~/logs", "not an absolute path"),
                                             (12345, "not a string"), ("{status}/../../../etc", "climbs")])
def test_a_hostile_ascend_log_path_is_said_in_the_manifest_not_a_traceback(tmp_path: Path, value: object,
                                                                             said: str) -> None:
    node = Node(tmp_path)
    status_dir = node.var / "npuops-demo"
    _with_log_path(node, "x")
    config = json.dumps({"ascend_log_path": value.format(status=status_dir) if isinstance(value, str) else value})
    (node.state / "demo" / "vllm.yaml").write_text(f"additional-config: {json.dumps(config)}\n")
    bundle = node.collect("demo")
    assert said in skipped(bundle)["ascend-logs/demo-vllm-ascend"]


def test_ascend_log_path_is_only_the_additional_configs_own_key(tmp_path: Path) -> None:
    node = Node(tmp_path)
    status_dir = node.instance("demo", service_user=SERVICE.pw_name)
    # The words in another value of vllm.yaml, and in another key of the additional config: neither is the key.
    _plant(status_dir / "decoy" / "found.log", "a decoy log\n")
    (node.state / "demo" / "vllm.yaml").write_text(
        f"served-model-name: 'tiny ascend_log_path\": \"{status_dir}/decoy'\n"
        f"additional-config: '{{\"note\": \"ascend_log_path: {status_dir}/decoy\"}}'\n")
    bundle = node.collect("demo")
    assert not [f.path for f in bundle.files if "decoy" in f.path]
    assert not [w for w in skipped(bundle) if w.startswith("ascend-logs/demo-vllm-ascend")]


@given(text=st.text(max_size=200) | st.binary(max_size=200).map(lambda b: b.decode("latin-1")))
@settings(max_examples=200, deadline=None)
def test_any_vllm_yaml_gives_a_path_or_a_reason_never_an_exception(text: str) -> None:
    for data in (text.encode("utf-8", "surrogatepass"), f"additional-config: {json.dumps(text)}\n".encode()):
        try:
            found = ascend_log_path(data)
        except ValueError as exc:
            assert str(exc).startswith(("its vllm.yaml", "the additional-config", "the ascend_log_path"))
        else:
            assert found is None or isinstance(found, str)


@pytest.mark.parametrize("where", ["home", "status-dir"])
def test_a_log_path_below_the_service_users_places_takes_its_log_files_only(tmp_path: Path, where: str) -> None:
    node = Node(tmp_path)
    home = node.root / SERVICE.pw_dir.lstrip("/")
    status_dir = node.var / "npuops-demo"
    logs = (home / "vllm-logs") if where == "home" else (status_dir / "ascend")
    _with_log_path(node, f"{SERVICE.pw_dir}/vllm-logs" if where == "home" else str(logs))
    _plant(logs / "vllm_ascend_001.log", "INFO the engine's own log\n")
    _plant(logs / "rank0" / "plog-12_34.log", "[ERROR] a plog\n")
    _plant(logs / "vllm_ascend.log.3", "INFO a rotated log\n")
    _plant(logs / "root-owned.log", node.shadow_text, uid=0)  # the service user could not have written it
    _plant(logs / "other-user.log", node.shadow_text, uid=OTHER_UID)
    _plant(logs / "id_ed25519", "-----BEGIN OPENSSH PRIVATE KEY-----\n")  # its own, but no log
    _plant(logs / "empty.log", "")
    _chown_tree(logs, SERVICE.pw_uid)

    bundle = node.collect("demo")
    taken = sorted(f.path.removeprefix("ascend-logs/demo-vllm-ascend/") for f in bundle.files
                   if f.path.startswith("ascend-logs/demo-vllm-ascend/"))
    assert taken == ["rank0/plog-12_34.log", "vllm_ascend.log.3", "vllm_ascend_001.log"]
    assert node.shadow_text.encode() not in everything(bundle) and b"OPENSSH" not in everything(bundle)
    said = notes(bundle, "ascend-logs/demo-vllm-ascend")
    assert any("2 files not owned by" in n for n in said) and any("1 files not named like a log" in n for n in said)
    assert any("1 files empty" in n for n in said), said


def test_a_log_path_directory_the_service_user_does_not_own_is_not_looked_into(tmp_path: Path) -> None:
    node = Node(tmp_path)
    home = node.root / SERVICE.pw_dir.lstrip("/")
    _with_log_path(node, f"{SERVICE.pw_dir}/shared")
    _plant(home / "shared" / "owned.log", "the service user's file in root's directory\n")
    os.chown(home / "shared", 0, -1)
    bundle = node.collect("demo")
    assert not [f.path for f in bundle.files if f.path.startswith("ascend-logs/demo-vllm-ascend")]
    assert "not looked into" in skipped(bundle)["ascend-logs/demo-vllm-ascend"]


def test_each_cann_tree_takes_only_the_files_of_its_own_user(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.instance("demo", service_user=SERVICE.pw_name)
    service_plog = node.root / SERVICE.pw_dir.lstrip("/") / "ascend/log/debug/plog"
    root_plog = node.root / "root/ascend/log/debug/plog"
    _plant(service_plog / "plog-1_1.log", "[ERROR] the service user's plog\n")
    _plant(service_plog / "plog-2_2.log", node.shadow_text, uid=0)
    _plant(root_plog / "plog-3_3.log", "[ERROR] root's plog\n", uid=0)
    _plant(root_plog / "plog-4_4.log", node.shadow_text, uid=SERVICE.pw_uid)
    bundle = node.collect("demo")
    paths = {f.path for f in bundle.files if f.path.startswith("ascend-logs/")}
    assert paths == {f"ascend-logs/{SERVICE.pw_name}/debug/plog/plog-1_1.log",
                     "ascend-logs/root/debug/plog/plog-3_3.log"}
    assert node.shadow_text.encode() not in everything(bundle)


def _real_plogs(top: Path, uid: int) -> set[str]:
    names = {"debug/plog/plog-100_1.log", "run/plog/plog-200_1.log", "debug/device-0/device-300_1.log",
             "vllm_ascend/vllm_ascend.log"}
    for name in names:
        _plant(top / name, f"[ERROR] real log {name}\n", uid=uid)
    return names


def test_a_flood_of_empty_files_in_one_part_hides_no_real_log_and_the_cut_is_said(tmp_path: Path) -> None:
    node = Node(tmp_path)
    top = node.root / "root/ascend/log"
    real = _real_plogs(top, 0)
    wide = top / "run/plog/wide"
    wide.mkdir(parents=True)
    for i in range(25_000):
        os.close(os.open(wide / f"plog-{i}.log", os.O_WRONLY | os.O_CREAT, 0o644))
    bundle = node.collect()
    paths = {f.path.removeprefix("ascend-logs/root/") for f in bundle.files if f.path.startswith("ascend-logs/root/")}
    assert paths == real
    assert any("was cut" in why for why in notes(bundle, "ascend-logs/root/run/plog"))


def test_files_dated_in_the_future_rank_after_the_real_logs(tmp_path: Path) -> None:
    node = Node(tmp_path)
    top = node.root / "root/ascend/log"
    real = _real_plogs(top, 0)
    year_2099 = time.mktime((2099, 1, 1, 0, 0, 0, 0, 0, 0))
    for part in ("debug/plog", "vllm_ascend"):
        for i in range(60):
            _plant(top / part / f"plog-9{i}_1.log", "junk\n", uid=0, mtime=year_2099)
    bundle: Bundle = node.collect()
    paths = {f.path.removeprefix("ascend-logs/root/") for f in bundle.files if f.path.startswith("ascend-logs/root/")}
    assert real <= paths
    assert len(paths & {p for p in paths if "/plog-9" in p}) == 2 * (40 - 1)  # each part: its real log, then 39
    assert any("60 files dated in the future" in why for why in notes(bundle, "ascend-logs/root/debug/plog"))
