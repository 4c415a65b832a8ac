from vllm.platforms.cpu import CpuPlatform


class CpuRayPlatform(CpuPlatform):
    # The Ray resource each vLLM worker actor asks for ({"NPU": 1}) and the accelerator whose ids Ray hands out
    # (ray.get_runtime_context().get_accelerator_ids()["NPU"]). "CPU" cannot be used: Ray rejects it in
    # `resources=` ("Use the 'num_cpus' and 'num_gpus' keyword instead of 'CPU' and 'GPU'").
    ray_device_key: str = "NPU"
    # Ray sets ASCEND_RT_VISIBLE_DEVICES for actors holding NPU resources (unless
    # RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES=1); vLLM maps ids through this variable.
    device_control_env_var: str = "ASCEND_RT_VISIBLE_DEVICES"

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        # vLLM's CPU communicator, falling back from shared memory for a group across hosts (communicator.py).
        return "npuops_cpu_ray_platform.communicator.MultiHostCpuCommunicator"
