"""Reading the local API server's audit log: the operator's requests in one namespace.

The local control plane (e2e/localcluster.py) audits every request of the operator's own
identity at Metadata level, one JSON line per request. Used by the API-economy test and
benchmarks/bench_dispatch.py to count requests by verb and resource.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from localcluster import OPERATOR_USER

WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})


def audit_events(log: Path, namespace: str) -> list[dict[str, Any]]:
    """The operator's audited requests to objects in `namespace`, in log order."""
    out = []
    with log.open() as lines:
        for line in lines:
            if namespace not in line:
                continue
            event = json.loads(line)
            if (event.get("user") or {}).get("username") != OPERATOR_USER:
                continue
            if (event.get("objectRef") or {}).get("namespace") == namespace:
                out.append(event)
    return out


def is_write(event: dict[str, Any]) -> bool:
    return event.get("verb") in WRITE_VERBS


def resource_of(event: dict[str, Any]) -> str:
    ref = event.get("objectRef") or {}
    sub = ref.get("subresource")
    return f"{ref.get('resource', '?')}/{sub}" if sub else str(ref.get("resource", "?"))


def write_breakdown(events: Iterable[dict[str, Any]]) -> Counter[str]:
    """Writes by 'verb resource[/subresource]'."""
    return Counter(f"{e['verb']} {resource_of(e)}" for e in events if is_write(e))


def breakdown(events: Iterable[dict[str, Any]]) -> Counter[str]:
    """Every request (reads, lists and watches too) by 'verb resource[/subresource]'."""
    return Counter(f"{e.get('verb', '?')} {resource_of(e)}" for e in events)
