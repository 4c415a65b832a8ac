"""Set a host's NPU ports to the inventory's addresses and verify them (npuops.fleet.npu_ports), on the controller.

This runs in the controller's Python, npuops' own environment (npuops runs ansible-playbook from it), so the
decisions and the parsing of hccn_tool's answers are npuops' (one copy, unit-tested on recorded outputs); each
batch of hccn_tool calls goes to the host through the role's module npuops_hccn_calls. The result is never a
failure: the role records it with set_stats (the per-NPU before/after reaches `npuops provision --json` even for a
host whose ports did not come up), then fails the host with the result's message.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

from npuops.fleet.npu_network import NpuPort
from npuops.fleet.npu_ports import Call, Waiting, configure_ports


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("ports", "hccn_tool", "wait_s", "poll_s", "call_timeout_s"))

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result: dict[str, Any] = super().run(tmp, task_vars)
        args = self._task.args
        try:
            ports = [NpuPort.from_json(port) for port in args.get("ports") or []]
            waiting = Waiting(timeout_s=float(args.get("wait_s", 60)), poll_s=float(args.get("poll_s", 2)))
        except (KeyError, TypeError, ValueError) as exc:
            raise AnsibleActionFail(f"npuops_npu_ports: bad arguments ({exc})") from None
        tool = str(args.get("hccn_tool") or "")

        def run_calls(calls: Sequence[Sequence[str]]) -> list[Call]:
            done = self._execute_module(
                module_name="npuops_hccn_calls",
                module_args={"hccn_tool": tool, "calls": [list(c) for c in calls],
                             "timeout_s": int(args.get("call_timeout_s", 60))},
                task_vars=task_vars)
            if done.get("failed"):
                raise AnsibleActionFail(str(done.get("msg") or "hccn_tool calls failed"))
            return [(int(r["rc"]), str(r["stdout"]), str(r["stderr"])) for r in done["results"]]

        report = configure_ports(ports, run_calls, check=bool(self._task.check_mode), waiting=waiting)
        result.update(changed=report.changed, npuops_npu_network=report.to_json(), msg=report.message())
        if self._task.diff and report.changed:
            result["diff"] = report.diff()
        return result
