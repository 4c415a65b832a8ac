"""Multi-node serving: which of vLLM's two multi-node engines a plan uses, and what each node runs.

Two ways to spread one model over several Ascend nodes (vllm-ascend tutorials: features/ray.md for Ray, the
multi-node data-parallel tutorials for the other):

- **ray**: tensor parallel inside a node and pipeline parallel across nodes, one `vllm serve ...
  --distributed-executor-backend ray` on the head driving Ray workers on every node. For dense models too big
  for one node: TP collectives stay on the node's HCCS links; only the pipeline's activations cross nodes.
- **dp** (vLLM's native data parallel, `--data-parallel-*`): every node runs engine ranks, the leader's API
  server spreads requests over them and the followers run `--headless`. For MoE models the ranks form one
  expert-parallel group (`--enable-expert-parallel`): each device holds whole experts and tokens travel to them
  in an all-to-all sized by HCCL_BUFFSIZE. For a dense model that fits one node, the ranks are independent
  engines behind one endpoint.

Everything here is pure: the planner decides with these functions and the launch renders per-node commands
from `ClusterPlan.node_changes`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Literal

from npuops.errors import BadInputError
from npuops.plan.constants import MemoryConstants
from npuops.plan.environment import HCCL_DEFAULT_BUFFSIZE_MB
from npuops.plan.inputs import Workload
from npuops.plan.layout import Evaluated, Layout, Sizing, choose_layout, valid_tp_sizes
from npuops.plan.memory import weights_per_device_ep
from npuops.plan.model import ModelArch, ModelSpec, count_parameters
from npuops.plan.rules import AscendRules, TargetRules
from npuops.plan.server_options import ServerOptions
from npuops.textout import human_bytes

Strategy = Literal["ray", "dp"]

# Ports the cluster uses between nodes (each configurable at launch): Ray's GCS on the head, and the leader's
# data-parallel RPC port the headless followers register with.
RAY_PORT = 6379
DP_RPC_PORT = 13345


# The MC2 dispatch/combine kernels vllm-ascend uses for expert parallel check their window against
# HCCL_BUFFSIZE at tiling time and fail with "HCCL_BUFFSIZE is too SMALL ... NEEDED_HCCL_BUFFSIZE(...)"
# (CANN ops-transformer, mc2/moe_distribute_dispatch_v2 op_host tiling). Their formula, with its constants:
#   tokenNeedSizeCombine  = align512(h * 2)
#   tokenNeedSizeDispatch = align512(align32(h * 2) + 44)        # 32 B scale + 3 x 4 B expand index
#   NEEDED = (maxBs * dispatch * ep_world * local_experts + maxBs * combine * (k + shared_experts)) * 2
# where maxBs is the tokens one rank sends per step (capped at 512 by the kernel).
_WIN_ADDR_ALIGN = 512
_UB_ALIGN = 32
_SCALE_EXPAND_IDX_BYTES = 44
_OUT_DTYPE_BYTES = 2
_DOUBLE_BUFFER = 2
MC2_MAX_BS = 512
# Rounded up to this granularity, with a quarter of headroom: the kernel's formula is the floor, and a
# too-small buffer fails the first decode step of every rank at once.
_BUFFSIZE_STEP_MB = 64
_BUFFSIZE_HEADROOM = 1.25


def _align(value: int, to: int) -> int:
    return -(-value // to) * to


@dataclass(frozen=True)
class HcclBufferSize:
    mb: int
    needed_mb: float
    why: str


def hccl_buffsize_for_ep(arch: ModelArch, ep_size: int, tokens_per_rank: int) -> HcclBufferSize:
    """HCCL_BUFFSIZE (MB) for expert parallel over `ep_size` devices, each sending up to `tokens_per_rank`
    tokens per decode step; the MC2 kernels' own requirement plus headroom, never below HCCL's default."""
    if not arch.is_moe or ep_size < 2:
        return HcclBufferSize(HCCL_DEFAULT_BUFFSIZE_MB, 0.0, "no expert parallel: HCCL's default buffer")
    h = arch.hidden_size
    max_bs = max(1, min(tokens_per_rank, MC2_MAX_BS))
    combine = _align(h * _OUT_DTYPE_BYTES, _WIN_ADDR_ALIGN)
    dispatch = _align(_align(h * _OUT_DTYPE_BYTES, _UB_ALIGN) + _SCALE_EXPAND_IDX_BYTES, _WIN_ADDR_ALIGN)
    local_experts = math.ceil(arch.num_experts / ep_size)
    k = arch.num_experts_per_tok
    needed = (max_bs * dispatch * ep_size * local_experts + max_bs * combine * (k + arch.num_shared_experts))
    needed *= _DOUBLE_BUFFER
    needed_mb = needed / 2**20
    mb = max(HCCL_DEFAULT_BUFFSIZE_MB, _align(math.ceil(needed_mb * _BUFFSIZE_HEADROOM), _BUFFSIZE_STEP_MB))
    why = (
        f"the MC2 dispatch/combine kernels need ({max_bs} tokens x {dispatch} B x {ep_size} ranks x {local_experts} "
        f"experts per rank + {max_bs} x {combine} B x ({k} routed + {arch.num_shared_experts} shared)) x 2 = "
        f"{needed_mb:.0f} MiB per rank ('HCCL_BUFFSIZE is too SMALL' below that); {mb} MiB with "
        f"{int((_BUFFSIZE_HEADROOM - 1) * 100)}% headroom"
        + (f", never below HCCL's {HCCL_DEFAULT_BUFFSIZE_MB} MiB default" if mb == HCCL_DEFAULT_BUFFSIZE_MB else "")
        + " (HCCL_BUFFSIZE counts MiB, which HCCL's docs call MB)"
    )
    return HcclBufferSize(mb, round(needed_mb, 1), why)


def routed_expert_fraction(total_params: int, arch: ModelArch) -> float:
    """The share of the weights that are routed experts (what expert parallel spreads instead of slicing)."""
    if not arch.is_moe or total_params <= 0:
        return 0.0
    expert_params = arch.num_experts * 3 * arch.hidden_size * arch.moe_intermediate_size * arch.num_moe_layers
    return min(1.0, expert_params / total_params)


@dataclass(frozen=True)
class ClusterNode:
    """What one node of the cluster runs: its rank in the node list and its role."""

    rank: int
    role: str  # ray: "head" | "worker"; dp: "leader" | "follower"
    dp_start_rank: int | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rank": self.rank, "role": self.role}
        if self.dp_start_rank is not None:
            out["dp_start_rank"] = self.dp_start_rank
        return out


@dataclass(frozen=True)
class ClusterPlan:
    """How a plan spans nodes. `nodes` may be fewer than the target's when the model needs fewer."""

    strategy: Strategy
    nodes: int
    devices_per_node: int
    tp: int
    pp: int
    dp: int  # data-parallel ranks in the whole cluster (1 for ray)
    dp_local: int  # data-parallel ranks per node
    expert_parallel: bool
    hccl_buffsize_mb: int | None
    why: str
    rejected: tuple[str, ...] = ()

    @property
    def ep_size(self) -> int:
        # vLLM forms the expert-parallel group from TP x DP (inside each pipeline stage).
        return self.dp * self.tp if self.expert_parallel else 1

    def node_list(self) -> tuple[ClusterNode, ...]:
        if self.strategy == "ray":
            return tuple(ClusterNode(i, "head" if i == 0 else "worker") for i in range(self.nodes))
        return tuple(ClusterNode(i, "leader" if i == 0 else "follower", i * self.dp_local) for i in range(self.nodes))

    def node_changes(self, rank: int, *, leader_address: str, rpc_port: int = DP_RPC_PORT) -> dict[str, Any]:
        """The ServerOptions fields that differ per node: node `rank`'s options are the plan's with these changes.

        ray: only the head runs vllm serve; the workers run Ray alone, so asking for a worker's options is a bug.
        dp: every node runs vllm serve with the cluster's data-parallel shape; followers are --headless.
        """
        if not 0 <= rank < self.nodes:
            raise ValueError(f"node rank {rank} outside 0..{self.nodes - 1}")
        if self.strategy == "ray":
            if rank != 0:
                raise ValueError("ray workers run no vllm serve")
            return {}
        changes: dict[str, Any] = {"data_parallel_size": self.dp, "data_parallel_size_local": self.dp_local,
                                   "data_parallel_address": leader_address, "data_parallel_rpc_port": rpc_port}
        if rank > 0:
            changes.update(headless=True, data_parallel_start_rank=rank * self.dp_local)
        return changes

    def node_args(self, rank: int, *, leader_address: str, rpc_port: int = DP_RPC_PORT) -> list[str]:
        """The `vllm serve` flags that differ per node (on top of the plan's shared flags)."""
        return ServerOptions(**self.node_changes(rank, leader_address=leader_address, rpc_port=rpc_port)).flags()

    def as_dict(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy,
            "nodes": self.nodes,
            "devices_per_node": self.devices_per_node,
            "tensor_parallel_size": self.tp,
            "pipeline_parallel_size": self.pp,
            "data_parallel_size": self.dp,
            "data_parallel_size_local": self.dp_local,
            "expert_parallel": self.expert_parallel,
            "expert_parallel_size": self.ep_size,
            "hccl_buffsize_mb": self.hccl_buffsize_mb,
            "why": self.why,
            "rejected": list(self.rejected),
            "node_roles": [n.as_dict() for n in self.node_list()],
        }


