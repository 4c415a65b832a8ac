#!/usr/bin/python
"""Run a batch of `hccn_tool` calls on the host, one after another, and hand back what each printed.

The role's action plugin (action_plugins/npuops_npu_ports.py) decides on the controller what to read and set; this
module only runs the calls (never through a shell: each call is an argument list) and returns their exit codes,
stdout and stderr. In check mode it runs queries only.
"""

from __future__ import annotations

import os
import subprocess

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: npuops_hccn_calls
short_description: Run hccn_tool calls one after another
description:
  - Runs each call as C(hccn_tool ARGS...) without a shell and returns their exit codes and output.
  - In check mode a call that sets something (C(-s)) is refused.
options:
  hccn_tool:
    description: The hccn_tool binary.
    type: path
    required: true
  calls:
    description: The argument lists, run in order.
    type: list
    elements: list
    required: true
  timeout_s:
    description: How long one call may take.
    type: int
    default: 60
"""


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "hccn_tool": {"type": "path", "required": True},
            "calls": {"type": "list", "elements": "list", "required": True},
            "timeout_s": {"type": "int", "default": 60},
        },
        supports_check_mode=True,
    )
    tool = module.params["hccn_tool"]
    if not os.access(tool, os.X_OK):
        module.fail_json(msg=f"hccn_tool not found at {tool}: install the NPU driver first (npuops provision --tags "
                             "driver; hccn_tool ships in its tools/), or set npuops_hccn_tool to where it is",
                         missing=True)
    results = []
    for call in module.params["calls"]:
        args = [str(arg) for arg in call]
        if module.check_mode and "-s" in args:
            module.fail_json(msg=f"refused in check mode: hccn_tool {' '.join(args)}")
        try:
            done = subprocess.run([tool, *args], capture_output=True, text=True, errors="replace", check=False,
                                  timeout=module.params["timeout_s"])
            results.append({"rc": done.returncode, "stdout": done.stdout, "stderr": done.stderr})
        except subprocess.TimeoutExpired:
            # 124, as timeout(1) reports it: a hung hccn_tool is a failed call, not a hung play.
            results.append({"rc": 124, "stdout": "", "stderr": f"timed out after {module.params['timeout_s']} s"})
    module.exit_json(changed=False, results=results)


if __name__ == "__main__":
    main()
