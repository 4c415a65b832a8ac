"""The router a router unit's supervisor runs: `python -m npuops.service.router_process ROUTER_JSON`.

vllm-router takes its API key (the one it sends to the replicas) as `--api-key`, which would put the secret on a
command line (`ps`, /proc/PID/cmdline, the journal's start line). This wrapper reads the router's options from
router.json (written by launch, no secret in it) and the key from VLLM_API_KEY, which the unit's 0600 env file
sets, and starts vllm-router's own launcher with both. It runs with the serving venv's interpreter, where
vllm-router is installed; it imports nothing of npuops' beyond the standard library.

Clients still send their key to the endpoint: the router forwards their Authorization header to the replica, which
checks it (vLLM's VLLM_API_KEY), so a request without the key gets the replica's 401 through the router.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence

EXIT_CONFIG = 78  # the supervisor's EX_CONFIG: a restart cannot help


def read_router_argv(path: str) -> list[str]:
    """The router's command line from router.json (`{"argv": [...]}`); ValueError names what is wrong."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON ({exc.msg})") from None
    argv = data.get("argv") if isinstance(data, dict) else None
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise ValueError(f"{path} holds no router command line (\"argv\": a list of strings)")
    return argv


def main(args: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if args is None else args)
    if len(args) != 1:
        print("usage: python -m npuops.service.router_process ROUTER_JSON", file=sys.stderr)
        return EXIT_CONFIG
    try:
        argv = read_router_argv(args[0])
    except ValueError as exc:
        print(f"npuops router: {exc}; fix: re-create the instance with `npuops launch`", file=sys.stderr)
        return EXIT_CONFIG
    try:
        from vllm_router.launch_router import launch_router, parse_router_args
    except ImportError as exc:
        print(f"npuops router: vllm-router is not installed beside this interpreter ({sys.executable}): {exc}; "
              "fix: `npuops provision --tags python` installs it into the serving venv", file=sys.stderr)
        return EXIT_CONFIG
    router_args = parse_router_args(argv)
    router_args.api_key = os.environ.get("VLLM_API_KEY") or None
    launch_router(router_args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
