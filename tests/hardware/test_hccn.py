"""hccn_tool parsers: every real capture, targeted shapes, garbage, and fuzzing."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from datetime import datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npuops.hardware.hccn import (
    NET_HEALTH_STATUSES,
    NOT_PRESET_MESSAGES,
    SET_OK,
    HccnLinkChange,
    parse_hccn_gateway,
    parse_hccn_ip,
    parse_hccn_link,
    parse_hccn_link_stat,
    parse_hccn_net_health,
    parse_hccn_netdetect,
    parse_hccn_ping,
)
from npuops.parsing import ParseError
from tests.support.captures import capture
from tests.support.paths import ASCEND_FIXTURES

# ---------------------------------------------------------------------------------------------------------------
# -link -g / -net_health -g / -ip -g
# ---------------------------------------------------------------------------------------------------------------


def test_link_doc() -> None:
    link = parse_hccn_link(capture("hccn_tool-link_doc_1.txt"))
    assert link.status == "UP"
    assert link.up is True
    assert link.raw == (("link status", "UP"),)


def test_link_down_crlf_indented() -> None:
    link = parse_hccn_link("\r\n   link status: DOWN\r\n")
    assert link.status == "DOWN"
    assert link.up is False


def test_net_health_doc() -> None:
    health = parse_hccn_net_health(capture("hccn_tool-net_health_doc_1.txt"))
    assert health.status == "Init"
    assert health.healthy is False
    assert health.known is True


@pytest.mark.parametrize("status", NET_HEALTH_STATUSES)
def test_net_health_statuses(status: str) -> None:
    health = parse_hccn_net_health(f"net health status: {status}\n")
    assert health.status == status
    assert health.healthy is (status == "Success")
    assert health.known


def test_net_health_unknown_status_is_kept() -> None:
    health = parse_hccn_net_health("net health status: Something new\nextra key: 1\n")
    assert health.status == "Something new"
    assert not health.healthy
    assert not health.known
    assert ("extra key", "1") in health.raw


def test_ip_910_32g() -> None:
    ip = parse_hccn_ip(capture("hccn_tool-ip_910-32g_1.txt"))
    assert ip.address == "10.20.11.24"
    assert ip.netmask == "255.255.255.0"


def test_ip_910b() -> None:
    ip = parse_hccn_ip(capture("hccn_tool-ip_910b_1.txt"))
    assert ip.address == "29.1.112.213"
    assert ip.netmask == "255.255.0.0"


def test_ip_doc_redacted() -> None:
    ip = parse_hccn_ip(capture("hccn_tool-ip_doc_1.txt"))
    assert ip.address == "10.xx.xx.10"
    assert ip.netmask == "255.255.255.0"


def test_ip_unset_address() -> None:
    ip = parse_hccn_ip("ipaddr:\nnetmask:\n")
    assert ip.address is None
    assert ip.netmask is None


# ---------------------------------------------------------------------------------------------------------------
# -link_stat -g
# ---------------------------------------------------------------------------------------------------------------


def test_link_stat_doc() -> None:
    stat = parse_hccn_link_stat(capture("hccn_tool-link_stat_doc_1.txt"))
    assert stat.device_id == 0
    assert stat.current_time == "Wed Jun  7 10:08:28 2023"
    assert stat.link_up_count == 2
    assert stat.changes == (
        HccnLinkChange(time="Tue Jun  6 16:32:12 2023", event="LINK UP", up=True),
        HccnLinkChange(time="Tue Jun  6 16:32:10 2023", event="LINK DOWN", up=False),
        HccnLinkChange(time="Tue Jun  6 16:31:55 2023", event="LINK UP", up=True),
    )
    assert stat.link_down_count == 1


def test_link_stat_times_are_read_by_the_nics_clock() -> None:
    stat = parse_hccn_link_stat(capture("hccn_tool-link_stat_doc_1.txt"))
    assert stat.current == datetime(2023, 6, 7, 10, 8, 28)
    assert [change.at for change in stat.changes] == [
        datetime(2023, 6, 6, 16, 32, 12), datetime(2023, 6, 6, 16, 32, 10), datetime(2023, 6, 6, 16, 31, 55)]


def test_link_stat_devid_prefix_and_down_count_line() -> None:
    stat = parse_hccn_link_stat(capture("hccn_tool-link_stat_doc_2.txt"))
    assert stat.device_id == 0
    assert stat.current == datetime(2025, 10, 28, 21, 46, 46)
    assert stat.link_up_count == 2
    assert [(c.event, c.at) for c in stat.changes] == [
        ("LINK UP", datetime(2025, 10, 5, 10, 13, 51)),
        ("LINK DOWN", datetime(2025, 10, 5, 10, 13, 50)),
        ("LINK UP", datetime(2025, 10, 5, 10, 13, 35)),
    ]
    assert ("link down count", "1") in stat.raw


def test_link_stat_flapping_newest_record_down() -> None:
    stat = parse_hccn_link_stat(capture("hccn_tool-link_stat_flapping_doc_1.txt"))
    assert stat.device_id == 2
    assert stat.link_down_count == 2
    assert not stat.changes[0].up and stat.changes[0].at == datetime(2023, 9, 1, 6, 34, 43)


@pytest.mark.parametrize("time", ["Tue Feb 30 16:32:12 2023", "Tue Jun  6 25:32:12 2023", "Jux  6 16:32:12 2023",
                                  "2023-06-06 16:32:12", "yesterday"])
def test_link_stat_times_that_are_not_times_are_none(time: str) -> None:
    stat = parse_hccn_link_stat(f"current time : {time}\n    {time}    LINK DOWN\n")
    assert stat.current is None and stat.current_time == time
    assert stat.changes[0].at is None and stat.changes[0].time == time


def test_link_stat_mixed_devices_is_an_error() -> None:
    with pytest.raises(ParseError, match="more than one device"):
        parse_hccn_link_stat("[device 0]link up count : 2\n[device 1]link up count : 3\n")


# ---------------------------------------------------------------------------------------------------------------
# -ping -g address A
# ---------------------------------------------------------------------------------------------------------------

# Every ping capture with what it must parse to: (device, address, outcomes of the probes, transmitted, received,
# loss %, round trips of the replies).
PING_CAPTURES = {
    "hccn_tool-ping_doc_1.txt": (0, "10.10.100.10", ("reply", "reply", "reply"), 3, 3, 0.0, (0.067, 0.049, 0.047)),
    "hccn_tool-ping_loss_doc_1.txt": (None, None, ("timeout", "reply", "reply"), 3, 2, 33.33, (0.097, 0.066)),
    "hccn_tool-ping_910b1_1.txt": (3, "29.1.137.205", ("reply", "reply", "reply"), 3, 3, 0.0, (1.418, 0.034, 0.04)),
}


def test_every_ping_capture_has_an_expectation() -> None:
    assert {p.name for p in ASCEND_FIXTURES.glob("hccn_tool-ping*.txt")} == set(PING_CAPTURES)


@pytest.mark.parametrize("name", sorted(PING_CAPTURES))
def test_ping_captures(name: str) -> None:
    device, address, outcomes, sent, received, loss, times = PING_CAPTURES[name]
    ping = parse_hccn_ping(capture(name))
    assert (ping.device_id, ping.address) == (device, address)
    assert tuple(r.outcome for r in ping.replies) == outcomes
    assert tuple(r.time_ms for r in ping.replies if r.answered) == pytest.approx(times)
    assert (ping.transmitted, ping.received, ping.loss_percent) == (sent, received, loss)
    assert ping.reachable is (received > 0)
    assert ping.lossless is (received == sent)
    assert ping.raw == ()


def test_ping_loss_doc_keeps_the_sequence_as_printed() -> None:
    ping = parse_hccn_ping(capture("hccn_tool-ping_loss_doc_1.txt"))
    assert [r.seq for r in ping.replies] == ["O", "1", "2"]  # the doc's letter O, not a zero


def test_ping_total_loss_and_unknown_lines() -> None:
    """Derived from the 910B1 capture: every probe timed out (the vendor's "recv time out seq" line, as in the loss
    doc) and the summary says so; a line npuops does not know is kept, not dropped."""
    text = capture("hccn_tool-ping_910b1_1.txt")
    for seq, ms in (("0", "1.418000"), ("1", "0.034000"), ("2", "0.040000")):
        text = text.replace(f"recv seq={seq},time={ms}ms", f"recv time out seq={seq}")
    text = text.replace("3 received, 0.00% packet loss", "0 received, 100.00% packet loss")
    text = text.replace("recv time out seq=1", "Destination Host Unreachable\nrecv time out seq=1")
    ping = parse_hccn_ping(text)
    assert (ping.transmitted, ping.received, ping.loss_percent) == (3, 0, 100.0)
    assert not ping.reachable and not ping.lossless
    assert [r.outcome for r in ping.replies] == ["timeout"] * 3
    assert ping.raw == ("Destination Host Unreachable",)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("device 0 PING 10.10.100.10\nrecv seq=0,time=0.067000ms\n", "no 'N packets transmitted"),
        ("3 packets transmitted, 4 received, 0.00% packet loss\n", "is impossible"),
        ("3 packets transmitted, 3 received, 0.00% packet loss\nrecv seq=0,time=0.1ms\n", "after the"),
        (capture("hccn_tool-ping_doc_1.txt") + capture("hccn_tool-ping_910b1_1.txt"), "more than one ping"),
    ],
)
def test_ping_malformed(text: str, problem: str) -> None:
    with pytest.raises(ParseError, match=problem):
        parse_hccn_ping(text)


def test_ping_is_not_the_ip_query() -> None:
    with pytest.raises(ParseError, match="packets transmitted"):
        parse_hccn_ping(capture("hccn_tool-ip_910b_1.txt"))


# ---------------------------------------------------------------------------------------------------------------
# -netdetect -g / -gateway -g / the health statuses and set echo of the newer captures
# ---------------------------------------------------------------------------------------------------------------


def _loop_lines(name: str) -> list[str]:
    """The per-device lines of a capture made with a shell loop over the devices (the author's elision dropped)."""
    return [line for line in capture(name).splitlines() if line.strip() and line.strip() != "..."]


def test_netdetect_910b3_each_device() -> None:
    lines = _loop_lines("hccn_tool-netdetect_910b3_1.txt")
    assert [parse_hccn_netdetect(line).address for line in lines] == ["11.12.165.1"] * len(lines) and lines


def test_netdetect_the_driver_sources_wording_and_an_address_never_set() -> None:
    assert parse_hccn_netdetect("netdetect addr: 10.20.0.1\n").address == "10.20.0.1"
    assert parse_hccn_netdetect("netdetect addr: 0.0.0.0\n").address is None


def test_gateway_910b3_each_device() -> None:
    gateways = [parse_hccn_gateway(line) for line in _loop_lines("hccn_tool-gateway_910b3_1.txt")]
    assert [g.address for g in gateways] == ["11.12.165.1"] * 8
    assert [g.interface for g in gateways] == [f"eth{i}" for i in range(8)]


def test_a_loop_over_devices_is_not_one_answer() -> None:
    with pytest.raises(ParseError, match="one command per device"):
        parse_hccn_gateway(capture("hccn_tool-gateway_910b3_1.txt"))
    with pytest.raises(ParseError, match="not an IPv4 address"):
        parse_hccn_netdetect("netdetect address: 10.xx.xx.1\n")


@pytest.mark.parametrize(("name", "status", "healthy"), [
    ("hccn_tool-net_health_doc_2.txt", "Fault", False),
    ("hccn_tool-net_health_doc_3.txt", "Success", True),
    ("hccn_tool-net_health_910a_1.txt", "Socket failed", False),
])
def test_net_health_captures(name: str, status: str, healthy: bool) -> None:
    health = parse_hccn_net_health(capture(name))
    assert (health.status, health.healthy, health.known) == (status, healthy, True)


def test_link_down_capture() -> None:
    assert parse_hccn_link(capture("hccn_tool-link_doc_2.txt")).up is False


def test_the_set_echo_is_the_captured_one() -> None:
    assert set(_loop_lines("hccn_tool-tls_set_910b3_1.txt")) == {SET_OK}
    assert set(NOT_PRESET_MESSAGES) == {"-ip", "-gateway"}


# ---------------------------------------------------------------------------------------------------------------
# Garbage and fuzzing
# ---------------------------------------------------------------------------------------------------------------

PARSERS: dict[str, Callable[[str], object]] = {
    "link": parse_hccn_link,
    "net_health": parse_hccn_net_health,
    "ip": parse_hccn_ip,
    "link_stat": parse_hccn_link_stat,
    "ping": parse_hccn_ping,
    "netdetect": parse_hccn_netdetect,
    "gateway": parse_hccn_gateway,
}


@pytest.mark.parametrize("name", sorted(PARSERS))
@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "empty output"),
        ("\n \r\n", "empty output"),
        ("bash: hccn_tool: command not found\n", "command not found"),
        ("-bash: /usr/local/Ascend/driver/tools/hccn_tool: No such file or directory\n", "No such file or directory"),
        ("\x00\x01\x02\x03binary\xff", "binary data"),
        ("\ufffd\ufffd\ufffdPNG", "binary data"),
    ],
)
def test_garbage_raises_parse_error_naming_the_problem(name: str, text: str, problem: str) -> None:
    with pytest.raises(ParseError) as err:
        PARSERS[name](text)
    assert problem in str(err.value)


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_prose_is_not_accepted(name: str) -> None:
    with pytest.raises(ParseError):
        PARSERS[name]("hello world\nthis is not hccn_tool output\n")


