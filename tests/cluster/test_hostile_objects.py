"""No object stops the operator (issue: hostile users), through the real API server.

Two operator replicas serve a namespace holding the fuzz corpus (`e2e/crdfuzz`: 50 hostile
objects per kind drawn from the CRD schemas -- boundary lengths and values, maximum
durations, full maps, odd Unicode, and a share the API server refuses) and the issue's
two PowerPolicies whose durations overflow (`cooldown: 99999999999h`, `idleThreshold:
100000000h`), stored as the previous release's schema let them through (the test relaxes
the CRD while it creates them). Mixed in: valid objects that must keep being served.

- every object the API server accepted is judged (acknowledged with a condition or a
  phase), the valid ones are Valid and a valid container completes;
- kopf's handlers are forced to run again on every PowerPolicy and PowerIntent (their
  kopf state annotation removed: kopf takes each for new), then the leader is killed and
  the standby takes over (its start-up reads every policy and resumes every handler):
  neither process ever exits -- the standby's pid is the one it started with -- and a
  container created afterwards completes.

NODEWARDEN_FUZZ_CORPUS sets the objects per kind (50 here; `make fuzz` runs 400).
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from clusterkit import ClusterHandle, wait_for
from crdfuzz.corpus import ISSUE_POLICIES, KINDS, PREFIX, corpus
from dispatchkit import FAST_POLICY, DispatchEnv, container

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

PLURAL = {
    "PowerPolicy": "powerpolicies",
    "PowerIntent": "powerintents",
    "WorkerNode": "workernodes",
    "ContainerDispatch": "containerdispatches",
}
RELAXED = ("cooldown", "idleThreshold")
CORPUS = int(os.environ.get("NODEWARDEN_FUZZ_CORPUS", "50"))
SLOW = max(1.0, CORPUS / 50)
"""Waits grow with the corpus (the API server and the operator judge every object)."""
SPEC = "/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties"


@pytest.fixture
def env(cluster: ClusterHandle, namespace: str, tmp_path: Path) -> Iterator[DispatchEnv]:
    e = DispatchEnv.create(cluster, namespace, tmp_path, dispatch={"limits": {"max_nodes": 3}})
    yield e
    e.close()


def _apply_as_an_older_release(env: DispatchEnv, objects: list[dict[str, Any]]) -> None:
    """Create `objects` while the PowerPolicy CRD admits any text in RELAXED (as the
    schema did before durations were bounded), then restore the CRD."""
    crd = "powerpolicies.nodewarden.io"
    original = env.cluster.get_json("default", "crd", crd)["spec"]["versions"][0]
    props = original["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]

    def patch(ops: list[dict[str, Any]]) -> None:
        env.cluster.kubectl("patch", "crd", crd, "--type=json", "-p", json.dumps(ops))

    patch([{"op": "replace", "path": f"{SPEC}/{f}", "value": {"type": "string"}} for f in RELAXED])
    try:
        for obj in objects:
            wait_for(
                lambda obj=obj: (
                    env.cluster.kubectl(
                        "-n", env.namespace, "create", "-f", "-", input=json.dumps(obj), check=False
                    ).returncode
                    == 0
                ),
                timeout=20,
                what=f"{obj['metadata']['name']} stored under the relaxed schema",
            )
    finally:
        patch([{"op": "replace", "path": f"{SPEC}/{f}", "value": props[f]} for f in RELAXED])


def _create_all(env: DispatchEnv, objects: list[dict[str, Any]]) -> None:
    items = {"apiVersion": "v1", "kind": "List", "items": objects}
    env.cluster.kubectl(
        "-n",
        env.namespace,
        "create",
        "--validate=false",
        "-f",
        "-",
        input=json.dumps(items),
        check=False,
        timeout=120,
    )


def _tame(kind: str, index: int, obj: dict[str, Any]) -> dict[str, Any]:
    """Containers of the corpus run briefly and after the valid ones (the stub runner
    sleeps durationHintSeconds; a year-long one would only hold a node), each with a uuid
    of its own (two objects naming one uuid are the other hostile-users issue's case).
    Every other WorkerNode is made to keep the kind's cross-field rules (a SideNode has a
    capacity and no Cloud control, a CloudVM an instance type and Cloud control), the
    hostile values inside left as drawn: drawn at random, about four in five break one of
    those rules and are refused at admission, so the share that reached the operator moved
    with every field added to the schema (10 of 60, then 4 of 60 when `nodeClass` came)."""
    spec = obj.get("spec")
    if kind == "WorkerNode" and isinstance(spec, dict) and index % 2 == 1:
        if spec.get("nodeType") == "SideNode":
            if not isinstance(spec.get("capacity"), dict):
                spec["capacity"] = {"vcpus": 1, "ram": "1Gi"}
            if spec.get("controlMethod") in (None, "Cloud"):  # unset means Cloud
                spec["controlMethod"] = "None"
        elif spec.get("nodeType") == "CloudVM":
            if not isinstance(spec.get("instanceType"), str) or not spec["instanceType"]:
                spec["instanceType"] = "fuzz-type"  # no such type: the operator marks it
            if "controlMethod" in spec:
                spec["controlMethod"] = "Cloud"
    if kind == "ContainerDispatch" and isinstance(spec, dict):
        if isinstance(spec.get("uuid"), str):
            spec["uuid"] = f"fzfzz-dz642-{index:015d}"
        runtime = spec.setdefault("runtime", {})
        if isinstance(runtime, dict):  # without a hint the stub runner runs until killed
            hint = runtime.get("durationHintSeconds")
            runtime["durationHintSeconds"] = min(2, hint) if isinstance(hint, int | float) else 1
        if isinstance(spec.get("priority"), int):
            spec["priority"] = min(999, spec["priority"])
    return obj


def _judged(kind: str, obj: dict[str, Any]) -> bool:
    status = obj.get("status") or {}
    if kind == "ContainerDispatch" and status.get("phase"):
        return True
    return any(c.get("type") == "Valid" for c in status.get("conditions") or [])


def _unjudged(env: DispatchEnv) -> dict[str, list[str]]:
    out = {}
    for kind in KINDS:
        items = env.cluster.get_json(env.namespace, PLURAL[kind])["items"]
        left = [
            o["metadata"]["name"]
            for o in items
            if o["metadata"]["name"].startswith(PREFIX[kind]) and not _judged(kind, o)
        ]
        if left:
            out[kind] = left
    return out


def _all_judged(env: DispatchEnv) -> bool:
    left = _unjudged(env)
    if left:
        print("not judged yet:", {kind: names[:5] for kind, names in left.items()})
    return not left


def _condition(env: DispatchEnv, plural: str, name: str) -> dict[str, Any]:
    obj = env.cluster.get_json(env.namespace, plural, name)
    conditions = (obj.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "Valid"), {})


def _valid(env: DispatchEnv, plural: str, name: str) -> bool:
    return _condition(env, plural, name).get("status") == "True"


def test_hostile_objects_never_stop_the_operator(env: DispatchEnv) -> None:
    issue = [
        {
            "apiVersion": "nodewarden.io/v1alpha1",
            "kind": "PowerPolicy",
            "metadata": {"name": name},
            "spec": {**FAST_POLICY, **spec},
        }
        for name, spec in ISSUE_POLICIES.items()
    ]
    _apply_as_an_older_release(env, issue)
    leader = env.start_operator()
    wait_for(lambda: leader.get("/readyz")[0] == 200, timeout=30, what="leader")
    standby = env.start_operator()
    wait_for(lambda: '"standby"' in standby.get("/readyz")[1], timeout=30, what="standby")
    pid = standby.proc.pid

    good = [
        {
            "apiVersion": "nodewarden.io/v1alpha1",
            "kind": "PowerPolicy",
            "metadata": {"name": "good-policy"},
            "spec": FAST_POLICY,
        },
        {
            "apiVersion": "nodewarden.io/v1alpha1",
            "kind": "WorkerNode",
            "metadata": {"name": "under-issue-idle"},
            "spec": {
                "nodeType": "CloudVM",
                "instanceType": "small",
                "policyRef": {"name": "issue-idle"},
            },
        },
        container("good-1", 1, priority=1000, duration=1),
    ]
    objects = [
        _tame(kind, i, o)
        for kind in KINDS
        for i, o in enumerate(corpus(kind, env.namespace, CORPUS))
    ]
    _create_all(env, good + objects)
    stored = {kind: 0 for kind in KINDS}
    for kind in KINDS:
        items = env.cluster.get_json(env.namespace, PLURAL[kind])["items"]
        stored[kind] = sum(o["metadata"]["name"].startswith(PREFIX[kind]) for o in items)
    print(f"corpus stored (of {CORPUS} per kind; the rest refused at admission): {stored}")
    assert all(count >= CORPUS // 5 for count in stored.values()), stored

    wait_for(lambda: _all_judged(env), timeout=60 * SLOW, interval=1, what="every object judged")
    env.wait_phases({"good-1": "Complete"}, timeout=60 * SLOW)
    assert _valid(env, "pp", "good-policy")
    for name, spec in ISSUE_POLICIES.items():  # marked invalid, naming the field; never fatal
        (field,) = spec
        cond = _condition(env, "pp", name)
        assert cond.get("status") == "False" and f"spec.{field}" in cond["message"], cond
    assert leader.proc.poll() is None and standby.proc.poll() is None

    # kopf's handlers run again on every object: without their state, each is new to kopf
    # (the issue's policies can still be updated: their stored durations fail only the
    # pattern, which the API server ratchets for an unchanged field)
    for plural in ("powerpolicies", "powerintents"):
        env.cluster.kubectl(
            "-n", env.namespace, "annotate", plural, "--all",
            "nodewarden.io/last-handled-configuration-",
        )  # fmt: skip

    def handled_again() -> bool:
        pp = env.cluster.get_json(env.namespace, "pp", "issue-cooldown")
        return "nodewarden.io/last-handled-configuration" in pp["metadata"].get("annotations", {})

    wait_for(handled_again, timeout=30 * SLOW, interval=1, what="kopf handled the policies again")
    assert leader.proc.poll() is None and standby.proc.poll() is None

    # failover: the standby starts acting on all of it (policy book, resume handlers)
    leader.stop(signal.SIGKILL)
    wait_for(
        lambda: '"leader"' in standby.get("/readyz")[1], timeout=40, interval=0.5, what="failover"
    )
    env.apply(container("good-2", 2, priority=1000, duration=1))
    env.wait_phases({"good-2": "Complete"}, timeout=60 * SLOW)
    assert standby.proc.poll() is None and standby.proc.pid == pid
    assert "unexpected error" not in standby.logs().lower()
    wait_for(
        lambda: _all_judged(env), timeout=30 * SLOW, interval=1, what="still every object judged"
    )
