"""Dispatcher end to end on the real control plane with the stub cloud: the happy path."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from clusterkit import ClusterHandle, wait_for
from dispatchkit import DispatchEnv, apply_many, container

pytestmark = pytest.mark.cluster


@pytest.fixture
def env(cluster: ClusterHandle, namespace: str, tmp_path: Path) -> Iterator[DispatchEnv]:
    e = DispatchEnv.create(cluster, namespace, tmp_path)
    yield e
    e.close()


def test_containers_run_complete_and_idle_nodes_go_away(env: DispatchEnv) -> None:
    env.start_operator()
    apply_many(
        env,
        [
            container("c1", 1, vcpus=1, duration=2),
            container("c2", 2, vcpus=1, duration=2, exit_code=3),
            container("c3", 3, vcpus=3, ram="8Gi", duration=2),
        ],
    )
    env.wait_phases({"c1": "Complete", "c2": "Complete", "c3": "Complete"}, timeout=120)
    by_name = {c["metadata"]["name"]: c["status"] for c in env.containers()}
    assert by_name["c2"]["exitCode"] == 3
    assert by_name["c1"]["exitCode"] == 0
    for status in by_name.values():
        assert status["attempts"] == 1
        assert status["node"]
    # idle nodes are shut down by the matrix (idle threshold 3s, per-second billing)
    env.wait_no_nodes(timeout=120)


def test_declared_cloud_node_gets_an_instance_and_deleting_it_destroys_the_instance(
    env: DispatchEnv,
) -> None:
    env.start_operator()
    env.apply(
        {
            "apiVersion": "nodewarden.io/v1alpha1",
            "kind": "WorkerNode",
            "metadata": {"name": "warm-medium"},
            "spec": {"nodeType": "CloudVM", "instanceType": "medium", "idleBehavior": "hold"},
        }
    )

    def ready() -> dict[str, Any] | None:
        status = env.cluster.get_json(env.namespace, "wn", "warm-medium").get("status") or {}
        return status if status.get("readiness") == "Ready" and status.get("instanceId") else None

    status = wait_for(ready, timeout=60, interval=1, what="declared node ready")
    assert status["state"] == "Idle"
    assert status["admission"] == "Closed"  # hold: no new work
    time.sleep(5)  # longer than the idle threshold: hold keeps it
    assert [vm.id for vm in env.ours()] == [status["instanceId"]]
    env.cluster.kubectl("-n", env.namespace, "delete", "wn", "warm-medium", "--wait=false")
    env.wait_no_nodes(timeout=60)
