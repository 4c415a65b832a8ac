"""What collect says about a bundle is redacted like the files in it (issue 45 review, finding 4): a record problem
that quotes a token, a file named after a key, a failure's message, in manifest.json, in the file names of the
archive and in the summary `collect --json` prints."""

from __future__ import annotations

import json
import secrets
import subprocess
import tarfile
from pathlib import Path

from npuops.support.bundle import Bundle
from npuops.support.redact import MARK, Redactor
from tests.collect.test_collect_hostile import Node
from tests.support.npuops_cli import npuops_argv


def test_a_token_a_record_or_a_file_name_carries_is_redacted_in_the_manifest_and_the_summary(tmp_path: Path) -> None:
    node = Node(tmp_path)
    token = "ghp_" + secrets.token_hex(18)
    key = "sk-npuops-" + secrets.token_hex(12)
    node.instance()
    (node.state / "demo" / "env").write_text(f'VLLM_API_KEY="{key}"\n')
    record = json.loads((node.state / "demo" / "instance.json").read_text())
    record["port"] = token  # the record is unusable: its problem quotes the value
    (node.state / "demo" / "instance.json").write_text(json.dumps(record))
    plog = node.root / "root/ascend/log/debug/plog"
    plog.mkdir(parents=True)
    (plog / f"plog-{key}.log").write_text("[ERROR] a line\n")
    (plog / f"plog {token}.log").symlink_to("/etc/hostname")  # skipped: its name in the manifest's reasons
    (plog / f"device-{key}.log").symlink_to("/etc/hostname")
    output = tmp_path / "bundle.tar.gz"
    done = subprocess.run(npuops_argv("collect", "--output", str(output), "--json"), env=node.env(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    with tarfile.open(output) as tar:
        names = tar.getnames()
        manifest_text = tar.extractfile("manifest.json").read().decode()  # type: ignore[union-attr]
    for secret in (token, key):
        assert secret not in manifest_text, secret
        assert secret not in done.stdout, secret
        assert not any(secret in name for name in names), names
    summary = json.loads(done.stdout)
    manifest = json.loads(manifest_text)
    # The record's problem is there, with the value masked, in both.
    assert any(s["what"] == "instances/demo/instance.json" and MARK in s["why"] for s in manifest["skipped"])
    assert any(s["what"] == "instances/demo/instance.json" and MARK in s["why"] for s in summary["skipped"])
    assert f"ascend-logs/root/debug/plog/plog-{MARK}.log" in names
    # The manifest names the archive's members as they are.
    assert {f["path"] for f in manifest["files"]} == set(names) - {"manifest.json"}


def test_every_string_of_the_manifest_passes_the_redactor(tmp_path: Path) -> None:
    key = "sk-" + secrets.token_hex(10)
    bundle = Bundle(Redactor([key]))
    bundle.meta.update({"host": f"h-{key}", "instances": [key], key: 1})
    bundle.add(f"logs/{key}.log", b"x", f"/var/log/{key}.log")
    bundle.add(f"logs/{key}x.log", b"y", "elsewhere")  # another file, whose name differs in the secret only
    bundle.add(f"logs/{key}.log", b"z", "again")
    bundle.skip(f"what {key}", f"the status failed: {key}")
    bundle.write(tmp_path / "b.tar.gz")
    with tarfile.open(tmp_path / "b.tar.gz") as tar:
        text = b"".join(tar.extractfile(m).read() for m in tar.getmembers()).decode()  # type: ignore[union-attr]
        assert key not in text and not any(key in name for name in tar.getnames())
    assert key not in json.dumps(bundle.manifest())
    assert {f.path: bundle.data(f.path) for f in bundle.files} == {"logs/[REDACTED].log": b"x",
                                                                   "logs/[REDACTED]x.log": b"y",
                                                                   "logs/[REDACTED].log.2": b"z"}
