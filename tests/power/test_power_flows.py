"""The SPEC's side-node flows under faults, end to end, each asserting the Safety Record.

One operator and one side-node process serve several nodes at once, each node its own
flow (they share nothing but the operator, so they run side by side):

- stale   -- SSH probes fail after the node was seen: telemetry goes stale -> DEFER;
- inhib   -- a block-mode shutdown inhibitor is held -> BLOCK (INHIBITOR_ACTIVE);
- noact   -- the policy does not allow GracefulShutdown -> BLOCK (ACTION_NOT_ALLOWED);
- stuck   -- the BMC accepts every reset and never applies it -> bounded re-sends,
             counted at the BMC, then BLOCK, never OFF;
- notready -- woken, power On, the ready probe never passes -> no container bound,
             deadline -> BLOCK;
- wolnode -- Wake-on-LAN packets sent, the host never comes up -> no binding, BLOCK
             (its BMC is only the trusted source that shows it Off);
- wolon   -- a Wake-on-LAN node On at start is switched off over SSH (SshPoweroff is
             learned once SSH logs in, not only at the next capability rediscovery).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from clusterkit import ClusterHandle, wait_for
from dispatchkit import apply_many
from powerkit import PowerEnv, side_node_entry

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

QUICK = {
    "idleThreshold": "2s",
    "deadlines": {"shutdown": "4s", "wake": "4s", "ready": "4s", "drain": "30s"},
    "retry": {"budget": 2, "initialBackoff": "1s", "maxBackoff": "1s", "jitter": 0.0},
}


def policy(name: str, **spec: Any) -> dict[str, Any]:
    from powerkit import FAST_POWER_POLICY

    return {
        "apiVersion": "nodewarden.io/v1alpha1",
        "kind": "PowerPolicy",
        "metadata": {"name": name},
        "spec": {**FAST_POWER_POLICY, **spec},
    }


def gpu_model(name: str) -> dict[str, Any]:
    return {"capacity": {"vcpus": 8, "ram": "32Gi", "gpus": 1, "gpuModel": f"model-{name}"}}


def model_container(name: str, index: int, model: str) -> dict[str, Any]:
    return {
        "apiVersion": "nodewarden.io/v1alpha1",
        "kind": "ContainerDispatch",
        "metadata": {"name": name},
        "spec": {
            "uuid": f"zzzzz-dz642-{index:015d}",
            "priority": 500,
            "resources": {"vcpus": 1, "ram": "1Gi", "gpus": 1, "gpuModel": f"model-{model}"},
            "command": ["sleep", "1"],
            "runtime": {"durationHintSeconds": 1},
        },
    }


@pytest.fixture
def env(cluster: ClusterHandle, namespace: str, tmp_path: Path) -> Iterator[PowerEnv]:
    nodes = [
        side_node_entry("stale"),
        side_node_entry("inhib", faults={"shutdown_inhibitor": True}),
        side_node_entry("noact"),
        side_node_entry("stuck", fakebmc={"never_apply": True}),
        side_node_entry("notready", initial_power="Off", faults={"ready_fails_after_wake": True}),
        side_node_entry(
            "wolnode", power="wol+bmc", initial_power="Off", faults={"ignore_wake": True}
        ),
        side_node_entry("wolon", power="wol+bmc"),
    ]
    specs = {
        "stale": {"policyRef": {"name": "slow-idle"}},
        "noact": {"policyRef": {"name": "no-graceful"}},
        "stuck": {"policyRef": {"name": "quick"}},
        "notready": {"policyRef": {"name": "quick"}, **gpu_model("notready")},
        "wolnode": {
            "policyRef": {"name": "quick"},
            "wakeOnLanWithBmc": True,
            **gpu_model("wolnode"),
        },
        "wolon": {"wakeOnLanWithBmc": True, **gpu_model("wolon")},
    }
    env = PowerEnv.create(cluster, namespace, tmp_path, nodes, node_specs=specs)
    env.apply(policy("slow-idle", idleThreshold="25s", telemetryMaxAge="6s"))
    env.apply(policy("no-graceful", allowedActions=["On", "WakeOnLan"]))
    env.apply(policy("quick", **QUICK))
    try:
        yield env
    finally:
        env.close()


def record_of(intent: dict[str, Any]) -> dict[str, Any]:
    return intent["status"]["safetyRecord"]  # type: ignore[no-any-return]


def test_side_node_fault_flows(env: PowerEnv) -> None:
    env.start_operator()
    # stale: seen Ready, then SSH stops answering; its idle threshold (25 s) comes after
    # the telemetry max age (6 s): the shutdown waits for fresh evidence instead.
    env.wait_state("stale", "Idle", timeout=60)
    env.side.admin.set_faults("stale", ssh_unreachable="refused")
    # the GPU containers the woken-but-broken nodes would take
    apply_many(
        env,  # type: ignore[arg-type]
        [model_container("for-notready", 1, "notready"), model_container("for-wol", 2, "wolnode")],
    )

    # inhib: BLOCK with the inhibitor named, in a policy-made PowerIntent
    blocked = env.wait_intent("inhib", "Blocked", "Shutdown", timeout=60)
    assert "INHIBITOR_ACTIVE" in blocked["status"]["reasons"]
    gate = next(g for g in record_of(blocked)["gates"] if g["gate"] == "inhibitors")
    assert gate["verdict"] == "FAIL"
    assert any("shutdown" in str(e["value"]) for e in gate["evidence"])

    # noact: the capability gate names the policy's allowed actions
    blocked = env.wait_intent("noact", "Blocked", "Shutdown", timeout=60)
    assert "ACTION_NOT_ALLOWED" in blocked["status"]["reasons"]

    # stuck: the BMC took every reset and changed nothing -> re-sends bounded by the
    # retry budget (2), counted at the BMC, then BLOCK; OFF never recorded
    blocked = env.wait_intent("stuck", "Blocked", "Shutdown", timeout=90)
    assert {"RETRY_BUDGET_EXHAUSTED"} <= set(blocked["status"]["reasons"])
    resets = [r["reset_type"] for r in env.resets("stuck")]
    assert resets == ["GracefulShutdown"] * 3, resets
    assert env.status("stuck")["state"] == "Blocked"
    assert not [
        i for i in env.intents("stuck") if (i.get("status") or {}).get("phase") == "Succeeded"
    ]
    assert record_of(blocked)["confirmation"]["confirmed"] is False

    # notready: woken for its container; power On seen, the ready probe never passes
    blocked = env.wait_intent("notready", "Blocked", "Wake", timeout=120)
    reasons = set(blocked["status"]["reasons"])
    assert {"DEADLINE_EXCEEDED", "READY_PROBE_FAILED"} <= reasons, reasons
    assert env.status("notready")["admission"] == "Closed"
    c = env.cluster.get_json(env.namespace, "cd", "for-notready")
    assert (c.get("status") or {}).get("phase") in (None, "Queued")
    assert not env.side.admin.runs("notready")

    # wolnode: packets sent (one per attempt, the request proves only that), no host
    blocked = env.wait_intent("wolnode", "Blocked", "Wake", timeout=120)
    assert "DEADLINE_EXCEEDED" in blocked["status"]["reasons"]
    packets = [p for p in env.side.admin.wol_packets() if p.get("node") == "wolnode"]
    assert len(packets) == 3, packets  # first request + 2 re-sends (retry budget)
    assert all(p["outcome"] == "ignored_fault" for p in packets)
    request = record_of(blocked)["request"]
    assert request["action"] == "WakeOnLan" and request["result"] == "Accepted"
    c = env.cluster.get_json(env.namespace, "cd", "for-wol")
    assert (c.get("status") or {}).get("phase") in (None, "Queued")

    # wolon: a Wake-on-LAN node that is On at start is switched off over SSH (its
    # capability is rediscovered once SSH logs in; the BMC only observes)
    done = env.wait_intent("wolon", "Succeeded", "Shutdown", timeout=60)
    assert record_of(done)["request"]["action"] == "SshPoweroff"
    assert env.resets("wolon") == []

    # stale: never switched off on stale evidence
    def stale_deferred() -> dict[str, Any] | None:
        last = env.status("stale").get("lastSafetyRecord") or {}
        return last if "TELEMETRY_STALE" in last.get("reasons", []) else None

    last = wait_for(stale_deferred, timeout=60, interval=1, what="stale: DEFER TELEMETRY_STALE")
    assert last["decision"] == "DEFER"
    assert env.resets("stale") == []
