#!/usr/bin/env python3
"""A stateful stand-in for the driver's `hccn_tool`, for the NPU network provisioning tests (no NPU here).

Its state is what the real tool keeps: /etc/hccn.conf lines `address_N=...`, `netmask_N=...`, `gateway_N=...`,
`netdetect_N=...` (hicann/driver hccn_tool cfg.c; a real file in tests/fixtures/ascend/hccn.conf_910b1_1.txt), so a
set changes what the next get returns. Beside it, `<conf>.standin.json` says what the test wants the hardware to
do: {"devices": 8, "down": [3]} (ports whose link never comes up), and `<conf>.calls` gets one line per call.

Every answer has the shape of a recorded real output (tests/fixtures/ascend/INDEX.md) or, for the messages no
capture shows, of the driver's own source (hicann/driver src/custom/network/hccn/ascend910B/hccn_tool):
  -ip -g            "ipaddr:A" / "netmask:M"                        hccn_tool-ip_910b_1.txt
                    stderr "Get ipconf failed, because no ip was preset there!" (never set)   cmd.c
  -gateway -g       "default gateway:G, Iface:ethN"                  hccn_tool-gateway_910b3_1.txt
                    stderr "Get gateway failed, because no gateway was preset there!"        cmd.c
  -netdetect -g     "netdetect address: D" (0.0.0.0 never set)       hccn_tool-netdetect_910b3_1.txt, tool_ops.c
  -link -g          "link status: UP|DOWN"                           hccn_tool-link_doc_1.txt, _doc_2.txt
  -net_health -g    "net health status: Success|Init|Fault"          hccn_tool-net_health_doc_1/2/3.txt
  -ping -g address  "device N PING A" / "recv seq=..,time=..ms" / summary; "recv time out seq=.." on loss
                                                                     hccn_tool-ping_910b1_1.txt, _loss_doc_1.txt
  any set           "Cmd executed successfully!"                     hccn_tool-tls_set_910b3_1.txt, cmd.c
  errors (stderr)   "The ip address you configured is invalid!", "The segment of configured gateway doesn't
                    match that of the configured ip adress!", "The device is not exist!", "Get unknown option!"
                                                                     cmd.c
Exit status: 0, or 1 for any failure (the real codes are internal error numbers; only zero/non-zero is documented).

Install with `install_hccn_standin(bin_path, conf_path, devices=8, down=())`, or write `standin_script(conf_path)`
and `knobs_json(...)` onto a test host: the conf path is written into the script, so a test host's own
/etc/hccn.conf (an overlay) or a test directory holds its state.
"""

from __future__ import annotations

import ipaddress
import json
import sys
from pathlib import Path

CONF = "/etc/hccn.conf"  # replaced by install_hccn_standin
SET_OK = "Cmd executed successfully!"


def _read_conf(path: Path) -> dict[str, str]:
    values: dict[str, str] = {}
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            key, sep, value = line.partition("=")
            if sep:
                values[key.strip()] = value.strip()
    return values


def _write_conf(path: Path, values: dict[str, str]) -> None:
    keys = ("address", "netmask", "netdetect", "gateway")  # per device, in the order the real file has them

    def order(key: str) -> tuple[int, int, str]:
        name, _, device = key.rpartition("_")
        return (int(device) if device.isdigit() else 0, keys.index(name) if name in keys else len(keys), name)

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{k}={values[k]}\n" for k in sorted(values, key=order)), encoding="utf-8")


def _fail(message: str) -> int:
    print(message, file=sys.stderr)
    return 1


def _valid_ip(text: str) -> bool:
    try:
        ipaddress.IPv4Address(text)
    except ValueError:
        return False
    return True


def _get(query: str, device: int, conf: dict[str, str], down: bool) -> int:
    address, netmask = conf.get(f"address_{device}"), conf.get(f"netmask_{device}")
    detect, gateway = conf.get(f"netdetect_{device}"), conf.get(f"gateway_{device}")
    if query == "-ip":
        if not address:
            return _fail("Get ipconf failed, because no ip was preset there!")
        print(f"ipaddr:{address}\nnetmask:{netmask}")
    elif query == "-gateway":
        if not gateway:
            return _fail("Get gateway failed, because no gateway was preset there!")
        print(f"default gateway:{gateway}, Iface:eth{device}")
    elif query == "-netdetect":
        print(f"netdetect address: {detect or '0.0.0.0'}")
    elif query == "-link":
        print(f"link status: {'DOWN' if down else 'UP'}")
    elif query == "-net_health":
        print(f"net health status: {'Fault' if down else ('Success' if detect and address else 'Init')}")
    else:
        return _fail("Get unknown option!")
    return 0


