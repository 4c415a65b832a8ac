"""The human rendering of a plan: values with reasons, the memory budget, the prediction, warnings."""

from __future__ import annotations

import json
from typing import Any

from npuops.plan.disaggregation import DisaggregatedPlan
from npuops.plan.result import Plan
from npuops.textout import human_bytes, wrapped

# The setting column: as wide as most keys; a longer key (additional_config.multistream_overlap_shared_expert)
# takes its value after one space.
KEY_WIDTH = 34
WHY_INDENT = " " * 6


def typed_value(value: Any) -> str:
    """A value as an operator types it into vllm.yaml, a flag or an env file: true/false, JSON for a
    structure (--compilation-config, --speculative-config take JSON), "(not set)" for nothing. Pure."""
    if value is None:
        return "(not set)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value)
    return str(value)


def _setting(key: str, value: Any, why: str) -> list[str]:
    return [wrapped(typed_value(value), f"  {key:<{KEY_WIDTH}} ", WHY_INDENT), wrapped(why, WHY_INDENT)]


def render_plan_text(plan: Plan) -> str:
    """The plan for a terminal: each setting with its value (as typed) and why, wrapped at the terminal's width
    (at most 100 columns, never cutting a value), then replicas, cluster, memory (GiB) and the prediction."""
    data = plan.to_json()
    out: list[str] = []
    model = data["model"]
    out.append(f"Plan for {model['name']} on {data['hardware']['label']}")
    w = data["workload"]
    rate = f", {w['request_rate']} req/s" if w["request_rate"] else ""
    out.append(f"  workload: input {w['input_len']}, output {w['output_len']}, concurrency {w['concurrency']}"
               f"{rate}, objective {w['objective']}")
    out.append("")
    for e in data["explanations"]:
        out += _setting(e["key"], e["value"], e["why"])
    seeds = [e for e in data["explanations"] if e.get("seed")]
    if seeds:
        out.append("\nWhere this differs from the tested advice (docs/claims.md):")
        for e in seeds:
            out.append(wrapped(e["seed"], f"  - {e['key']}: ", "    "))
    if len(data["replicas"]) > 1:
        router = data.get("router")
        behind = f" behind one router ({router['policy']})" if router else ""
        out.append(f"\nReplicas: {len(data['replicas'])} independent instances{behind}")
        for r in data["replicas"]:
            where = (f"ASCEND_RT_VISIBLE_DEVICES={r['visible_devices']}" if r["devices"] else
                     f"VLLM_CPU_OMP_THREADS_BIND={r['cpus']}" if r.get("cpus") else "the host's CPUs")
            out.append(f"  replica {r['index']} (node {r['node']}): {where}")
    cluster = data.get("cluster")
    if cluster:
        out.append(wrapped(f"{cluster['strategy']} over {cluster['nodes']} nodes "
                           f"(TP {cluster['tensor_parallel_size']}, PP {cluster['pipeline_parallel_size']}, "
                           f"DP {cluster['data_parallel_size']}"
                           + (f", EP {cluster['expert_parallel_size']}" if cluster["expert_parallel"] else "") + ")",
                           "\nMulti-node: ", "  "))
        out.append(wrapped(cluster["why"], "  why: ", "    "))
        for alternative in cluster["rejected"]:
            out.append(wrapped(alternative, "  not ", "    "))
        for node in cluster["node_roles"]:
            start = f", data-parallel ranks from {node['dp_start_rank']}" if "dp_start_rank" in node else ""
            out.append(f"  node {node['rank']}: {node['role']}{start}")
        out.append(wrapped("each node also gets HCCL_IF_IP, GLOO/TP/HCCL_SOCKET_IFNAME from its own interface at "
                           "launch (`npuops launch -i INVENTORY --group GROUP`)", "  "))
    m = data["memory"]
    out.append("\nMemory per device:")
    out.append(wrapped(f"device {human_bytes(m['device_bytes'])}, usable {human_bytes(m['usable_bytes'])}: "
                       f"weights {human_bytes(m['weights_bytes_per_device'])}, "
                       f"activations {human_bytes(m['activation_bytes'])}, "
                       f"graphs {human_bytes(m['graph_bytes'])}, runtime {human_bytes(m['runtime_bytes'])}, "
                       f"KV cache {human_bytes(m['kv_budget_bytes'])}", "  "))
    out.append(wrapped(f"KV cache: {m['kv_cache_tokens']} tokens at {m['kv_cache_bytes_per_token']} bytes per "
                       f"token; {int(m['max_concurrency'])} concurrent requests of "
                       f"{w['input_len'] + w['output_len']} tokens", "  "))
    p = data["prediction"]
    out.append(wrapped(f"TTFT {p['ttft_ms']} ms, TPOT {p['tpot_ms']} ms, end-to-end {p['e2e_ms']} ms, "
                       f"{p['output_tokens_per_s']} output tokens/s in total ({p['requests_per_s']} requests/s)",
                       "\nPredicted: ", "  "))
    out.append(wrapped(assumed_load(w, p, data["config"]["data_parallel_size"]), "  for the load ", "    "))
    if data["warnings"]:
        out.append("\nWarnings:")
        for warning in data["warnings"]:
            out.append(wrapped(warning, "  ! ", "    "))
    return "\n".join(out)


