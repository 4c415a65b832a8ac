"""The router in front of a plan's replicas: vllm-router's options, one description for the plan, the unit and the
status.

When a plan has several independent replicas on one node, a client should see one OpenAI endpoint, not N ports:
vllm-router (PyPI `vllm-router`) takes the instance's host and port and spreads requests over the replicas, which
bind 127.0.0.1 on the ports after it. Its health checker takes a dead or hung replica out and puts it back once
/health answers again; its retries resend a request a dead replica refused to another one. Seen with 0.1.17: at
start it serves as soon as one replica answers /health (a replica that never comes up does not keep the endpoint
down). Its own /health answers 503 ("Unhealthy servers: [...]") once its checker has taken a replica out, although
it serves the rest; its /liveness answers 200 while it serves and /readiness counts the healthy workers. The
supervisor's watchdog and status therefore ask /liveness (`InstanceRecord.health_path`): a hung router is restarted,
one whose replicas are restarting is not.

Each field below is one `vllm-router` option (`vllm_router/router_args.py` of 0.1.17 names them); `argv()` is the
router's command line, which holds no secret (the API key reaches the router through its 0600 env file).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

from npuops.plan.inputs import ROUTER_POLICIES

# The default policy and why, from the measurements in docs/router.md ("Why vllm-router"): on the CPU engine
# with two replicas, round_robin matched cache_aware's prefix-cache hit rate on a shared-prefix workload with 0.77x
# its TTFT, while cache_aware sent up to 3 of 4 requests to one replica at 16 in flight (its load balancing starts
# only past 64 requests of difference).
DEFAULT_POLICY = "round_robin"
DEFAULT_POLICY_WHY = ("each replica in turn: even load at any concurrency; measured against cache_aware on two "
                      "replicas (benchmarks/router_overhead.py, README), it kept the same prefix-cache hit rate with "
                      "lower TTFT, where cache_aware piled requests onto one replica")
_POLICY_WHY = {
    "round_robin": DEFAULT_POLICY_WHY,
    "cache_aware": ("a request to the replica whose prefix cache holds the longest part of its prompt, balanced by "
                    "load only past 64 requests of difference: for many long shared prefixes (system prompts, "
                    "chat histories) that do not fit every replica's cache"),
    "power_of_two": "the less loaded of two replicas picked at random: for requests of very different lengths",
    "consistent_hash": "the same session key always to the same replica",
    "random": "a replica at random",
}


def _router_flag(name: str) -> str:
    return "--" + name.replace("_", "-")


@dataclass(frozen=True)
class RouterOptions:
    """vllm-router's options for one endpoint (the worker URLs and addresses are launch's)."""

    policy: str
    # A dead replica is out after health_failure_threshold failed checks this often; back after success_threshold.
    health_check_interval_secs: int = 5
    health_failure_threshold: int = 2
    health_success_threshold: int = 1
    health_check_timeout_secs: int = 5
    # A replica whose requests failed stays out this long before the router tries it again (its restart by
    # systemd takes longer than this, so the first try after it usually finds it healthy).
    cb_timeout_duration_secs: int = 10
    # A request a dead replica refused is sent again, to another replica.
    retry_max_retries: int = 3
    request_timeout_secs: int = 1800

    def __post_init__(self) -> None:
        if self.policy not in ROUTER_POLICIES:
            raise ValueError(f"router policy {self.policy!r} is not one of {', '.join(ROUTER_POLICIES)}")

    @property
    def why(self) -> str:
        return _POLICY_WHY[self.policy]

    def argv(self, worker_urls: Sequence[str], *, host: str, port: int, metrics_host: str, metrics_port: int,
             startup_timeout_s: int) -> list[str]:
        """The router's command line after its program: the replicas' URLs, where it listens, its options."""
        return ["--worker-urls", *worker_urls, *self._serving_argv(host=host, port=port, metrics_host=metrics_host,
                                                                    metrics_port=metrics_port,
                                                                    startup_timeout_s=startup_timeout_s)]

    def _serving_argv(self, *, host: str, port: int, metrics_host: str, metrics_port: int,
                      startup_timeout_s: int) -> list[str]:
        out = ["--host", host, "--port", str(port),
               "--prometheus-host", metrics_host, "--prometheus-port", str(metrics_port),
               # It waits for every replica to answer /health before it serves: as long as their own start may take.
               "--worker-startup-timeout-secs", str(startup_timeout_s), "--worker-startup-check-interval", "2"]
        for f in fields(self):
            out += [_router_flag(f.name), str(getattr(self, f.name))]
        return out

    def argv_pd(self, prefill_urls: Sequence[str], decode_urls: Sequence[str], *, host: str, port: int,
                metrics_host: str, metrics_port: int, startup_timeout_s: int) -> list[str]:
        """The router in vLLM PD mode: each request to a prefill engine (max_tokens 1), then with the KV transfer
        parameters it returned to a decode engine. vllm-router's default `--kv-connector nixl` protocol (the
        prefill's kv_transfer_params passed on to the decode) is the one vllm-ascend's Mooncake connectors and
        vLLM's ExampleConnector speak (vllm-ascend's own proxy, load_balance_proxy_server_example.py, does the same);
        its `mooncake` mode is upstream vLLM's bootstrap-server protocol, which vllm-ascend's connectors do not run."""
        serving = self._serving_argv(host=host, port=port, metrics_host=metrics_host, metrics_port=metrics_port,
                                     startup_timeout_s=startup_timeout_s)
        out = ["--vllm-pd-disaggregation"]
        for url in prefill_urls:
            out += ["--prefill", url]
        for url in decode_urls:
            out += ["--decode", url]
        return out + serving

    def to_json(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in fields(self)} | {"why": self.why}


def plan_router(replica_count: int, policy: str | None) -> RouterOptions | None:
    """A router when the plan has several replicas on one node, or one replica and the operator asked for a
    policy (a single replica behind a router can be rolled out with `rollout --surge` without dropping a
    request); the operator's policy, else the default (it held for every workload measured so far:
    docs/router.md)."""
    if replica_count < 2 and policy is None:
        return None
    return RouterOptions(policy=policy or DEFAULT_POLICY)
