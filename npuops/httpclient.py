"""HTTP to the engines npuops runs on this node: the standard library, straight to the address (never through a
proxy), never raising on a refused or reset connection (the normal state of an engine that is still loading)."""

from __future__ import annotations

import http.client
import json
import re
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

# A host name as RFC 1123 allows it (labels of letters, digits and inner dashes): what --host, a scrape target or
# a bind may name when it is not an IP address.
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
HOST_NAME = re.compile(rf"(?=.{{1,253}}\Z){_LABEL}(\.{_LABEL})*")


def is_host_name(text: str) -> bool:
    return HOST_NAME.fullmatch(text) is not None


def client_host(host: str) -> str:
    """Where a client on this node reaches a server bound to `host` (a wildcard bind is reached on loopback)."""
    if host in ("0.0.0.0", "", "*"):  # noqa: S104 - mapping a wildcard bind, not binding
        return "127.0.0.1"
    if host == "::":
        return "::1"
    return host


def base_url(host: str, port: int) -> str:
    h = client_host(host)
    return f"http://[{h}]:{port}" if ":" in h else f"http://{h}:{port}"


# The engine is on this node: never send its requests through the operator's $http_proxy (urllib honours it
# whenever no_proxy does not name the host, and Ascend sites often set one for pip).
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_request(url: str, *, data: Mapping[str, Any] | None = None, timeout: float = 5.0,
                 api_key: str | None = None) -> tuple[int, bytes] | None:
    """(status, body), or None when nothing answered (refused, reset, timed out)."""
    body = None if data is None else json.dumps(data).encode()
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"not an http URL: {url!r}")
    request = urllib.request.Request(url, data=body, method="GET" if data is None else "POST")  # noqa: S310
    if body is not None:
        request.add_header("Content-Type", "application/json")
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with _DIRECT.open(request, timeout=timeout) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()
    except (OSError, http.client.HTTPException):
        return None
