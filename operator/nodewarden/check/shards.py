"""Check sharding (`sharding.shards` > 1): each shard Lease's holder and the age of its
record, the nodes no shard owns (pure evaluation; docs/sharding.md).

    shard_results(shards, dispatcher_id, namespace, leases, nodes, now) -> [CheckResult]

`leases` maps a Lease name to its spec (as `check.lease` reads one); `nodes` are the
WorkerNode bodies. One line per shard (held by whom, renewed how long ago; free or stale:
a warning, its nodes are acted on by nobody), then one line for the nodes: unlabelled
ones wait for the resharder, a label naming a shard outside the count is acted on by no
replica configured with this count (its resharder leaves such nodes alone: the labels
come from a higher count, a rollout not converged, or a shrink, which is not built), and
nodes labelled for another count than this one are being moved (or the replica running
the resharder has another count: the rollout has not converged).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from nodewarden.check.lease import parse_time
from nodewarden.check.result import CheckResult, passed, warned
from nodewarden.shards import keys
from nodewarden.shards.keys import DRAIN_LABEL, SHARD_LABEL, lease_name, parse_shard

CHECK = "shards"


def _shard_line(
    shard: int, name: str, spec: Mapping[str, Any] | None, nodes: int, now: datetime, where: str
) -> CheckResult:
    lease = f"shard {shard} (Lease {name}, {nodes} nodes)"
    spec = spec or {}
    holder = spec.get("holderIdentity")
    if not holder:
        return warned(
            CHECK,
            f"{lease} is held by no replica: its nodes are acted on by nobody",
            f"is the operator running? kubectl -n {where} get pods",
        )
    renewed = parse_time(spec.get("renewTime")) or parse_time(spec.get("acquireTime"))
    duration = float(spec.get("leaseDurationSeconds") or 0)
    if renewed is None:
        return warned(CHECK, f"{lease} is held by {holder}, but has no renew time")
    age = (now - renewed).total_seconds()
    if age > duration:
        return warned(
            CHECK,
            f"{lease}: {holder} last renewed it {age:.0f}s ago, longer than its {duration:g}s "
            "duration: no replica took it over",
            f"kubectl -n {where} get pods; the operator's logs say why",
        )
    return passed(CHECK, f"{lease} held by {holder}, renewed {max(age, 0):.0f}s ago")


def shard_results(
    shards: int,
    dispatcher_id: str,
    namespace: str,
    leases: Mapping[str, Mapping[str, Any]],
    nodes: Sequence[Mapping[str, Any]],
    now: datetime,
) -> list[CheckResult]:
    if shards <= 1:
        return []
    per_shard: Counter[int] = Counter()
    unlabelled, stray, draining, elsewhere = 0, 0, 0, 0
    for body in nodes:
        meta = body.get("metadata") or {}
        labels = meta.get("labels") or {}
        shard = parse_shard(labels.get(SHARD_LABEL))
        if DRAIN_LABEL in labels:
            draining += 1
        if shard is None:
            unlabelled += 1
        elif shard >= shards:
            stray += 1
        else:
            per_shard[shard] += 1
            name = meta.get("name")
            if name and shard != keys.shard_of(keys.node_key(namespace, name), shards):
                elsewhere += 1
    results = [
        _shard_line(
            s,
            lease_name(dispatcher_id, s),
            leases.get(lease_name(dispatcher_id, s)),
            per_shard[s],
            now,
            namespace,
        )
        for s in range(shards)
    ]
    if unlabelled or stray or elsewhere:
        parts = []
        if unlabelled:
            parts.append(f"{unlabelled} WorkerNodes have no shard label (the resharder adds it)")
        if stray:
            parts.append(
                f"{stray} name a shard outside 0..{shards - 1}: acted on by no replica with "
                f"{shards} shards, left alone by its resharder (labelled for a higher count: "
                "a rollout not converged; a shrink is not built)"
            )
        if elsewhere:
            parts.append(
                f"{elsewhere} are labelled for another shard count than {shards} (resharding "
                "under way; if it persists, the replica running the resharder has another "
                "count: the rollout has not converged)"
            )
        results.append(
            warned(
                CHECK,
                "; ".join(parts),
                f"kubectl -n {namespace} get workernodes -L {SHARD_LABEL}",
            )
        )
    else:
        results.append(
            passed(
                CHECK,
                f"every WorkerNode names one of the {shards} shards"
                + (f" ({draining} leaving theirs)" if draining else ""),
            )
        )
    return results
