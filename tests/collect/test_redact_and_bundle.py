"""A support bundle's two guarantees, on generated inputs: no secret survives the redactor in any form it could
take in a file, and the manifest matches the archive (npuops/support/redact.py, npuops/support/bundle.py)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import tarfile
import urllib.parse
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npuops.support.bundle import MANIFEST, Bundle, read_bundle
from npuops.support.redact import MARK, MIN_SECRET_CHARS, Redactor, secret_values

# Hostile secrets: any printable text of a real key's length, with quotes, spaces, backslashes, $ and unicode.
secrets_st = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\r\x00"),
                     min_size=MIN_SECRET_CHARS, max_size=40).filter(lambda s: s.strip() == s and MARK not in s)
noise = st.text(max_size=200)


def forms(secret: str) -> list[str]:
    """How a secret can appear in a file: raw, inside a JSON string, URL-encoded."""
    return [secret, json.dumps(secret)[1:-1], urllib.parse.quote(secret, safe=""), urllib.parse.quote_plus(secret)]


@given(secret=secrets_st, before=noise, after=noise, how=st.integers(min_value=0, max_value=3))
@settings(max_examples=300, deadline=None)
def test_a_known_secret_leaves_no_trace_in_any_of_its_forms(secret: str, before: str, after: str, how: int) -> None:
    planted = before + forms(secret)[how] + after
    out = Redactor([secret]).text(planted)
    for form in forms(secret):
        assert form not in out or form in (before + after).replace(secret, ""), (secret, out)
    assert MARK in out


@given(secret=st.from_regex(r"[A-Za-z0-9_\-.~+/=]{1,40}", fullmatch=True), name=st.sampled_from(
    ["VLLM_API_KEY", "HF_TOKEN", "RAY_AUTH_TOKEN", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD", "MY_CREDENTIALS"]))
@settings(max_examples=200, deadline=None)
def test_a_secret_the_redactor_was_not_told_is_caught_by_its_shape(secret: str, name: str) -> None:
    r = Redactor()
    for template in ("{n}={s}", '{n}="{s}"', "Environment={n}={s} PATH=/usr/bin",
                     "ExecStart=/usr/bin/vllm serve --api-key {s} --port 8000", "--token={s}",
                     "Authorization: Bearer {s}", '{{"api_key": "{s}"}}'):
        text, expected = template.format(n=name, s=secret), template.format(n=name, s=MARK)
        assert r.text(text) == expected, (text, r.text(text))


@pytest.mark.parametrize("text", ["MAX_NUM_BATCHED_TOKENS=2048", "max_num_batched_tokens: 4096",
                                  '"prompt_tokens": 12', "KEYBOARD=us", "--max-tokens 64", "keyword arguments"])
def test_what_only_looks_like_a_secret_by_its_letters_is_kept(text: str) -> None:
    assert Redactor(["unrelated-secret"]).text(text) == text


def test_which_env_variables_are_secret() -> None:
    env = {"VLLM_API_KEY": "k1", "HF_TOKEN": "k2", "RAY_AUTH_TOKEN": "k3", "AWS_SECRET_ACCESS_KEY": "k4",
           "MAX_NUM_BATCHED_TOKENS": "2048", "PATH": "/usr/bin", "KEYBOARD": "us", "EMPTY_TOKEN": ""}
    assert sorted(secret_values(env)) == ["k1", "k2", "k3", "k4"]


@given(secret=secrets_st, prefix=st.binary(max_size=64), suffix=st.binary(max_size=64))
@settings(max_examples=150, deadline=None)
def test_bytes_that_are_not_utf8_pass_through_and_the_secret_still_goes(secret: str, prefix: bytes,
                                                                        suffix: bytes) -> None:
    data = prefix + secret.encode() + suffix
    out = Redactor([secret]).data(data)
    assert secret.encode() not in out.replace(MARK.encode(), b"") or secret.encode() in prefix + suffix
    assert out.startswith(Redactor([secret]).data(prefix)[:0])


def _members(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore[union-attr]


@given(files=st.dictionaries(st.from_regex(r"[a-z]{1,8}(/[a-z0-9_-]{1,8}){0,3}", fullmatch=True),
                             st.binary(max_size=3000), min_size=1, max_size=8))
@settings(max_examples=40, deadline=None)
def test_the_manifest_matches_the_archive(files: dict[str, bytes], tmp_path_factory: pytest.TempPathFactory) -> None:
    bundle = Bundle(Redactor(["s3cret-value"]), file_cap=1000, bundle_cap=50_000)
    for path, data in files.items():
        bundle.add(path, data, f"source of {path}")
    out = bundle.write(tmp_path_factory.mktemp("bundle") / "b.tar.gz")
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o600
    members = _members(out)
    manifest = json.loads(members.pop(MANIFEST))
    listed = {f["path"]: f for f in manifest["files"]}
    assert set(listed) == set(members)
    for path, data in members.items():
        assert listed[path]["sha256"] == hashlib.sha256(data).hexdigest() and listed[path]["size"] == len(data)
        assert listed[path]["truncated"] == (len(Redactor(["s3cret-value"]).data(files[path])) > 1000)
        assert len(data) <= 1000 + 200
    assert read_bundle(out) == (manifest, members)


def test_caps_keep_a_logs_end_and_skip_what_the_bundle_has_no_room_for(tmp_path: Path) -> None:
    bundle = Bundle(Redactor(), file_cap=100, bundle_cap=300)
    log = b"".join(b"line %03d\n" % i for i in range(100))
    assert bundle.add("a.log", log, "journalctl")
    kept = bundle.data("a.log")
    assert kept.endswith(b"line 099\n") and b"line 000" not in kept and b"cut by npuops collect" in kept
    assert bundle.add("b.log", b"x" * 90, "b") and not bundle.add("c.log", b"y" * 90, "c")
    assert [s.what for s in bundle.skipped] == ["c.log"] and "cap of" in bundle.skipped[0].why
    with pytest.raises(ValueError):
        bundle.add("../escape", b"", "x")
    with pytest.raises(ValueError):
        bundle.add("/etc/passwd", b"", "x")


def test_a_bundle_with_a_link_or_an_escaping_member_is_refused(tmp_path: Path) -> None:
    for name, kind in (("../x", tarfile.REGTYPE), ("link", tarfile.SYMTYPE)):
        path = tmp_path / f"{kind!r}.tar.gz"
        with tarfile.open(path, "w:gz") as tar:
            info = tarfile.TarInfo(MANIFEST)
            info.size = 2
            tar.addfile(info, io.BytesIO(b"{}"))
            bad = tarfile.TarInfo(name)
            bad.type = kind
            bad.linkname = "/etc/shadow" if kind == tarfile.SYMTYPE else ""
            tar.addfile(bad, io.BytesIO(b""))
        with pytest.raises(ValueError):
            read_bundle(path)
