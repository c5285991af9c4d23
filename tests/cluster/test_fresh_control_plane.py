"""The operator started with its control plane (a cluster upgrade, a restarted API server):
its first requests meet a kube-apiserver whose watch caches are still filling, answered
429 "storage is (re)initializing" -- the session's shared control plane shows that only to
whichever test runs first. Here a control plane of the test's own, and the operator
started the moment it answers: every object is acknowledged promptly once the API
answers (before the fix, a CloudVM WorkerNode created meanwhile joined the start-up
fleet and its first status write, its Valid with it, waited 20 s for a cloud list that
never comes: `power.firstwrites`). A container that nothing can run (no side node, no
cloud) is acknowledged too and says why it waits, and the dispatcher then rests (before
the fix, its wait write was spawned as a task holding the container in flight, which the
write took for a start under way and skipped: no status, and a plan every round)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from clusterkit import ClusterHandle, OperatorProcess, start_operator, wait_for
from dispatchkit import container
from localcluster import LocalCluster

pytestmark = pytest.mark.cluster

NS = "fresh"


@pytest.fixture
def fresh(tmp_path: Path) -> Iterator[ClusterHandle]:
    if os.environ.get("NODEWARDEN_TEST_KUBECONFIG"):
        pytest.skip("needs the local control plane's binaries (runs against a given cluster)")
    local = LocalCluster(state_dir=tmp_path / "cluster", namespace=NS)
    local.up()
    try:
        yield ClusterHandle(local.kubeconfig, local)
    finally:
        local.down()


def _apply(cluster: ClusterHandle, obj: dict[str, Any]) -> None:
    cluster.kubectl("-n", NS, "apply", "-f", "-", input=json.dumps(obj))


def _valid(cluster: ClusterHandle, kind: str, name: str) -> dict[str, Any] | None:
    obj = cluster.get_json(NS, kind, name)
    generation = obj["metadata"]["generation"]
    for cond in (obj.get("status") or {}).get("conditions", []):
        if cond["type"] == "Valid" and cond.get("observedGeneration") == generation:
            return cond  # type: ignore[no-any-return]
    return None


def _plans(op: OperatorProcess) -> float:
    """The dispatcher's plans so far (every trigger), from its metrics."""
    status, text = op.get("/metrics")
    assert status == 200, text[:200]
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("nodewarden_dispatch_plans_total{")
    )


def test_objects_are_acknowledged_promptly_by_an_operator_started_with_its_api_server(
    fresh: ClusterHandle, tmp_path: Path
) -> None:
    op = start_operator(fresh, NS, tmp_path)
    try:
        group = "nodewarden.io/v1alpha1"
        _apply(fresh, {"apiVersion": group, "kind": "PowerPolicy", "metadata": {"name": "default"}, "spec": {}})  # fmt: skip
        node_spec = {"nodeType": "CloudVM", "instanceType": "m5.large", "policyRef": {"name": "default"}}  # fmt: skip
        _apply(fresh, {"apiVersion": group, "kind": "WorkerNode", "metadata": {"name": "vm1"}, "spec": node_spec})  # fmt: skip
        intent = {"nodeName": "ghost", "action": "Shutdown", "requestedBy": "alice"}
        _apply(fresh, {"apiVersion": group, "kind": "PowerIntent", "metadata": {"name": "off-ghost"}, "spec": intent})  # fmt: skip
        _apply(fresh, container("nowhere", 1))

        def acknowledged() -> dict[str, Any] | None:
            found = {
                "pp": _valid(fresh, "pp", "default"),
                "wn": _valid(fresh, "wn", "vm1"),
                "pi": _valid(fresh, "pi", "off-ghost"),
                "cd": _valid(fresh, "containerdispatch", "nowhere"),
            }
            return found if all(found.values()) else None

        found = wait_for(acknowledged, timeout=10, what="Valid on each object")
        assert found["pp"]["status"] == "True", found
        assert found["wn"]["status"] == "True", found
        assert found["pi"]["status"] == "False", found  # its node does not exist
        assert found["cd"]["status"] == "True", found
        waiting = fresh.get_json(NS, "containerdispatch", "nowhere")["status"]
        assert waiting["phase"] == "Queued", waiting
        assert "no side node fits it and no cloud is configured" in waiting["schedulingStatus"]
        # ... and the dispatcher rests: no plan per round for a container it cannot place
        # (a rate over a window, not a wait for a condition: it ticks every 0.2 s)
        before = _plans(op)
        time.sleep(3)
        assert _plans(op) - before <= 2, (before, _plans(op))
    finally:
        op.stop()
