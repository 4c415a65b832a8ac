"""The quoting of npuops' renderers as the real systemd reads it (PID 1 in a namespace, tests/support/systemd.py).

A corpus of hostile values that the renderers accept goes into one unit: its Description= (unit_text), the
arguments of its ExecStart= (systemd_quote) and the variables of its EnvironmentFile= (env_quote). systemd runs
it; the command prints the argv and environment it got. Every value must come back exactly as it went in, and
the ports of systemd's parsers in tests/support/unit_syntax.py (which the hypothesis tests of
tests/launch/test_hostile_values.py use) must read the files as systemd did. Then what the renderers refuse is
refused by `npuops launch` on the node before anything is written: a model directory whose name holds a newline
(it would have added `[Service]` and `ExecStartPre=+` lines), an empty or root --service-user, a --host that is
no address.
"""

from __future__ import annotations

import json

import pytest

from npuops.templating import env_quote, systemd_quote, unit_text
from tests.support.systemd import ServingNode
from tests.support.unit_syntax import expand_specifiers, parse_env_file, parse_unit, split_command_line
from tests.systemd.test_refusals import model_copy, refused

pytestmark = [pytest.mark.engine, pytest.mark.slow, pytest.mark.systemd]

CORPUS = ["%", "%n", "%%", "%%n", "$", "$$", "${HOME}", "$HOME", "$(id)", "`id`", '"', "'", "\\", "\\n", "\\x41",
          ";", " ", "=", "#", "[Service]", "ExecStartPre=+/bin/sh -c id", "é", "鍵", "\u2028", "\x85", "𐀀",
          "a b  c", " leading", "trailing ", "it's", 'back\\slash"quote', "--flag=value", "", "a;b", "\\;", "'\"'",
          "%i%I%h", "x" * 2000]
UNIT = "npuops-quoting.service"
OUTPUT = "/run/npuops-quoting.json"
ENV_FILE = "/etc/npuops-quoting.env"
SCRIPT = ("import json, os, sys; print(json.dumps({'argv': sys.argv[1:], "
          "'env': {k: v for k, v in os.environ.items() if k.startswith('Q_')}}))")


def test_systemd_reads_back_every_value_the_renderers_wrote(serving_node: ServingNode) -> None:
    node = serving_node
    description = " ".join(unit_text(value, "the corpus value") for value in CORPUS[:20])
    exec_start = " ".join(systemd_quote(arg) for arg in ["/usr/bin/python3", "-c", SCRIPT, *CORPUS])
    unit = (f"[Unit]\nDescription={description}\n\n[Service]\nType=oneshot\nEnvironmentFile={ENV_FILE}\n"
            f"ExecStart={exec_start}\nStandardOutput=file:{OUTPUT}\n")
    env = "".join(f"Q_{i}={env_quote(value)}\n" for i, value in enumerate(CORPUS))
    (node.systemd.root / ENV_FILE.lstrip("/")).write_text(env, encoding="utf-8")
    (node.systemd.root / "etc/systemd/system" / UNIT).write_text(unit, encoding="utf-8")
    try:
        node.systemd.check(["systemctl", "daemon-reload"])
        node.systemd.check(["systemctl", "start", UNIT], timeout=120)
        got = json.loads(node.systemd.check(["cat", OUTPUT]))
        shown = node.systemd.check(["systemctl", "show", "-p", "Description", "--value", UNIT]).rstrip("\n")
    finally:
        node.systemd.run(["rm", "-f", f"/etc/systemd/system/{UNIT}", ENV_FILE, OUTPUT])
        node.systemd.run(["systemctl", "daemon-reload"])
    # systemd's own reading: every argument and variable exactly as given, and nothing else.
    assert got["argv"] == CORPUS
    assert got["env"] == {f"Q_{i}": value for i, value in enumerate(CORPUS)}
    assert shown == " ".join(CORPUS[:20])
    # The ports read the same files the same way.
    settings = parse_unit(unit)
    assert [(section, key) for section, key, _ in settings] == [
        ("Unit", "Description"), ("Service", "Type"), ("Service", "EnvironmentFile"), ("Service", "ExecStart"),
        ("Service", "StandardOutput")]
    assert expand_specifiers(settings[0][2]) == shown
    assert split_command_line(settings[3][2])[3:] == got["argv"]
    assert parse_env_file(env) == got["env"]


def test_launch_refuses_values_that_would_inject_into_the_unit(serving_node: ServingNode) -> None:
    node = serving_node
    vllm = str(node.venv / "bin" / "vllm")
    injected = model_copy(node, "tiny\n[Service]\nExecStartPre=+touch owned")
    try:
        line = refused(node, "inject", str(injected), "--vllm", vllm)
        assert "holds a control character ('\\n'" in line and "model directory" in line, line
        model = str(node.model)
        for flags, problem in ((("--service-user", ""), "--service-user '' is not a user name"),
                               (("--service-user", "npuops\nUser=root"), "is not a user name"),
                               (("--service-user", "root"), "--allow-root"),
                               (("--host", "0.0.0.0; rm"), "--host '0.0.0.0; rm' is neither")):
            line = refused(node, "inject", model, "--vllm", vllm, *flags)
            assert problem in line, (flags, line)
    finally:
        node.systemd.run(["rm", "-rf", str(injected)])
    # (`refused` saw no unit file and no instance directory written for any of them.)
