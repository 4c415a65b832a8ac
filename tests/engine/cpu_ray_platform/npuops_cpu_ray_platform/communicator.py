"""vLLM's CPU communicator, for groups whose ranks live on several hosts.

vLLM's CPU backend moves a TP or PP group's tensors through POSIX shared memory (`_CPUSHMDistributed`: rank 0
creates /dev/shm segments, the others open them), which assumes every rank is on one host: the check it makes
(`_all_group_ranks_share_shm_group_name`) compares names built from the rendezvous port, equal on every host. On two
real hosts the second stage then fails with `RuntimeError: open shm in SHMManager failed. errno: 2` (a CI run of
PP=2 over Ray under real systemd). The test hosts of a stand-in service manager shared this machine's /dev/shm,
which hid it. vllm-ascend's NPU communicator has no such path (HCCL across hosts); this one keeps vLLM's shared
memory where a group is on one host and otherwise uses torch.distributed (gloo over TCP), as vLLM itself does when
the names differ.
"""

import os
import socket

import torch
from vllm.distributed.device_communicators.cpu_communicator import CpuCommunicator


def _shm_identity() -> str:
    """One host's shared memory: its hostname and the device of its /dev/shm (two network namespaces of one
    machine with separate /dev/shm mounts differ in the second)."""
    return f"{socket.gethostname()}:{os.stat('/dev/shm').st_dev}"


class MultiHostCpuCommunicator(CpuCommunicator):
    def _all_group_ranks_share_shm_group_name(self) -> bool:
        identities: list[str] = [""] * self.world_size
        torch.distributed.all_gather_object(identities, _shm_identity(), group=self.device_group)
        return len(set(identities)) == 1 and super()._all_group_ranks_share_shm_group_name()
