"""Manual PowerIntents, GitOps policy edits and Shadow mode, end to end.

- Without the chart's requester admission policy an override is never honoured: the
  requester is a string anyone writes (REQUESTER_UNVERIFIED, nothing sent to the BMC).
- With it (installed from the chart onto the real API server), intents are created by an
  impersonated on-call user whose group is bound to `powerintents/override`.
- A manual Shutdown passes the same gates as the policy's: an inhibitor BLOCKs it;
  an override is refused (OVERRIDE_NOT_PERMITTED) where the PowerPolicy forbids it, and
  applied and audited (the authenticated requester, justification in the record) where
  it permits it.
- A PowerPolicy edited while a transition runs: the records after the edit carry the
  new version (name@generation/hash).
- Shadow mode: decisions recorded (PowerIntent phase Shadow, Events), zero resets at
  the BMC.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from admissionkit import requester_policy
from clusterkit import ClusterHandle, wait_for
from localcluster import OPERATOR_USER
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
ONCALL = "oncall@example.org"
ONCALL_GROUP = {"kind": "Group", "name": "oncall", "apiGroup": "rbac.authorization.k8s.io"}


def intent_in_phase(
    env: PowerEnv, name: str, phase: str, timeout: float, what: str
) -> dict[str, Any]:
    def reached() -> dict[str, Any] | None:
        body: dict[str, Any] = env.cluster.get_json(env.namespace, "pi", name)
        return body if (body.get("status") or {}).get("phase") == phase else None

    return wait_for(reached, timeout=timeout, what=what)  # type: ignore[no-any-return]


def create_as_oncall(env: PowerEnv, obj: dict[str, Any]) -> None:
    """Create `obj` as the on-call user (impersonated; member of the group `oncall`)."""
    env.cluster.kubectl(
        "-n", env.namespace, f"--as={ONCALL}", "--as-group=oncall", "create", "-f", "-",
        input=json.dumps(obj),
    )  # fmt: skip


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
    env = PowerEnv.create(
        cluster, namespace, tmp_path, nodes, node_specs=specs,
        config={"requesters": {"check_interval": 1}},
    )  # fmt: skip
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

    # -- no requester admission policy: a requester is a string, no override is honoured
    env.apply(intent("lenient-unverified", "lenient", "Shutdown", OVERRIDE))
    unverified = intent_in_phase(
        env, "lenient-unverified", "Blocked", 60, "override of an unverified requester refused"
    )
    assert "REQUESTER_UNVERIFIED" in unverified["status"]["reasons"]
    assert unverified["status"]["safetyRecord"]["manualOverride"]["requesterVerified"] is False
    assert env.resets("lenient") == []

    # -- the chart's policy: requestedBy is the authenticated user, overrides need RBAC
    admission = requester_policy(
        env.cluster, env.namespace, OPERATOR_USER, override_subjects=[ONCALL_GROUP]
    )
    try:
        env.cluster.kubectl(
            "-n", env.namespace, "create", "role", "intents",
            "--verb=create,get", "--resource=powerintents.nodewarden.io",
        )  # fmt: skip
        env.cluster.kubectl(
            "-n", env.namespace, "create", "rolebinding", "oncall-intents", "--role=intents",
            "--group=oncall",
        )  # fmt: skip
        wait_for(
            lambda: "PowerIntent requesters are verified at admission" in env.operators[0].logs(),
            timeout=30,
            what="the operator sees the requester admission policy in force",
        )
        manual_gates(env)
    finally:
        admission.close()


def manual_gates(env: PowerEnv) -> None:
    # -- the same gates: an inhibitor blocks a manual shutdown without an override
    create_as_oncall(env, intent("strict-off", "strict", "Shutdown"))
    blocked = env.wait_intent("strict", "Blocked", "Shutdown", timeout=60)
    assert blocked["metadata"]["name"] == "strict-off"
    assert "INHIBITOR_ACTIVE" in blocked["status"]["reasons"]
    # -- an override the policy does not permit is refused
    create_as_oncall(env, intent("strict-force", "strict", "Shutdown", OVERRIDE))
    refused = intent_in_phase(env, "strict-force", "Blocked", 60, "override refused")
    assert "OVERRIDE_NOT_PERMITTED" in refused["status"]["reasons"]
    assert refused["status"]["safetyRecord"]["manualOverride"]["permittedByPolicy"] is False
    assert env.resets("strict") == []
    # -- where the policy permits it: applied, audited, the node goes off
    create_as_oncall(env, intent("lenient-force", "lenient", "Shutdown", OVERRIDE))
    done = intent_in_phase(env, "lenient-force", "Succeeded", 90, "override applied")
    events = [
        e for e in env.cluster.get_json(env.namespace, "events")["items"]
        if e["involvedObject"]["name"] == "lenient" and e["reason"] == "PowerShutdown"
    ]  # fmt: skip
    assert events and "OVERRIDE_APPLIED" in events[0]["message"]
    record = done["status"]["safetyRecord"]
    assert record["manualOverride"]["requestedBy"] == ONCALL  # the authenticated name
    assert record["manualOverride"]["requesterVerified"] is True
    assert record["manualOverride"]["justification"] == OVERRIDE["justification"]
    assert [r["reset_type"] for r in env.resets("lenient")] == ["GracefulShutdown"]

    # -- GitOps edit while a transition runs: later records carry the new version
    create_as_oncall(env, intent("plain-off", "plain", "Shutdown"))
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
