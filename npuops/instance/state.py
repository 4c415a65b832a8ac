"""What the supervisor tells `npuops status` and `npuops launch` about an instance's engine (its status file)."""

from __future__ import annotations

import enum


class Stage(str, enum.Enum):
    STARTING = "starting"  # the engine process exists
    LOADING = "loading weights"
    KV_CACHE = "KV cache allocated"
    GRAPHS = "capturing graphs"
    LISTENING = "listening"
    HEALTHY = "healthy"  # /health answered 200
    UNHEALTHY = "unhealthy"  # was healthy, /health stopped answering
    STOPPING = "stopping"
    EXITED = "exited"

    @property
    def order(self) -> int:
        return list(Stage).index(self)
