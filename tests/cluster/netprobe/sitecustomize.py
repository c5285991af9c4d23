"""Test instrumentation (tests/cluster/test_demo.py): where a Python process sends traffic.

Put on PYTHONPATH of `e2e/demo.py`, it is imported by every Python process the demo
starts (the operator, the side nodes, the stub cloud, sushy-tools) and appends one JSON
line per name lookup (`getaddrinfo`, `gethostbyname`), connect and `sendto` to the file
named by NETPROBE_LOG. It changes nothing else; without NETPROBE_LOG it does nothing.
"""

from __future__ import annotations

import json
import os
import socket
from typing import Any

_LOG = os.environ.get("NETPROBE_LOG")


def _record(kind: str, target: Any) -> None:
    if isinstance(target, tuple):
        target = list(target[:2])
    elif isinstance(target, bytes):
        target = target.decode(errors="replace")
    try:
        with open(_LOG or "", "a") as out:
            out.write(json.dumps({"pid": os.getpid(), "kind": kind, "target": target}) + "\n")
    except (OSError, TypeError):
        pass


if _LOG:
    _getaddrinfo = socket.getaddrinfo
    _gethostbyname = socket.gethostbyname

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        _record("lookup", host)
        return _getaddrinfo(host, *args, **kwargs)

    def gethostbyname(host: str) -> str:
        _record("lookup", host)
        return _gethostbyname(host)

    class _Socket(socket.socket):
        def connect(self, address: Any) -> None:
            _record("connect", address)
            super().connect(address)

        def connect_ex(self, address: Any) -> int:
            _record("connect", address)
            return super().connect_ex(address)

        def sendto(self, data: Any, *args: Any) -> int:
            _record("sendto", args[-1])
            return super().sendto(data, *args)  # type: ignore[call-overload,no-any-return]

    socket.getaddrinfo = getaddrinfo
    socket.gethostbyname = gethostbyname
    socket.socket = _Socket  # type: ignore[misc]
