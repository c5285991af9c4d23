"""The small fleet and traces of the peer tests (hand-computed costs).

Two VM types, `small` (2 vCPUs, 4Gi, 3.6/h = 0.001 per second) and `big` (8 vCPUs, 32Gi,
5.4/h = 0.0015 per second), billed per second without a minimum; create 0 s, boot 60 s,
destroy = the API latency 1 s + shutdown 20 s; containers start 2 s after they are
placed; no RAM overhead.
"""

from __future__ import annotations

from typing import Any

from nodewarden.simulate.fleet import Fleet, load_fleet
from nodewarden.simulate.trace import Trace, parse_trace

SMALL, BIG = 0.001, 0.0015  # price per second
BOOT, OFF, START = 60, 21, 2  # boot; API latency + shutdown; runner start


def fleet(side: list[dict[str, Any]] | None = None) -> Fleet:
    return load_fleet(
        {
            "cloud": {
                "instanceTypes": [
                    {"name": "small", "vcpus": 2, "ram": "4Gi", "price": 3.6},
                    {"name": "big", "vcpus": 8, "ram": "32Gi", "price": 5.4},
                ],
                "instanceTypePolicy": {"ram_overhead": 0, "ram_discount_percent": 0},
                "billing": {"period": "0s", "minimum": "0s"},
                "createLatency": "0s",
                "boot": "60s",
                "shutdown": "20s",
            },
            "sideNodes": side or [],
            "controller": {"tickInterval": "1s", "apiLatency": "1s", "startLatency": "2s"},
        }
    )


def trace(*rows: str) -> Trace:
    return parse_trace("arrival,runtime,vcpus,ram\n" + "\n".join(rows) + "\n", "csv")
