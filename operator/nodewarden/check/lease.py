"""Check the leader Lease: who holds it and how long ago it was renewed (pure evaluation)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from nodewarden.check.result import CheckResult, passed, warned


def parse_time(value: object) -> datetime | None:
    """A Kubernetes timestamp (datetime or RFC 3339 text), or None."""
    if isinstance(value, datetime):
        return value
    if isinstance(value, str) and value:
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
    return None


def lease_result(
    lease: Mapping[str, Any] | None, name: str, namespace: str, now: datetime, enabled: bool
) -> CheckResult:
    """`lease` is the Lease's spec (None: it does not exist); `now` is the API server's time."""
    if not enabled:
        return warned(
            "lease",
            "leader election is disabled (leader_election.enabled: false): run exactly one replica",
        )
    where = f"Lease {namespace}/{name}"
    if lease is None:
        return warned(
            "lease",
            f"{where} does not exist: no operator of this dispatcher has run yet",
            f"is the operator Deployment running? kubectl -n {namespace} get deploy,pods",
        )
    holder = lease.get("holderIdentity")
    renewed = parse_time(lease.get("renewTime")) or parse_time(lease.get("acquireTime"))
    duration = float(lease.get("leaseDurationSeconds") or 0)
    if not holder:
        return warned(
            "lease",
            f"{where} is free: no replica acts now (released on the last clean stop)",
            f"is the operator Deployment running? kubectl -n {namespace} get deploy,pods",
        )
    if renewed is None:
        return warned("lease", f"{where} is held by {holder}, but has no renew time")
    age = (now - renewed).total_seconds()
    if age > duration:
        return warned(
            "lease",
            f"{where}: {holder} last renewed it {age:.0f}s ago, longer than its {duration:g}s "
            "duration: the leader is gone and no standby took over",
            f"kubectl -n {namespace} get pods; the operator's logs say why",
        )
    return passed("lease", f"{where} held by {holder}, renewed {max(age, 0):.0f}s ago")
