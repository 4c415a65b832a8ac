"""The sd_notify protocol (sd_notify(3)), spoken directly: one datagram per message to $NOTIFY_SOCKET.

No libsystemd binding is needed: the protocol is newline-separated KEY=VALUE pairs in a datagram on a Unix
socket, where an address starting with "@" is in the abstract namespace. Without $NOTIFY_SOCKET (foreground
runs, tests) every call is a no-op.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping


class Notifier:
    def __init__(self, address: str | None) -> None:
        self.address = address or None
        self._socket: socket.socket | None = None
        if self.address:
            self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> Notifier:
        return cls(environ.get("NOTIFY_SOCKET"))

    @property
    def enabled(self) -> bool:
        return self._socket is not None

    def send(self, **fields: str | int) -> bool:
        """Send KEY=VALUE lines; False when there is no socket or the manager is gone (never raises)."""
        if self._socket is None or self.address is None:
            return False
        payload = "\n".join(f"{key}={value}" for key, value in fields.items()).encode()
        target = "\0" + self.address[1:] if self.address.startswith("@") else self.address
        try:
            self._socket.sendto(payload, target)
        except OSError:
            return False
        return True

    def ready(self, status: str) -> bool:
        return self.send(READY=1, STATUS=status, MAINPID=os.getpid())

    def status(self, text: str) -> bool:
        return self.send(STATUS=text)

    def watchdog(self) -> bool:
        return self.send(WATCHDOG=1)

    def stopping(self, status: str) -> bool:
        return self.send(STOPPING=1, STATUS=status)

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None


def watchdog_interval_s(environ: Mapping[str, str], pid: int) -> float | None:
    """How often to ping: half of $WATCHDOG_USEC (sd_watchdog_enabled(3)), when it is meant for this pid."""
    usec = environ.get("WATCHDOG_USEC", "")
    owner = environ.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0:
        return None
    if owner and owner != str(pid):
        return None
    return int(usec) / 2_000_000
