"""The human rendering of the node model (`npuops node`)."""

from __future__ import annotations

from npuops.hardware.node import Node
from npuops.textout import compact_cpu_list, human_bytes, table


def _mb(used: int | None, total: int | None) -> str:
    if used is None and total is None:
        return "-"
    return f"{used if used is not None else '-'}/{total if total is not None else '-'} MB"


def render_node_text(node: Node) -> str:
    host = node.host
    out: list[str] = []
    os_text = " ".join(x for x in (host.os_name, host.os_version) if x) or "unknown OS"
    out.append(f"Node {host.hostname or '?'}: {host.arch}, {os_text}, kernel {host.kernel or '?'}")

    if node.has_npus:
        smi = node.npu_smi
        out.append(f"\nNPUs: {len(node.chips)} chip(s) [{', '.join(node.chip_names())}]  "
                   f"npu-smi {smi.tool_version or '?'}, driver {smi.driver_version or '?'}"
                   + ("  (some rows elided in the output)" if smi.elided else ""))
        rows = []
        for chip in node.chips:
            s = chip.smi
            rows.append([
                s.npu_id, s.chip_id, s.logical_id, s.name, chip.family, s.health, s.bus_id,
                s.power_w, s.temperature_c, s.aicore_percent,
                _mb(s.memory_used_mb, s.memory_total_mb), _mb(s.hbm_used_mb, s.hbm_total_mb),
            ])
        out.append(table(["NPU", "Chip", "Logical", "Name", "Family", "Health", "Bus-Id", "Power(W)", "Temp(C)",
                          "AICore(%)", "Memory", "HBM"], rows))
        if node.processes:
            out.append("\nProcesses on NPUs:")
            out.append(table(["NPU", "Chip", "PID", "Name", "Memory(MB)"],
                             [[p.npu_id, p.chip_id, p.pid, p.name or "(no name)", p.memory_mb]
                              for p in node.processes]))
        else:
            out.append("  no processes hold NPU memory")
    else:
        out.append("\nNPUs: no NPU driver found on this node")
        for reason in node.no_npu_reasons():
            out.append(f"  - {reason}")
        if node.npu_smi.remediation:
            out.append(f"  fix: {node.npu_smi.remediation}")

    d, f = node.driver, node.firmware
    out.append("\nAscend software:")
    out.append(f"  driver    {d.version or 'not installed'}" + ("" if d.installed else f"  ({d.path} missing)"))
    out.append(f"  firmware  {f.version or 'not installed'}")
    c = node.cann
    out.append(f"  CANN      {c.toolkit.version or 'not installed'}" + (f"  (layout {c.layout})" if c.layout else ""))
    out.append(f"  kernels   {c.kernels.version or 'not installed'}")
    out.append(f"  NNAL/ATB  {c.nnal.version or 'not installed'}")
    out.append(f"  toolbox   {'installed' if c.toolbox.installed else 'not installed'}")

    stack = node.python_stack
    out.append(f"\nPython stack ({stack.executable or '?'}, Python {stack.python or '?'}):")
    if stack.error:
        out.append(f"  could not read: {stack.error}")
    out.append("  " + ", ".join(f"{k} {v or '-'}" for k, v in stack.versions.items()))

    out.append("\nHost:")
    out.append(f"  CPU       {host.cpu_model or '?'}, {host.cpu_count} CPUs, allowed {len(host.allowed_cpus)} "
               f"({compact_cpu_list(host.allowed_cpus)})")
    if host.cpu is not None:
        cpu = host.cpu
        clock = f", {cpu.ghz:g} GHz" if cpu.ghz else ""
        bf16 = f"bfloat16 native ({cpu.native_bf16})" if cpu.native_bf16 else "no native bfloat16"
        out.append(f"  math      {cpu.vector_isa}, {bf16}, {cpu.threads_per_core} thread(s) per core{clock}")
    if host.numa_nodes:
        out.append("  NUMA      " + "; ".join(f"node{n.node_id}: {compact_cpu_list(n.cpus)}" for n in host.numa_nodes))
    out.append(f"  memory    {human_bytes(host.memory_total_bytes)} total, "
               f"{human_bytes(host.memory_available_bytes)} available")
    out.append(f"  /dev/shm  {human_bytes(host.shm_total_bytes)} ({human_bytes(host.shm_free_bytes)} free)")
    out.append(f"  devices   {' '.join(host.device_nodes) or 'no Ascend device nodes'}")
    if host.npu_pci_devices:
        out.append("  PCI       " + ", ".join(f"{p.address} ({p.device_id})" for p in host.npu_pci_devices))
    return "\n".join(out)


def render_fleet_text(fleet: dict[str, object]) -> str:
    """One line per host from FleetFacts.to_json(): chips, driver, CANN, or why the host failed."""
    rows = []
    hosts = fleet.get("hosts", {})
    assert isinstance(hosts, dict)
    for name, entry in sorted(hosts.items()):
        node = entry.get("node") or {}
        if entry.get("status") != "ok" or not node:
            rows.append([name, entry.get("status"), "-", "-", "-", entry.get("message") or ""])
            continue
        chips = node.get("chips", [])
        names = sorted({c["name"] for c in chips})
        rows.append([name, "ok", f"{len(chips)} {'/'.join(names)}" if chips else "no NPU",
                     node.get("driver", {}).get("version") or "-", node.get("cann", {}).get("version") or "-",
                     "; ".join(node.get("npu", {}).get("reasons", []))[:80]])
    return table(["host", "status", "chips", "driver", "CANN", "notes"], rows) + \
        f"\nartifacts: {fleet.get('artifacts')}"
