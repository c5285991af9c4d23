"""The feed's wiring in the live operator: informers for the hot kinds, kopf for the rest.

One side node behind the project's fake BMC (polled every 2 s, probed over SSH every
second), one ContainerDispatch and the operator as a process. Checked against the API
server's audit log (every request of the operator's identity, with its User-Agent) and
the operator's own metrics:

- kopf opens no watch on WorkerNodes or ContainerDispatches (and still watches
  PowerPolicies, so the check can see kopf), the informers do; no kopf annotation or
  finalizer appears on either kind;
- a WorkerNode edit reaches the power controller (its Valid condition follows it);
- a fleet where nothing changes makes no status write over several evaluation rounds,
  although the BMC is polled and the node probed all along.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from clusterkit import ClusterHandle, OperatorProcess, start_operator, wait_for
from dispatchkit import container
from localcluster import OPERATOR_USER
from nodewarden.power.inforce import WRITE_GAP
from powerkit import PowerEnv, side_node_entry

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

HOT = ("workernodes", "containerdispatches")
WRITES = ("patch_status", "patch", "create", "delete", "create_event", "patch_event")


@pytest.fixture
def env(cluster: ClusterHandle, namespace: str, tmp_path: Path) -> Iterator[PowerEnv]:
    env = PowerEnv.create(
        cluster,
        namespace,
        tmp_path,
        [side_node_entry("held")],
        node_specs={"held": {"idleBehavior": "hold"}},  # on, idle, never switched off
    )
    try:
        yield env
    finally:
        env.close()


def _counters(op: OperatorProcess) -> dict[str, float]:
    text = op.get("/metrics")[1]
    out: dict[str, float] = {}
    for name, labels, value in re.findall(r"^nodewarden_(\w+)\{([^}]*)\} (\S+)$", text, re.M):
        out[f"{name}{{{labels}}}"] = float(value)
    return out


def _writes(op: OperatorProcess) -> dict[str, float]:
    """The operator's write requests so far, by verb (status writes separately)."""
    counters = _counters(op)
    out = {v: counters.get(f'kube_requests_total{{verb="{v}"}}', 0.0) for v in WRITES}
    out["status_writes"] = sum(v for k, v in counters.items() if k.startswith("status_writes"))
    return out


def _audit(cluster: ClusterHandle, namespace: str) -> list[dict[str, Any]]:
    assert cluster.local is not None
    events = []
    with cluster.local.audit_log.open() as lines:
        for line in lines:
            if namespace in line:
                event = json.loads(line)
                if (event.get("user") or {}).get("username") == OPERATOR_USER and (
                    event.get("objectRef") or {}
                ).get("namespace") == namespace:
                    events.append(event)
    return events


