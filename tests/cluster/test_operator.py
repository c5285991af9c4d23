"""The operator process against the real API server: acknowledgement, validation, leadership."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from calibration import scaled
from clusterkit import ClusterHandle, OperatorProcess, start_operator, wait_for

pytestmark = pytest.mark.cluster


def _apply(cluster: ClusterHandle, namespace: str, obj: dict[str, Any]) -> None:
    cluster.kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(obj))


def _node(name: str, policy: str | None = None, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"nodeType": "CloudVM", "instanceType": "m5.large", **spec}
    if policy:
        body["policyRef"] = {"name": policy}
    return {
        "apiVersion": "nodewarden.io/v1alpha1",
        "kind": "WorkerNode",
        "metadata": {"name": name},
        "spec": body,
    }


def _policy(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "nodewarden.io/v1alpha1",
        "kind": "PowerPolicy",
        "metadata": {"name": name},
        "spec": {},
    }


def _valid(cluster: ClusterHandle, namespace: str, kind: str, name: str) -> dict[str, Any] | None:
    obj = cluster.get_json(namespace, kind, name)
    status = obj.get("status") or {}
    if status.get("observedGeneration") != obj["metadata"]["generation"]:
        return None
    for cond in status.get("conditions", []):
        if (
            cond["type"] == "Valid"
            and cond.get("observedGeneration") == obj["metadata"]["generation"]
        ):
            return cond  # type: ignore[no-any-return]
    return None


def test_operator_acknowledges_a_workernode(
    cluster: ClusterHandle, namespace: str, operator: OperatorProcess
) -> None:
    _apply(cluster, namespace, _policy("default"))
    _apply(cluster, namespace, _node("vm1", "default"))
    cond = wait_for(
        lambda: _valid(cluster, namespace, "wn", "vm1"), timeout=10, what="Valid condition"
    )
    assert cond["status"] == "True"
    assert cond["reason"] == "Valid"
    # a spec change is acknowledged with the new generation
    _apply(cluster, namespace, _node("vm1", "default", idleBehavior="hold"))
    cond = wait_for(
        lambda: _valid(cluster, namespace, "wn", "vm1"), timeout=10, what="new generation"
    )
    assert cluster.get_json(namespace, "wn", "vm1")["status"]["observedGeneration"] == 2


def test_a_cloud_vm_there_before_the_start_is_acknowledged_promptly(
    cluster: ClusterHandle, namespace: str, tmp_path: Path
) -> None:
    """A WorkerNode that exists when the operator starts (a restart, or one created while
    a fresh API server answered 429 "storage is (re)initializing" and the first LIST
    waited) is part of the start-up fleet, whose first status writes wait for their
    facts: with no cloud configured a CloudVM's never come, and its Valid was held for
    the whole `power.first_write_hold` (20 s)."""
    _apply(cluster, namespace, _policy("default"))
    _apply(cluster, namespace, _node("vm1", "default"))
    op = start_operator(cluster, namespace, tmp_path)
    try:
        cond = wait_for(
            lambda: _valid(cluster, namespace, "wn", "vm1"), timeout=10, what="Valid condition"
        )
        assert cond["status"] == "True", cond
    finally:
        op.stop()


def _wait_valid(cluster: ClusterHandle, namespace: str, name: str) -> None:
    def valid() -> bool:
        cond = _valid(cluster, namespace, "wn", name)
        return bool(cond and cond["status"] == "True")

    wait_for(valid, timeout=10, what=f"{name} Valid=True")


def test_dangling_policy_reference_is_invalid_and_others_still_served(
    cluster: ClusterHandle, namespace: str, operator: OperatorProcess
) -> None:
    _apply(cluster, namespace, _policy("default"))
    _apply(cluster, namespace, _node("orphan", "does-not-exist"))
    _apply(cluster, namespace, _node("fine-1", "default"))
    cond = wait_for(
        lambda: _valid(cluster, namespace, "wn", "orphan"), timeout=10, what="orphan Valid"
    )
    assert cond["status"] == "False"
    assert cond["reason"] == "PolicyNotFound"
    assert "spec.policyRef.name" in cond["message"]
    assert "does-not-exist" in cond["message"]
    # Valid may read False for a moment (the node seen before its policy): wait for True
    _wait_valid(cluster, namespace, "fine-1")
    # a node created after the broken one is still served
    _apply(cluster, namespace, _node("fine-2", "default"))
    _wait_valid(cluster, namespace, "fine-2")
    # a Warning event tells the user
    events = wait_for(
        lambda: [
            e
            for e in cluster.get_json(namespace, "events")["items"]
            if e["involvedObject"]["name"] == "orphan" and e["reason"] == "PolicyNotFound"
        ],
        timeout=10,
        what="PolicyNotFound event",
    )
    assert events[0]["type"] == "Warning"
    # creating the missing policy repairs the node without touching it
    _apply(cluster, namespace, _policy("does-not-exist"))

    _wait_valid(cluster, namespace, "orphan")


def test_an_undesignated_secret_reference_does_not_say_whether_the_secret_exists(
    cluster: ClusterHandle, namespace: str, operator: OperatorProcess
) -> None:
    """Validation is no oracle: a WorkerNode author learns "not designated, or absent"
    (tests/credentials covers the same message for every cause and the designated path)."""
    node = _node("side", None)
    node["spec"] = {
        "nodeType": "SideNode",
        "controlMethod": "Redfish",
        "capacity": {"vcpus": 4, "ram": "8Gi"},
        "bmc": {
            "endpoint": "https://bmc.example",
            "usernameSecretRef": {"name": "bmc", "key": "username"},
            "passwordSecretRef": {"name": "bmc", "key": "password"},
        },
    }
    _apply(cluster, namespace, node)
    cond = wait_for(lambda: _valid(cluster, namespace, "wn", "side"), timeout=10)
    assert cond["status"] == "False"
    assert cond["reason"] == "CredentialsNotDesignated"
    assert "spec.bmc.usernameSecretRef: Secret 'bmc' (key 'username')" in cond["message"]
    assert "bmc.example:443 is not an admitted BMC endpoint" in cond["message"]
    assert "Secret 'bmc' not found" not in cond["message"]


def test_powerintent_for_missing_node_is_invalid(
    cluster: ClusterHandle, namespace: str, operator: OperatorProcess
) -> None:
    intent = {
        "apiVersion": "nodewarden.io/v1alpha1",
        "kind": "PowerIntent",
        "metadata": {"name": "off-ghost"},
        "spec": {"nodeName": "ghost", "action": "Shutdown", "requestedBy": "alice"},
    }
    _apply(cluster, namespace, intent)
    cond = wait_for(lambda: _valid(cluster, namespace, "pi", "off-ghost"), timeout=10)
    assert cond["status"] == "False"
    assert cond["reason"] == "NodeNotFound"
    assert "spec.nodeName" in cond["message"]


def test_policy_status_has_hash_and_node_count(
    cluster: ClusterHandle, namespace: str, operator: OperatorProcess
) -> None:
    _apply(cluster, namespace, _policy("p1"))
    _apply(cluster, namespace, _node("a", "p1"))
    _apply(cluster, namespace, _node("b", "p1"))

    def counted() -> dict[str, Any] | None:
        status = cluster.get_json(namespace, "pp", "p1").get("status") or {}
        return status if status.get("nodes") == 2 and status.get("contentHash") else None

    status = wait_for(counted, timeout=15, what="policy status")
    assert len(status["contentHash"]) == 16


def test_metrics_and_health_endpoints(
    cluster: ClusterHandle, namespace: str, operator: OperatorProcess
) -> None:
    assert operator.get("/healthz")[0] == 200
    # a lone replica is "starting" (503) until its first lease attempt, then leader; ready
    # (200) once its handlers run
    wait_for(lambda: _role(operator) == "leader", timeout=15, what="leader role")
    code, body = wait_for(lambda: (r := operator.get("/readyz"))[0] == 200 and r, timeout=10)
    assert json.loads(body)["role"] == "leader"
    code, text = operator.get("/metrics")
    assert code == 200
    assert 'nodewarden_leader{dispatcher_id="nodewarden"} 1.0' in text
    assert "nodewarden_build_info" in text


def _role(op: OperatorProcess) -> str | None:
    try:
        return str(json.loads(op.get("/readyz")[1])["role"])
    except (OSError, ValueError):
        return None


def test_two_replicas_never_both_act_and_standby_takes_over(
    cluster: ClusterHandle, namespace: str, tmp_path: Path
) -> None:
    a = start_operator(cluster, namespace, tmp_path, name="a")
    b = start_operator(cluster, namespace, tmp_path, name="b")
    try:

        def roles() -> tuple[str | None, str | None] | None:
            pair = (_role(a), _role(b))
            return pair if set(pair) == {"leader", "standby"} else None

        got = wait_for(roles, timeout=20, what="one leader, one standby")
        leader, standby = (a, b) if got[0] == "leader" else (b, a)
        _apply(cluster, namespace, _node("n1"))
        wait_for(lambda: _valid(cluster, namespace, "wn", "n1"), timeout=10)
        # the standby never wrote anything: every status write carries the leader's field manager
        assert "handlers running" not in standby.logs()
        # kill the leader without letting it release the lease
        leader.stop(signal.SIGKILL)
        wait_for(lambda: _role(standby) == "leader", timeout=40, what="standby takes over")
        _apply(cluster, namespace, _node("n2"))
        wait_for(lambda: _valid(cluster, namespace, "wn", "n2"), timeout=15, what="new leader acts")
    finally:
        a.stop()
        b.stop()


def test_clean_stop_releases_the_lease_quickly(
    cluster: ClusterHandle, namespace: str, tmp_path: Path
) -> None:
    a = start_operator(cluster, namespace, tmp_path, name="a")
    wait_for(lambda: _role(a) == "leader", timeout=20)
    b = start_operator(cluster, namespace, tmp_path, name="b")
    try:
        wait_for(lambda: _role(b) == "standby", timeout=20)
        asked = time.monotonic()
        assert a.stop() == 0
        # nothing in flight: it exits at once (kopf waited 5 s for the lease heartbeat, a
        # task begun after kopf started, before it cancelled it)
        took = time.monotonic() - asked
        assert took < scaled(4.0), f"a clean stop took {took:.1f}s"
        wait_for(lambda: _role(b) == "leader", timeout=10, what="takeover after release")
    finally:
        b.stop()
