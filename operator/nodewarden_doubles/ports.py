"""Loopback ports for peers that another process will bind: the test doubles, the demo's
control plane, sshd, sushy-tools.

Asking the kernel for port 0 and closing the socket hands out a port from the *ephemeral*
range, the same range every outgoing connection on the machine draws its source port
from; between the close and the child's bind, any `connect()` may take it (CI saw etcd
fail with "bind: address already in use" on 59405 this way). Ports here come from below
that range, where nothing is assigned implicitly, are never handed out twice by one
process, and are checked bindable (TCP and UDP) when handed out. A child that still
loses the race must be restarted on a fresh port by its spawner (`bind_failed` tells
that failure apart from others).
"""

from __future__ import annotations

import random
import socket
import threading
from pathlib import Path

LOOPBACK = "127.0.0.1"
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST = 10_000  # below this lie well-known and registered services
_FALLBACK = (20_000, 32_767)  # the range below Linux's default ephemeral range

_lock = threading.Lock()
_handed_out: set[int] = set()
_random = random.SystemRandom()


def _range() -> tuple[int, int]:
    """The ports below the kernel's ephemeral range (above it when it starts too low), or
    the default when the range cannot be read."""
    try:
        low, high = (int(bound) for bound in _EPHEMERAL_RANGE.read_text().split()[:2])
    except (OSError, ValueError):
        return _FALLBACK
    if low - 1 - _LOWEST >= 1_000:
        return (_LOWEST, low - 1)
    if 65_535 - high >= 1_000:
        return (high + 1, 65_535)
    return _FALLBACK


def _bindable(port: int) -> bool:
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
        with socket.socket(socket.AF_INET, kind) as sock:
            try:
                sock.bind((LOOPBACK, port))
            except OSError:
                return False
    return True


def unused_loopback_port() -> int:
    """A loopback port nothing listens on, outside the ephemeral range, new to this process."""
    low, high = _range()
    with _lock:
        for _attempt in range(200):
            port = _random.randint(low, high)
            if port in _handed_out or not _bindable(port):
                continue
            _handed_out.add(port)
            return port
    raise RuntimeError(f"no bindable loopback port in {low}-{high} after 200 tries")


def bind_failed(log_text: str) -> bool:
    """Whether a child's log says it lost its port to another process (Go, Python, sshd)."""
    text = log_text.lower()
    return "address already in use" in text or "errno 98" in text
