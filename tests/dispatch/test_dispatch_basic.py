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
    # each shutdown is a policy-made PowerIntent whose Safety Record is confirmed by the
    # instance leaving the cloud list (the destroy call itself proves nothing)
    used = {status["node"] for status in by_name.values()}
    intents = env.cluster.get_json(env.namespace, "pi")["items"]
    for node in used:
        mine = [i for i in intents if i["spec"]["nodeName"] == node]
        assert [i["spec"]["action"] for i in mine] == ["Shutdown"], mine
        (intent,) = mine
        st = intent["status"]
        assert intent["spec"]["source"] == "Policy"
        assert st["phase"] == "Succeeded", st
        assert "POWER_OFF_CONFIRMED" in st["reasons"]
        record = st["safetyRecord"]
        assert record["nodeType"] == "CloudVM"
        # the decision that sent the destroy: the node-manager rule and every gate
        sent = st["requestRecord"]
        assert sent["decision"] == "SHUTDOWN" and "IDLE_EXCEEDED" in sent["reasons"], sent
        assert sent["gates"] and all(g["verdict"] != "FAIL" for g in sent["gates"]), sent["gates"]
        assert record["request"]["action"] == "GracefulShutdown"
        assert record["request"]["detail"] == "destroy accepted (not proof of Off)"
        confirmation = record["confirmation"]
        assert confirmation["confirmed"] is True and confirmation["observed"] == "Off"
        assert confirmation["source"].startswith("cloud:"), confirmation
        assert "no longer listed" in confirmation["source"], confirmation


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


def test_broken_runner_report_drains_the_node(env: DispatchEnv) -> None:
    env.start_operator()
    apply_many(env, [container("long", 21, duration=600)])
    env.wait_phases({"long": "Running"}, timeout=90)
    node = env.cluster.get_json(env.namespace, "cd", "long")["status"]["node"]
    vm = next(v for v in env.ours() if v.tags.get("nodewarden-node") == node)
    env.stub.admin.set_worker_faults(vm.id, runner_broken=True)

    def draining() -> dict[str, Any] | None:
        status = env.cluster.get_json(env.namespace, "wn", node).get("status") or {}
        return status if status.get("state") == "Draining" else None

    status = wait_for(draining, timeout=30, interval=0.5, what="node draining")
    assert status["admission"] == "Closed"
    assert "NODE_BROKEN" in status["lastSafetyRecord"]["reasons"]
    # new work goes elsewhere, never to the broken node
    apply_many(env, [container("next", 22, duration=1)])
    env.wait_phases({"next": "Complete"}, timeout=90)
    assert env.cluster.get_json(env.namespace, "cd", "next")["status"]["node"] != node
    # once its container is gone the broken node is shut down
    env.cluster.kubectl(
        "-n", env.namespace, "patch", "cd", "long", "--type=merge", "-p", '{"spec":{"cancel":true}}'
    )
    env.wait_no_nodes(timeout=90)


def test_idle_behavior_is_written_to_the_instance_tag(env: DispatchEnv) -> None:
    env.start_operator()
    env.apply(
        {
            "apiVersion": "nodewarden.io/v1alpha1",
            "kind": "WorkerNode",
            "metadata": {"name": "tagged"},
            "spec": {"nodeType": "CloudVM", "instanceType": "small", "idleBehavior": "hold"},
        }
    )

    def tag() -> str | None:
        vms = [v for v in env.ours() if v.tags.get("nodewarden-node") == "tagged"]
        return vms[0].tags.get("nodewarden-idle-behavior") if vms else None

    assert wait_for(tag, timeout=60, interval=0.5, what="instance created") == "hold"
    env.cluster.kubectl(
        "-n",
        env.namespace,
        "patch",
        "wn",
        "tagged",
        "--type=merge",
        "-p",
        '{"spec":{"idleBehavior":"drain"}}',
    )
    wait_for(lambda: tag() in ("drain", None), timeout=30, interval=0.5, what="tag updated")
    # drain: no new work and, being idle, shut down
    env.wait_no_nodes(timeout=60)
