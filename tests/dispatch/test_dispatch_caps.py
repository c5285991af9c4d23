"""Hard caps against the real API server and the stub cloud (issue: hostile users).

A user who may write nodewarden objects declares 50 CloudVM WorkerNodes of the dearest
type with idleBehavior hold. The stub cloud's own count of instances is the truth:

1. the default policy allows 4: exactly 4 instances, the other 46 WorkerNodes carry
   Launched=False naming the policy's maxNodes;
2. the default policy is deleted: no create happens (before, the built-in unlimited
   defaults applied), and the condition says why -- the operator ceiling of 6 would
   have allowed two more;
3. the policy comes back allowing 100: creation resumes up to exactly the operator's
   ceiling (6), which no PowerPolicy can raise; the rest name limits.maxNodes.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from clusterkit import ClusterHandle, wait_for
from dispatchkit import FAST_POLICY, DispatchEnv

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

DECLARED = 50
CEILING = 6


@pytest.fixture
def env(cluster: ClusterHandle, namespace: str, tmp_path: Path) -> Iterator[DispatchEnv]:
    e = DispatchEnv.create(
        cluster,
        namespace,
        tmp_path,
        policy={"maxNodes": 4},
        dispatch={"limits": {"max_nodes": CEILING}},
    )
    yield e
    e.close()


def declared(i: int) -> dict[str, Any]:
    return {
        "apiVersion": "nodewarden.io/v1alpha1",
        "kind": "WorkerNode",
        "metadata": {"name": f"dear-{i:02d}"},
        "spec": {"nodeType": "CloudVM", "instanceType": "gpu", "idleBehavior": "hold"},
    }


def launched(nodes: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """WorkerNode -> its Launched condition (only the held ones have one, or had)."""
    out = {}
    for node in nodes:
        for cond in (node.get("status") or {}).get("conditions") or []:
            if cond["type"] == "Launched":
                out[node["metadata"]["name"]] = cond
    return out


def instances(env: DispatchEnv) -> int:
    """The stub cloud's own count of this dispatcher's instances."""
    return len(env.ours())


def held_with(env: DispatchEnv, text: str, count: int) -> dict[str, dict[str, Any]] | None:
    """The `count` held WorkerNodes, once each one's condition contains `text`."""
    nodes = env.nodes()
    conditions = launched(nodes)
    held = {n: c for n, c in conditions.items() if c["status"] == "False"}
    if len(held) == count and all(text in c["message"] for c in held.values()):
        return held
    seen = Counter((c["status"], c["reason"], c["message"][:50]) for c in conditions.values())
    labelled = {n["metadata"]["name"] for n in nodes if n["metadata"].get("labels")}
    neither = sorted({n["metadata"]["name"] for n in nodes} - set(conditions) - labelled)
    print(f"waiting for {count} held with {text!r}: {dict(seen)}; neither: {neither[:8]}")
    return None


def test_fifty_declared_vms_beyond_a_cap_get_exactly_that_many(env: DispatchEnv) -> None:
    env.start_operator()
    env.cluster.kubectl(
        "-n",
        env.namespace,
        "apply",
        "-f",
        "-",
        input=json.dumps(
            {"apiVersion": "v1", "kind": "List", "items": [declared(i) for i in range(DECLARED)]}
        ),
    )
    held = wait_for(
        lambda: held_with(env, "maxNodes (4)", DECLARED - 4),
        timeout=90,
        interval=1,
        what="46 declared nodes held by the policy's maxNodes",
    )
    assert instances(env) == 4
    reason = next(iter(held.values()))
    assert reason["reason"] == "CapReached"
    assert "PowerPolicy 'default' maxNodes (4)" in reason["message"]

    env.cluster.kubectl("-n", env.namespace, "delete", "powerpolicy", "default")
    held = wait_for(
        lambda: held_with(env, "the default PowerPolicy 'default' does not exist", DECLARED - 4),
        timeout=60,
        interval=1,
        what="creates stopped without the default policy",
    )
    assert instances(env) == 4  # fail closed: the ceiling (6) would have allowed two more
    assert {c["reason"] for c in held.values()} == {"CreatesStopped"}

    env.apply(
        {
            "apiVersion": "nodewarden.io/v1alpha1",
            "kind": "PowerPolicy",
            "metadata": {"name": "default"},
            "spec": {**FAST_POLICY, "maxNodes": 100},
        }
    )
    held = wait_for(
        lambda: held_with(env, "limits.maxNodes (6)", DECLARED - CEILING),
        timeout=90,
        interval=1,
        what="creation resumed up to the operator's ceiling",
    )
    assert instances(env) == CEILING
    assert "no PowerPolicy can" in next(iter(held.values()))["message"]
    released = [n for n, c in launched(env.nodes()).items() if c["status"] == "True"]
    assert len(released) == CEILING - 4  # the two that got their instance say so