def assumed_load(workload: dict[str, Any], prediction: dict[str, Any], replicas: int) -> str:
    """The load a prediction is for, in words: what arrives, and how the replicas hold it."""
    lengths = f"{workload['input_len']} in / {workload['output_len']} out tokens"
    if workload.get("fixed_lengths"):
        lengths += (" exactly (in waves, as a bench sends them)" if workload.get("request_rate") is None
                    else " exactly")
    arriving = (f"{workload['request_rate']} requests/s" if workload.get("request_rate") is not None
                else f"{workload['concurrency']} in flight")
    busy = prediction["busy_replicas"]
    held = f"{prediction['running_per_replica']:g} running"
    if prediction["queued_per_replica"]:
        held += f", {prediction['queued_per_replica']:g} queued"
    if replicas == 1:
        where = "on the one engine"
    elif busy == 1:
        where = f"on 1 of {replicas} replicas (the others idle)"
    else:
        where = f"on each of {busy:g} of {replicas} replicas" if busy < replicas else f"on each of {replicas} replicas"
    return f"{arriving} of {lengths}: {held} {where}"


def render_pd_text(pd: DisaggregatedPlan, why: str) -> str:
    """A disaggregated plan: each pool's engines, options and memory, the connector (its kv_transfer_config as
    JSON, what --kv-transfer-config takes), the pair's prediction beside the co-located plan's; wrapped at the
    terminal's width (at most 100 columns)."""
    data = pd.to_json()
    colocated = pd.colocated
    hosts = pd.prefill.hosts + pd.decode.hosts
    where = (f"{hosts} x {colocated.target.label} (the first {pd.prefill.hosts} prefill, the rest decode)" if hosts
             else colocated.target.label)
    out = [wrapped(f"Disaggregated plan {pd.shape} for {colocated.model.served_name} on {where}", "", "  "),
           wrapped(why, "  "), ""]
    for pool in pd.pools:
        plan = pool.plan
        s = plan.server
        spec = s.speculative_config
        per_host = f", {len(plan.replicas)} on each of {pool.hosts} host(s)" if pool.hosts else ""
        out.append(wrapped(f"{pool.role} pool: {pool.count} engine(s) of TP {pool.tp}{per_host} ({pool.kv_role})",
                           "", "  "))
        for replica, ports in zip(plan.replicas, pool.kv_ports, strict=True):
            where = (f"ASCEND_RT_VISIBLE_DEVICES={replica.visible_devices}" if replica.devices else
                     f"VLLM_CPU_OMP_THREADS_BIND={replica.cpus}" if replica.cpus else "the host's CPUs")
            port = f", kv ports {ports.start}-{ports.stop - 1}" if pd.connector != "ExampleConnector" else ""
            out.append(f"  engine {replica.index}: {where}{port}")
        out.append(wrapped(f"max_num_batched_tokens {s.max_num_batched_tokens}, max_num_seqs {s.max_num_seqs}, "
                           f"max_model_len {s.max_model_len}, block_size {s.block_size}"
                           + (f", speculative {spec['method']} k={spec['num_speculative_tokens']}" if spec else ""),
                           "  ", "    "))
        m = plan.memory
        out.append(wrapped(f"memory per device: weights {human_bytes(m.weights_bytes)}, KV cache "
                           f"{human_bytes(m.kv_budget_bytes)} ({m.kv_cache_tokens} tokens)", "  ", "    "))
    out.append(f"\nKV connector: {pd.connector}")
    for role, config in data["kv_transfer_config"].items():
        out.append(wrapped(typed_value(config), f"  {role}: ", "    "))
    for setting in pd.env_settings:
        out.append(wrapped(f"{setting.name}={setting.value}: {setting.why}", "  ", "    "))
    p, c = data["prediction"], data["colocated_prediction"]
    out.append(wrapped(f"TTFT {p['ttft_ms']} ms (prefill {p['prefill_ms']} ms, KV transfer {p['transfer_ms']} ms), "
                       f"TPOT {p['tpot_ms']} ms, {p['output_tokens_per_s']} output tokens/s",
                       "\nPredicted (the pair): ", "  "))
    out.append(wrapped(f"TTFT {c['ttft_ms']} ms, TPOT {c['tpot_ms']} ms, {c['output_tokens_per_s']} output tokens/s",
                       "Co-located on the same chips: ", "  "))
    out.append(wrapped(pd.verdict, "  ", "    "))
    warnings = [w for pool in pd.pools for w in pool.plan.warnings]
    if warnings:
        out.append("\nWarnings:")
        for warning in dict.fromkeys(warnings):
            out.append(wrapped(warning, "  ! ", "    "))
    return "\n".join(out)