def test_hot_kinds_come_from_informers_and_an_idle_fleet_writes_nothing(
    cluster: ClusterHandle, env: PowerEnv
) -> None:
    if cluster.local is None:
        pytest.skip("needs the local control plane's audit log")
    ns = env.namespace
    env.apply(container("c-1", 11, vcpus=1, ram="1Gi", duration=5, gpus=4))  # fits nowhere
    op = env.start_operator()
    wait_for(
        lambda: (
            (env.status("held").get("readiness") == "Ready")
            and env.status("held").get("lastSafetyRecord")
        ),
        timeout=40,
        what="held: ready, with a decision",
    )
    assert _counters(op)['informer_store_objects{kind="ContainerDispatch"}'] == 1

    # idle: once settled, several evaluation rounds (evaluate_interval 3 s, BMC poll 2 s,
    # SSH probe 1 s, re-validation 5 s) without a single write. Settled is longer than a
    # PowerPolicy's inForce coalescing gap: a change held back by it is written by then.
    quiet = WRITE_GAP.total_seconds() + 2

    def settled() -> dict[str, float] | None:
        before = _writes(op)
        time.sleep(quiet)
        after = _writes(op)
        return after if after == before else None

    start = wait_for(settled, timeout=30 + 2 * quiet, interval=0, what=f"no writes for {quiet} s")
    polls = _counters(op)
    time.sleep(10)
    assert _writes(op) == start, "an idle fleet made API writes"
    later = _counters(op)
    probes = sum(v for k, v in later.items() if k.startswith("probe_seconds_count"))
    probes -= sum(v for k, v in polls.items() if k.startswith("probe_seconds_count"))
    assert probes >= 5, "the node was not probed while idle: the window proves nothing"

    # an edit reaches the power controller through the informer
    events = _counters(op).get('informer_events_total{kind="WorkerNode",type="MODIFIED"}', 0)
    env.apply(env.worker_node("held", idleBehavior="hold", policyRef={"name": "absent"}))

    def invalid() -> dict[str, Any] | None:
        status = env.status("held")
        for cond in status.get("conditions") or []:
            if cond["type"] == "Valid" and cond.get("observedGeneration") == 2:
                return cond  # type: ignore[no-any-return]
        return None

    cond = wait_for(invalid, timeout=20, what="Valid condition of generation 2")
    assert cond["status"] == "False" and cond["reason"] == "PolicyNotFound"
    after = _counters(op).get('informer_events_total{kind="WorkerNode",type="MODIFIED"}', 0)
    assert after > events

    # kopf: no watch, no write, no annotation or finalizer on the hot kinds
    audited = _audit(cluster, ns)
    by_kopf = [e for e in audited if e.get("userAgent", "").startswith("kopf/")]
    assert {e["objectRef"]["resource"] for e in by_kopf} == {"powerpolicies", "powerintents"}
    assert not [e for e in by_kopf if e["objectRef"]["resource"] in HOT]
    watched = {
        e["objectRef"]["resource"]
        for e in audited
        if e["verb"] == "watch" and e.get("userAgent", "").startswith("nodewarden/")
    }
    assert set(HOT) <= watched
    for kind, name in (("wn", "held"), ("cd", "c-1")):
        meta = env.cluster.get_json(ns, kind, name)["metadata"]
        assert not [a for a in meta.get("annotations") or {} if a.startswith("nodewarden.io/")]
        assert "nodewarden.io/finalizer" not in (meta.get("finalizers") or [])


def test_without_a_dispatcher_containers_are_validated_once_per_change(
    cluster: ClusterHandle, namespace: str, tmp_path: Path
) -> None:
    """ContainerDispatch validation from the informer: one status write per generation,
    none from kopf, none when nothing changed."""
    if cluster.local is None:
        pytest.skip("needs the local control plane's audit log")
    config = tmp_path / "operator.yaml"
    config.write_text(json.dumps({"namespace": namespace, "dispatch": {"enabled": False}}))

    def apply(obj: dict[str, Any]) -> None:
        cluster.kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(obj))

    apply(container("early", 21))  # before the operator: from the informer's first LIST
    op = start_operator(cluster, namespace, tmp_path, f"--config={config}")
    try:
        apply(container("late", 22))

        def valid(name: str, generation: int) -> dict[str, Any] | None:
            status = cluster.get_json(namespace, "cd", name).get("status") or {}
            for cond in status.get("conditions") or []:
                if cond["type"] == "Valid" and cond.get("observedGeneration") == generation:
                    return cond  # type: ignore[no-any-return]
            return None

        for name in ("early", "late"):
            cond = wait_for(lambda n=name: valid(n, 1), timeout=20, what=f"{name} Valid")
            assert (cond["status"], cond["reason"], cond["message"]) == (
                "True",
                "Valid",
                "spec is valid",
            )
        apply(container("late", 22, priority=900))  # a spec change: generation 2
        wait_for(lambda: valid("late", 2), timeout=20, what="late Valid for generation 2")
        time.sleep(3)  # re-validation (resync 2 s) must not write again
    finally:
        op.stop()
    writes = [
        e
        for e in _audit(cluster, namespace)
        if e["objectRef"]["resource"] == "containerdispatches"
        and e["verb"] in ("patch", "update")
        and e.get("stage") == "ResponseComplete"
    ]
    assert sorted(e["objectRef"]["name"] for e in writes) == ["early", "late", "late"]
    assert all(e.get("userAgent", "").startswith("nodewarden/") for e in writes)
    assert all(e["objectRef"].get("subresource") == "status" for e in writes)
