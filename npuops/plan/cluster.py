"""Multi-node serving: which of vLLM's two multi-node engines a plan uses, and what each node runs.

Two ways to spread one model over several Ascend nodes (ascend-facts §5):

- **ray**: tensor parallel inside a node and pipeline parallel across nodes, one `vllm serve ...
  --distributed-executor-backend ray` on the head driving Ray workers on every node. For dense models too big
  for one node: TP collectives stay on the node's HCCS links; only the pipeline's activations cross nodes.
- **dp** (vLLM's native data parallel, `--data-parallel-*`): every node runs engine ranks, the leader's API
  server spreads requests over them and the followers run `--headless`. For MoE models the ranks form one
  expert-parallel group (`--enable-expert-parallel`): each device holds whole experts and tokens travel to them
  in an all-to-all sized by HCCL_BUFFSIZE. For a dense model that fits one node, the ranks are independent
  engines behind one endpoint.

Everything here is pure: the planner decides with these functions and the launch renders per-node commands
from `ClusterPlan.node_args`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from npuops.errors import BadInputError
from npuops.plan.model import ModelArch

Strategy = Literal["ray", "dp"]
STRATEGIES: tuple[str, ...] = ("auto", "ray", "dp")

# Ports the cluster uses between nodes (each configurable at launch): Ray's GCS on the head, and the leader's
# data-parallel RPC port the headless followers register with.
RAY_PORT = 6379
DP_RPC_PORT = 13345

# HCCL's own default buffer per communication domain (CANN env reference, HCCL_BUFFSIZE).
HCCL_DEFAULT_BUFFSIZE_MB = 200

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
        f"{needed_mb:.0f} MB per rank ('HCCL_BUFFSIZE is too SMALL' below that); {mb} MB with "
        f"{int((_BUFFSIZE_HEADROOM - 1) * 100)}% headroom"
        + (f", never below HCCL's {HCCL_DEFAULT_BUFFSIZE_MB} MB default" if mb == HCCL_DEFAULT_BUFFSIZE_MB else "")
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

    def node_args(self, rank: int, *, leader_address: str, rpc_port: int = DP_RPC_PORT) -> list[str]:
        """The `vllm serve` flags that differ per node (on top of the plan's shared flags).

        ray: only the head runs vllm serve; the workers run Ray alone, so asking for a worker's args is a bug.
        dp: every node runs vllm serve with the cluster's data-parallel shape; followers are --headless.
        """
        if not 0 <= rank < self.nodes:
            raise ValueError(f"node rank {rank} outside 0..{self.nodes - 1}")
        if self.strategy == "ray":
            if rank != 0:
                raise ValueError("ray workers run no vllm serve")
            return []
        args = ["--data-parallel-size", str(self.dp), "--data-parallel-size-local", str(self.dp_local),
                "--data-parallel-address", leader_address, "--data-parallel-rpc-port", str(rpc_port)]
        if rank > 0:
            args += ["--headless", "--data-parallel-start-rank", str(rank * self.dp_local)]
        return args

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


def check_strategy(value: str | None) -> str:
    text = (value or "auto").strip().lower()
    if text not in STRATEGIES:
        raise BadInputError(f"--multinode {value!r} is not a strategy", f"use one of {', '.join(STRATEGIES)}")
    return text
