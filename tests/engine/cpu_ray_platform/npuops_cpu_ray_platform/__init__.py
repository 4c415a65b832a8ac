"""Test-only vLLM platform plugin (entry point group `vllm.platform_plugins`, the way vllm-ascend plugs in its NPU
platform): vLLM's CPU platform, but with `ray_device_key = "NPU"` so that `--distributed-executor-backend ray`
works on CPU-only test hosts. Stock vLLM CPU has `ray_device_key = ""` and fails with
`ValueError: current platform cpu does not support ray.`

Inactive unless NPUOPS_CPU_RAY_PLATFORM=1 is in the environment of *every* process that resolves vLLM's platform:
`vllm serve` and also each `ray start` (Ray actors inherit the raylet's environment; the platform is resolved in
the actor before vLLM hands the driver's environment to it). Each Ray node must offer the resource:
`ray start ... --resources '{"NPU": 1}'` (one per vLLM worker on that node).
Do not set VLLM_TARGET_DEVICE=cpu: it short-circuits plugin discovery to the built-in CPU platform.
"""

import os

ENV_VAR = "NPUOPS_CPU_RAY_PLATFORM"


def register() -> str | None:
    if os.environ.get(ENV_VAR, "") in ("1", "true", "yes"):
        return "npuops_cpu_ray_platform.platform.CpuRayPlatform"
    return None