def _expert_parallel_cluster(model: ModelSpec, rules: AscendRules, workload: Workload, s: Sizing, mode: str,
                             fixed_tp: int | None, required: int, c: MemoryConstants
                             ) -> tuple[Evaluated, ClusterPlan] | None:
    """MoE over the nodes as data + expert parallel: every device one rank holding its share of whole experts, TP
    inside a node for attention and the dense layers. None when no TP inside a node leaves KV room."""
    arch = model.arch
    target = rules.target
    per_node = target.devices_per_node
    total = target.total_devices
    fraction = routed_expert_fraction(count_parameters(arch).total, arch)
    tps = [tp for tp in valid_tp_sizes(arch, per_node) if per_node % tp == 0 and fixed_tp in (None, tp)]
    fitting = []
    for tp in tps:
        weights = weights_per_device_ep(s.weight_bytes, arch, tp, total, s.act_bytes, fraction)
        # Sized for the largest batch a rank may run; the final buffer follows the chosen max_num_seqs.
        buffer = hccl_buffsize_for_ep(arch, total, s.seq_cap).mb
        # The all-to-all always communicates, so HCCL's buffers are reserved even at TP=1.
        budget = rules.device_budget(s, tp, 1, weights, max(2, tp), buffer, c)
        if budget.kv_cache_tokens >= required:
            fitting.append(Evaluated(Layout(tp, 1), budget, total // tp))
    if not fitting:
        return None
    ev = choose_layout(model, target, workload, s, fitting, mode)
    tp = ev.layout.tp
    dp = total // tp
    why = (
        f"MoE over {target.nodes} nodes: data parallel {dp} x TP {tp} with expert parallel over all {total} devices: "
        f"the {arch.num_experts} routed experts ({fraction:.0%} of the weights) spread whole, "
        f"{math.ceil(arch.num_experts / total)} per device, and attention is split by TP={tp} inside a node, "
        f"{human_bytes(ev.budget.weights_bytes)} of weights per device; vLLM's native --data-parallel-* engine with "
        "--headless followers, no Ray"
    )
    rejected = ("ray (TP x PP across nodes): for MoE, data + expert parallel spreads the experts whole and keeps "
                "every rank busy, where pipeline stages across nodes add bubbles and inter-node hops",)
    return ev, ClusterPlan("dp", target.nodes, per_node, tp, 1, dp, per_node // tp, True, None, why, rejected)


def _ray_cluster(model: ModelSpec, rules: TargetRules, strategy: str, chosen: Evaluated, s: Sizing
                 ) -> tuple[Evaluated, ClusterPlan]:
    """One instance too big for a node: TP inside each node, pipeline stages across nodes, placed by Ray."""
    arch = model.arch
    layout = chosen.layout
    per_node = rules.target.devices_per_node
    nodes_used = layout.chips // per_node
    if rules.engine_per_host:
        why = f"one engine process per CPU host: {layout.pp} pipeline stages over {nodes_used} hosts, placed by Ray"
    else:
        why = (f"{human_bytes(s.weight_bytes)} of weights need {layout.chips} devices, more than one node's "
               f"{per_node}: "
               f"TP={layout.tp} inside each node keeps the per-layer all-reduces on the node's own links and "
               f"PP={layout.pp} stages over {nodes_used} nodes pass only activations between nodes; Ray places the "
               "workers and the head's vllm serve drives them")
    moe = rules.expert_parallel(arch)
    if moe:
        rejected = ("dp (data + expert parallel): asked for ray" if strategy == "ray" else
                    "dp (data + expert parallel): no TP inside a node leaves KV room with experts spread over "
                    f"{rules.target.total_devices} devices")
    elif strategy != "ray":
        rejected = "dp (data parallel): every rank would need the whole model, which does not fit a node"
    else:
        rejected = "dp: asked for ray"
    cluster = ClusterPlan("ray", nodes_used, per_node, layout.tp, layout.pp, 1, 1, moe, None, why, (rejected,))
    return replace(chosen, replicas=1), cluster


def _dense_dp_cluster(rules: TargetRules, strategy: str, chosen: Evaluated, s: Sizing
                      ) -> tuple[Evaluated, ClusterPlan]:
    """A model that fits a node's devices: independent engine ranks behind the leader's one endpoint."""
    layout = chosen.layout
    target = rules.target
    per_node = target.devices_per_node
    ranks_per_node = max(1, per_node // layout.chips)
    dp = ranks_per_node * target.nodes
    rejected = ("ray (TP x PP across nodes): asked for dp" if strategy == "dp" else
                f"ray (TP x PP across nodes): the model fits {layout.chips} device(s), so pipeline stages across "
                "nodes would only add bubbles and inter-node hops")
    if rules.engine_per_host:
        why = f"one engine per CPU host: {dp} data-parallel ranks behind the leader's endpoint"
    else:
        why = (f"{human_bytes(s.weight_bytes)} of weights fit {layout.chips} device(s): {dp} independent engine ranks "
               f"({ranks_per_node} per node, TP={layout.tp}) behind one endpoint with vLLM's native data parallel; "
               "the leader's API server spreads requests and the other nodes run --headless")
    cluster = ClusterPlan("dp", target.nodes, per_node, layout.tp, layout.pp, dp, ranks_per_node, False, None, why,
                          (rejected,))
    return replace(chosen, replicas=dp), cluster


def plan_cluster(model: ModelSpec, rules: TargetRules, workload: Workload, s: Sizing, chosen: Evaluated,
                 strategy: str, fixed_tp: int | None, mode: str, required: int, c: MemoryConstants
                 ) -> tuple[Evaluated, ClusterPlan]:
    """Spread the plan over the target's nodes: Ray TP x PP when one instance needs more than a node, native data
    parallel (expert parallel for MoE) otherwise; the why names the alternative and why it lost."""
    if isinstance(rules, AscendRules) and rules.expert_parallel(model.arch) and strategy != "ray":
        # Expert parallel first for MoE: experts stay whole, and no token waits for pipeline stages on other nodes.
        found = _expert_parallel_cluster(model, rules, workload, s, mode, fixed_tp, required, c)
        if found is not None:
            return found
        if strategy == "dp":
            raise BadInputError(
                f"--multinode dp: {model.served_name} does not fit {rules.target.label} as data + expert parallel "
                "with KV room for one request", "use --multinode ray, more --nodes, or a quantization")
    if chosen.layout.chips > rules.target.devices_per_node:
        return _ray_cluster(model, rules, strategy, chosen, s)
    return _dense_dp_cluster(rules, strategy, chosen, s)
