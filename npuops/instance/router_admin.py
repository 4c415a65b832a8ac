"""A replica's place in the router in front of it: taken out before its engine drains, put back once it is healthy.

vllm-router 0.1.17's worker API (answers recorded in tests/fixtures/router/worker-api.txt): `POST
/remove_worker?url=URL` ("Successfully removed worker: URL", 200, also for a URL it does not hold), `POST
/add_worker?url=URL` (200, or 400 "Worker URL already exists") and `GET /list_workers` (`{"urls": [...]}`). A
replica out of the router gets no new request, so its drain (vLLM's --shutdown-timeout) only finishes what it has,
and the router's health checker never has to notice it going away. The router is this host's: over a group, a
replica on another host has no router record here and is left to the router's own health checks.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass

from npuops.errors import BadInputError, ConfigError
from npuops.httpclient import base_url, http_request
from npuops.instance.record import InstanceRecord, load_record
from npuops.wire import loads_json

ROUTER_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class RouterChange:
    """What the router answered (`done`: it holds, or no longer holds, the replica as asked) and a line to log."""

    done: bool
    message: str


def replica_url(record: InstanceRecord, router: InstanceRecord) -> str:
    """The replica's URL as its router knows it (one of the router's backends)."""
    own = base_url(record.host, record.port)
    return next((url for url in router.backends if url.rstrip("/") == own), own)


def router_of(record: InstanceRecord) -> InstanceRecord | None:
    """The router record in front of a replica on this host, or None (not behind one, or the router's host is
    another: over a group)."""
    if not record.behind or record.pd_role is not None:
        # A prefill or decode engine is one of the PD router's two pools (--prefill/--decode): its worker API
        # would put it back as a plain worker, so the PD router's own health checks keep it.
        return None
    try:
        router = load_record(record.directory.parent, record.behind)
    except (BadInputError, ConfigError):
        return None
    return router if router.is_router else None


def worker_urls(body: bytes) -> list[str] | None:
    """The URLs of `GET /list_workers`'s answer, or None when it is not that answer (pure)."""
    try:
        data = loads_json(body)
    except ValueError:
        return None
    urls = data.get("urls") if isinstance(data, dict) else None
    return [u for u in urls if isinstance(u, str)] if isinstance(urls, list) else None


# How a replica leaves or joins: the worker API's verb, what is logged when the router answered, and when not.
_CHANGES = {
    "leave": ("remove_worker", "out of router {router} ({answer})",
              "router {router} did not answer (not running?): its health checks take {url} out"),
    "join": ("add_worker", "in router {router} ({answer})",
             "router {router} did not answer (not running yet?): it starts with {url} in its --worker-urls"),
}


def _change(record: InstanceRecord, how: str, api_key: str | None) -> RouterChange | None:
    router = router_of(record)
    if router is None:
        return None
    return worker_change(router, replica_url(record, router), how, api_key)


def worker_change(router: InstanceRecord, url: str, how: str, api_key: str | None) -> RouterChange:
    """Take the worker `url` out of this host's `router` ("leave") or put it in ("join"); over a group, the
    rollout's playbook does this on the router's host for another host's replicas (`rollout --leave-router`)."""
    verb, said, unanswered = _CHANGES[how]
    query = urllib.parse.urlencode({"url": url})
    answer = http_request(f"{base_url(router.host, router.port)}/{verb}?{query}", data={}, timeout=ROUTER_TIMEOUT_S,
                          api_key=api_key)
    if answer is None:
        return RouterChange(False, unanswered.format(router=router.name, url=url))
    status, text = answer[0], answer[1].decode("utf-8", "replace").strip()
    # Joining a router that already holds it (it only took the replica out after a crash) is done as well.
    done = status == 200 or (how == "join" and status == 400 and "already exists" in text)
    return RouterChange(done, said.format(router=router.name, answer=text or status))


def leave_router(record: InstanceRecord, api_key: str | None) -> RouterChange | None:
    """Take the replica out of its router (None: it has none here)."""
    return _change(record, "leave", api_key)


def join_router(record: InstanceRecord, api_key: str | None) -> RouterChange | None:
    """Put the replica (back) into its router (None: it has none here)."""
    return _change(record, "join", api_key)
