"""Manual PowerIntents, GitOps policy edits and Shadow mode, end to end.

- A manual Shutdown passes the same gates as the policy's: an inhibitor BLOCKs it;
  an override is refused (OVERRIDE_NOT_PERMITTED) where the PowerPolicy forbids it, and
  applied and audited (requester, justification in the record) where it permits it.
- A PowerPolicy edited while a transition runs: the records after the edit carry the
  new version (name@generation/hash).
- Shadow mode: decisions recorded (PowerIntent phase Shadow, Events), zero resets at
  the BMC.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from clusterkit import ClusterHandle, wait_for
from powerkit import FAST_POWER_POLICY, PowerEnv, side_node_entry

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

HOLD = {"idleThreshold": "1h"}  # the policy itself never wants these nodes off


def policy(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "nodewarden.io/v1alpha1",
        "kind": "PowerPolicy",
        "metadata": {"name": name},
        "spec": {**FAST_POWER_POLICY, **HOLD, **spec},
    }


def intent(
    name: str, node: str, action: str, override: dict[str, Any] | None = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "nodeName": node,
        "action": action,
        "source": "Manual",
        "requestedBy": "oncall@example.org",
        "reason": "maintenance window OPS-1",
    }
    if override is not None:
        spec["override"] = override
    return {
        "apiVersion": "nodewarden.io/v1alpha1",
        "kind": "PowerIntent",
        "metadata": {"name": name},
        "spec": spec,
    }


OVERRIDE = {"inhibitors": True, "justification": "the lock holder confirmed on the phone"}


@pytest.fixture
def env(cluster: ClusterHandle, namespace: str, tmp_path: Path) -> Iterator[PowerEnv]:
    nodes = [
        side_node_entry("strict", faults={"shutdown_inhibitor": True}),
        side_node_entry("lenient", faults={"shutdown_inhibitor": True}),
        side_node_entry("plain"),
        side_node_entry("shadowed"),
    ]
    specs = {
        "strict": {"policyRef": {"name": "strict"}},
        "lenient": {"policyRef": {"name": "lenient"}},
        "plain": {"policyRef": {"name": "edited"}},
        "shadowed": {"policyRef": {"name": "shadow"}},
    }
    env = PowerEnv.create(cluster, namespace, tmp_path, nodes, node_specs=specs)
    env.apply(policy("strict"))
    env.apply(
        policy(
            "lenient",
            inhibitorOverride={"permitted": True, "allowedRequesters": ["oncall@example.org"]},
        )
    )
    env.apply(
        policy(
            "edited", deadlines={"drain": "60s", "shutdown": "30s", "wake": "15s", "ready": "15s"}
        )
    )
    env.apply(policy("shadow", mode="Shadow", idleThreshold="2s"))
    try:
        yield env
    finally:
        env.close()


def test_manual_intents_overrides_policy_edits_and_shadow_mode(env: PowerEnv) -> None:
    # slow the "plain" node's BMC so its shutdown is still running when the policy changes
    env.side.admin.set_bmc("plain", transition_seconds=6)
    env.start_operator()
    for node in ("strict", "lenient", "plain"):
        env.wait_state(node, "Idle", timeout=60)

    # -- the same gates: an inhibitor blocks a manual shutdown without an override
    env.apply(intent("strict-off", "strict", "Shutdown"))
    blocked = env.wait_intent("strict", "Blocked", "Shutdown", timeout=60)
    assert blocked["metadata"]["name"] == "strict-off"
    assert "INHIBITOR_ACTIVE" in blocked["status"]["reasons"]
    # -- an override the policy does not permit is refused
    env.apply(intent("strict-force", "strict", "Shutdown", OVERRIDE))
    refused = wait_for(
        lambda: (
            (i := env.cluster.get_json(env.namespace, "pi", "strict-force"))
            and (i.get("status") or {}).get("phase") == "Blocked"
            and i
        ),
        timeout=60,
        what="override refused",
    )
    assert "OVERRIDE_NOT_PERMITTED" in refused["status"]["reasons"]
    assert refused["status"]["safetyRecord"]["manualOverride"]["permittedByPolicy"] is False
    assert env.resets("strict") == []
    # -- where the policy permits it: applied, audited, the node goes off
    env.apply(intent("lenient-force", "lenient", "Shutdown", OVERRIDE))
    done = wait_for(
        lambda: (
            (i := env.cluster.get_json(env.namespace, "pi", "lenient-force"))
            and (i.get("status") or {}).get("phase") == "Succeeded"
            and i
        ),
        timeout=90,
        what="override applied",
    )
    events = [
        e for e in env.cluster.get_json(env.namespace, "events")["items"]
        if e["involvedObject"]["name"] == "lenient" and e["reason"] == "PowerShutdown"
    ]  # fmt: skip
    assert events and "OVERRIDE_APPLIED" in events[0]["message"]
    record = done["status"]["safetyRecord"]
    assert record["manualOverride"]["requestedBy"] == "oncall@example.org"
    assert record["manualOverride"]["justification"] == OVERRIDE["justification"]
    assert [r["reset_type"] for r in env.resets("lenient")] == ["GracefulShutdown"]

    # -- GitOps edit while a transition runs: later records carry the new version
    env.apply(intent("plain-off", "plain", "Shutdown"))
    wait_for(
        lambda: env.status("plain").get("state") == "ShuttingDown",
        timeout=60,
        what="plain shutting down",
    )
    before = env.cluster.get_json(env.namespace, "pi", "plain-off")["status"]["safetyRecord"]
    env.apply(policy("edited", cooldown="1s"))
    generation = env.cluster.get_json(env.namespace, "pp", "edited")["metadata"]["generation"]
    after = wait_for(
        lambda: (
            (i := env.cluster.get_json(env.namespace, "pi", "plain-off"))
            and (i.get("status") or {}).get("phase") == "Succeeded"
            and i["status"]["safetyRecord"]
        ),
        timeout=60,
        what="plain off",
    )
    assert before["policy"]["generation"] == generation - 1
    assert after["policy"]["generation"] == generation
    assert after["policy"]["contentHash"] != before["policy"]["contentHash"]

    # -- Shadow mode: decided and recorded, never acted on
    shadow = env.wait_intent("shadowed", "Shadow", "Shutdown", timeout=60)
    assert "SHADOW_MODE" in shadow["status"]["reasons"]
    assert shadow["status"]["safetyRecord"]["decision"] in ("DRAIN", "SHUTDOWN")
    assert env.status("shadowed")["state"] == "Idle"
    assert env.status("shadowed")["admission"] == "Open"
    assert env.resets("shadowed") == []
