"""Bad input to the power path: a clear reason in status and an Event for each, and every
other node keeps being served.

- a PowerIntent for a WorkerNode that does not exist -> phase Failed naming the field;
- a WorkerNode whose BMC Secret is missing -> Valid=False naming the Secret, a Warning
  Event, no packet to its BMC;
- a BMC that answers HTML where Redfish JSON belongs -> PowerSource=False (BmcError) and
  a Warning Event; no power request, no decision to act on that evidence;
- meanwhile the healthy node is switched off as usual, and a PowerIntent created in the
  same breath as its WorkerNode is not failed (its node exists; the watch event of the
  node may simply arrive later).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from clusterkit import ClusterHandle, wait_for
from powerkit import PowerEnv, side_node_entry

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


@pytest.fixture
def env(cluster: ClusterHandle, namespace: str, tmp_path: Path) -> Iterator[PowerEnv]:
    env = PowerEnv.create(
        cluster,
        namespace,
        tmp_path,
        [
            side_node_entry("good"),
            side_node_entry("garbage", fakebmc={"garbage_reads": True}),
            side_node_entry("nosecret"),
        ],
    )
    try:
        yield env
    finally:
        env.close()


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c["type"] == kind), {})


def events_of(env: PowerEnv, name: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = env.cluster.get_json(env.namespace, "events")["items"]
    return [e for e in items if e["involvedObject"]["name"] == name]


def intent(name: str, node: str, action: str = "Shutdown") -> dict[str, Any]:
    return {
        "apiVersion": "nodewarden.io/v1alpha1",
        "kind": "PowerIntent",
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "action": action,
            "requestedBy": "alice@example.org",
            "reason": "maintenance window",
        },
    }


def test_bad_input_is_named_and_every_other_node_is_served(env: PowerEnv) -> None:
    # nosecret's BMC endpoint is its real (loopback) one: only the Secret is wrong
    spec = env.worker_node("nosecret")["spec"]
    spec["bmc"]["usernameSecretRef"] = {"name": "bmc-that-was-never-made", "key": "username"}
    spec["bmc"]["passwordSecretRef"] = {"name": "bmc-that-was-never-made", "key": "password"}
    env.apply({**env.worker_node("nosecret"), "spec": spec})
    env.start_operator()
    env.apply(intent("ghost-off", "ghost"))

    def failed() -> dict[str, Any] | None:
        st = env.cluster.get_json(env.namespace, "pi", "ghost-off").get("status") or {}
        return st if st.get("phase") == "Failed" else None

    ghost = wait_for(failed, timeout=60, interval=0.5, what="ghost-off Failed")
    assert "spec.nodeName" in ghost["message"] and "'ghost'" in ghost["message"]
    assert condition(ghost, "Valid")["reason"] == "NodeNotFound"

    def secret_named() -> dict[str, Any] | None:
        c = condition(env.status("nosecret"), "Valid")
        return c if c.get("status") == "False" else None

    valid = wait_for(secret_named, timeout=60, interval=0.5, what="nosecret Valid=False")
    assert "bmc-that-was-never-made" in valid["message"]
    wait_for(
        lambda: any(e["type"] == "Warning" for e in events_of(env, "nosecret")),
        timeout=30,
        what="a Warning Event on nosecret",
    )

    def bmc_error() -> dict[str, Any] | None:
        c = condition(env.status("garbage"), "PowerSource")
        return c if c.get("reason") == "BmcError" else None

    source = wait_for(bmc_error, timeout=60, interval=0.5, what="garbage PowerSource=BmcError")
    assert source["status"] == "False" and "JSON" in source["message"]
    wait_for(
        lambda: [e for e in events_of(env, "garbage") if e["reason"] == "PowerSourceError"],
        timeout=30,
        what="a PowerSourceError Event on garbage",
    )

    # the healthy node is served all along: switched off on observed Off
    env.wait_intent("good", "Succeeded", "Shutdown", timeout=90)
    env.wait_state("good", "Off", timeout=30)
    # a manual intent created together with its node is judged against the node
    late = env.worker_node("good")
    late["metadata"] = {"name": "late"}
    env.apply(late)
    env.apply(intent("late-drain", "late", action="Drain"))
    wait_for(
        lambda: (env.cluster.get_json(env.namespace, "pi", "late-drain").get("status") or {}).get(
            "conditions"
        ),
        timeout=30,
        what="late-drain validated",
    )
    late_status = env.cluster.get_json(env.namespace, "pi", "late-drain")["status"]
    assert condition(late_status, "Valid")["status"] == "True", late_status

    # nothing was asked of the nodes whose input is bad; nosecret's BMC was never contacted
    assert env.resets("garbage") == [] and env.resets("nosecret") == []
    assert env.side.admin.bmc_log("nosecret").get("requests", []) == []
    # the garbage page is never taken for a power state
    garbage = env.status("garbage")
    assert garbage["state"] == "Unknown" and "observedPower" not in garbage, garbage