def test_wrong_command_output_is_rejected() -> None:
    with pytest.raises(ParseError, match="no 'link status:' line"):
        parse_hccn_link(capture("hccn_tool-net_health_doc_1.txt"))
    with pytest.raises(ParseError, match="no 'net health status:' line"):
        parse_hccn_net_health(capture("hccn_tool-link_doc_1.txt"))
    with pytest.raises(ParseError, match="no 'ipaddr:' or 'netmask:' line"):
        parse_hccn_ip(capture("hccn_tool-link_doc_1.txt"))


HCCN_CAPTURES = [capture(p.name) for p in sorted(ASCEND_FIXTURES.glob("hccn_tool-*.txt"))]


@st.composite
def mutated_capture(draw: st.DrawFn) -> str:
    """A real hccn_tool capture with a few random edits."""
    text = draw(st.sampled_from(HCCN_CAPTURES))
    for _ in range(draw(st.integers(1, 6))):
        op = draw(st.sampled_from(["insert", "delete", "truncate", "drop_line", "dup_line", "crlf", "replace"]))
        pos = draw(st.integers(0, max(len(text), 1)))
        if op == "insert":
            text = text[:pos] + draw(st.text(min_size=1, max_size=8)) + text[pos:]
        elif op == "delete":
            text = text[:pos] + text[pos + draw(st.integers(1, 20)) :]
        elif op == "truncate":
            text = text[:pos]
        elif op == "replace":
            piece = draw(st.sampled_from([":", "[devid 9]", "[device 1]", " TLV", "\n", "...", "xxx", "  ", "LINK UP"]))
            text = text[:pos] + piece + text[pos + 1 :]
        else:
            lines = text.split("\n")
            i = pos % len(lines)
            if op == "drop_line":
                del lines[i]
            elif op == "dup_line":
                lines.insert(i, lines[i])
            text = "\r\n".join(lines) if op == "crlf" else "\n".join(lines)
    return text


def _only_parse_error(parse: Callable[[str], object], text: str) -> None:
    with contextlib.suppress(ParseError):
        parse(text)


FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("name", sorted(PARSERS))
@FUZZ
@given(text=st.text())
def test_fuzz_text(name: str, text: str) -> None:
    _only_parse_error(PARSERS[name], text)


@pytest.mark.parametrize("name", sorted(PARSERS))
@FUZZ
@given(text=mutated_capture())
def test_fuzz_mutated_captures(name: str, text: str) -> None:
    _only_parse_error(PARSERS[name], text)


@pytest.mark.parametrize("name", sorted(PARSERS))
@FUZZ
@given(text=st.text(alphabet="abc :[]=*0123456789.\n\t-/devidTLVLINKUPDOWN", max_size=200))
def test_fuzz_structured_alphabet(name: str, text: str) -> None:
    _only_parse_error(PARSERS[name], text)
