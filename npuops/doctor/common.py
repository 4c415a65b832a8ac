"""Small pieces several check families share."""

from __future__ import annotations

from npuops.doctor.context import CheckContext
from npuops.doctor.model import Result

NO_NPU_FIX = "fix the failing driver checks first (`npuops doctor --only npu-smi-runs,driver-installed`)"


def skip_without_npus(ctx: CheckContext) -> Result | None:
    """A skip result when the node shows no NPU (the driver checks say why), else None."""
    node = ctx.node
    if node.has_npus:
        return None
    reasons = "; ".join(node.no_npu_reasons()) or "npu-smi listed no chips"
    # `no_npu` marks the skip for the text report, which says why once rather than on every such check.
    return Result.skip(f"no NPU visible on this node ({reasons})", NO_NPU_FIX, npu_smi_error=node.npu_smi.error_code,
                       no_npu=reasons)
