"""`nodewarden check`'s sharding lines (pure): each shard Lease's holder and age, and the
WorkerNodes no shard owns."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from nodewarden.check.result import Status
from nodewarden.check.shards import shard_results
from nodewarden.shards.keys import DRAIN_LABEL, SHARD_LABEL, node_key, shard_of

NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)


def lease(holder: str, age: float) -> dict[str, Any]:
    return {
        "holderIdentity": holder,
        "renewTime": NOW - timedelta(seconds=age),
        "leaseDurationSeconds": 15,
    }


def node(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}}


def test_sharding_off_adds_no_line() -> None:
    assert shard_results(1, "nw", "ns", {}, [], NOW) == []


def test_each_shard_says_who_holds_it_and_stale_or_free_ones_warn() -> None:
    leases = {"nw-shard-0": lease("pod-a", 3), "nw-shard-1": lease("pod-b", 60)}
    nodes = [node("a", **{SHARD_LABEL: "0"}), node("f", **{SHARD_LABEL: "1"})]  # their shards
    results = shard_results(3, "nw", "ns", leases, nodes, NOW)
    assert [r.status for r in results] == [Status.PASS, Status.WARN, Status.WARN, Status.PASS]
    assert "shard 0 (Lease nw-shard-0, 1 nodes) held by pod-a, renewed 3s ago" in results[0].message
    assert "60s ago" in results[1].message
    assert "held by no replica" in results[2].message


def test_unlabelled_and_out_of_range_nodes_are_named() -> None:
    leases = {f"nw-shard-{s}": lease("pod-a", 1) for s in range(2)}
    nodes = [
        node("a"),
        node("b", **{SHARD_LABEL: "5"}),
        node("c", **{SHARD_LABEL: "1", DRAIN_LABEL: "1"}),
    ]
    last = shard_results(2, "nw", "ns", leases, nodes, NOW)[-1]
    assert last.status is Status.WARN
    assert "1 WorkerNodes have no shard label" in last.message
    assert "1 name a shard outside 0..1" in last.message


def test_nodes_labelled_for_another_count_are_named() -> None:
    """The check's count disagrees with the labels: nodes in range but not in their shard
    under it are being moved (or the resharder runs another count)."""
    leases = {f"nw-shard-{s}": lease("pod-a", 1) for s in range(3)}
    names = [f"n{i}" for i in range(40)]
    moved = [n for n in names if shard_of(node_key("ns", n), 2) != shard_of(node_key("ns", n), 3)]
    nodes = [node(n, **{SHARD_LABEL: str(shard_of(node_key("ns", n), 2))}) for n in names]
    last = shard_results(3, "nw", "ns", leases, nodes, NOW)[-1]
    assert last.status is Status.WARN
    assert f"{len(moved)} are labelled for another shard count than 3" in last.message
    settled = [node(n, **{SHARD_LABEL: str(shard_of(node_key("ns", n), 3))}) for n in names]
    assert shard_results(3, "nw", "ns", leases, settled, NOW)[-1].status is Status.PASS