def _ping(device: int, target: str, conf: dict[str, str], down: bool) -> int:
    reachable = not down and bool(conf.get(f"address_{device}")) and _valid_ip(target)
    lines = [f"device {device} PING {target}"]
    if reachable:
        lines += [f"recv seq={seq},time=0.0{4 + seq}0000ms" for seq in range(3)]
        lines.append("3 packets transmitted, 3 received, 0.00% packet loss")
    else:
        lines += [f"recv time out seq={seq}" for seq in range(3)]
        lines.append("3 packets transmitted, 0 received, 100.00% packet loss")
    print("\n".join(lines))
    return 0 if reachable else 1


def _set(device: int, args: list[str], conf: dict[str, str]) -> int:
    if args[:1] == ["-ip"] and len(args) == 6 and args[2] == "address" and args[4] == "netmask":
        try:
            ipaddress.IPv4Network(f"0.0.0.0/{args[5]}")
        except ValueError:
            return _fail("Get invalid parameters!")
        if not _valid_ip(args[3]):
            return _fail("The ip address you configured is invalid!")
        conf[f"address_{device}"], conf[f"netmask_{device}"] = args[3], args[5]
    elif args[:1] == ["-gateway"] and len(args) == 4 and args[2] == "gateway":
        address, netmask = conf.get(f"address_{device}"), conf.get(f"netmask_{device}")
        if not _valid_ip(args[3]):
            return _fail("The ip address you configured is invalid!")
        if not address or ipaddress.IPv4Address(args[3]) not in ipaddress.IPv4Network(
                f"{address}/{netmask}", strict=False):
            return _fail("The segment of configured gateway doesn't match that of the configured ip adress!")
        conf[f"gateway_{device}"] = args[3]
    elif args[:1] == ["-netdetect"] and len(args) == 4 and args[2] == "address":
        if not _valid_ip(args[3]):
            return _fail("The ip address you configured is invalid!")
        conf[f"netdetect_{device}"] = args[3]
    else:
        return _fail("Get unknown option!")
    print(SET_OK)
    return 0


def main(argv: list[str]) -> int:
    conf_path = Path(CONF)
    knobs_path = Path(f"{CONF}.standin.json")
    knobs = json.loads(knobs_path.read_text(encoding="utf-8")) if knobs_path.exists() else {}
    with open(f"{CONF}.calls", "a", encoding="utf-8") as log:
        log.write(" ".join(argv) + "\n")
    if len(argv) < 3 or argv[0] != "-i" or not argv[1].isdigit():
        return _fail("Get invalid parameters!")
    device, args = int(argv[1]), argv[2:]
    if device >= int(knobs.get("devices", 8)):
        return _fail("The device is not exist!")
    conf = _read_conf(conf_path)
    down = device in set(knobs.get("down", []))
    if args[1:2] == ["-g"] and args[0] == "-ping":
        return _ping(device, args[3], conf, down) if len(args) == 4 and args[2] == "address" else _fail(
            "Get invalid parameters!")
    if args[1:2] == ["-g"] and len(args) == 2:
        return _get(args[0], device, conf, down)
    if args[1:2] == ["-s"]:
        rc = _set(device, args, conf)
        if rc == 0:
            _write_conf(conf_path, conf)
        return rc
    return _fail("Get unknown option!")


def standin_script(conf_path: str) -> str:
    """This script with its state in `conf_path`, to install as `hccn_tool` (on this machine or a test host)."""
    source = Path(__file__).read_text(encoding="utf-8")
    script = source.replace('CONF = "/etc/hccn.conf"  # replaced by install_hccn_standin',
                            f"CONF = {conf_path!r}", 1)
    # The system python without site-packages starts in ~15 ms (a pyenv shim takes ~200): npuops calls it a hundred
    # times a host. It needs nothing but the standard library, and /usr/bin/python3 is on every test host.
    return script.replace("#!/usr/bin/env python3\n", "#!/usr/bin/python3 -S\n", 1)


def knobs_json(devices: int = 8, down: tuple[int, ...] = ()) -> str:
    """What the hardware does: how many NPU ports the host has, and which of them never come up."""
    return json.dumps({"devices": devices, "down": list(down)})


def install_hccn_standin(bin_path: Path, conf_path: str, devices: int = 8, down: tuple[int, ...] = ()) -> Path:
    """Install the stand-in at `bin_path` (executable) with its state in `conf_path`, and set the hardware knobs."""
    bin_path.parent.mkdir(parents=True, exist_ok=True)
    bin_path.write_text(standin_script(conf_path), encoding="utf-8")
    bin_path.chmod(0o755)
    set_knobs(conf_path, devices=devices, down=down)
    return bin_path


def set_knobs(conf_path: str, *, devices: int = 8, down: tuple[int, ...] = ()) -> None:
    knobs = Path(f"{conf_path}.standin.json")
    knobs.parent.mkdir(parents=True, exist_ok=True)
    knobs.write_text(knobs_json(devices, down), encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
