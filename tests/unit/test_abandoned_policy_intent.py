"""A policy-made PowerIntent whose transition was never recorded (in process, an in-memory
API): a leader SIGKILLed between creating the intent and writing the transition onto the
WorkerNode left it open with no status, and the replica that took over neither resumed it
nor closed it -- it stayed open forever, or was failed by validation without a reason
code once its node was deleted (found by the chaos CI variant, seed 101). The next leader
closes it Aborted with TRANSITION_ABORTED; the intent of the node's stored transition,
the intents it creates itself, manual intents and another install's intents stay as they
are."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from test_per_object_catch import NS, T0, controller, settle, side_node

from memkube import MemoryKube
from nodewarden.api.kinds import POWER_INTENT, WORKER_NODE
from nodewarden.policy.state import NodePowerState, PowerState, Transition, TransitionKind
from nodewarden.power.intents import policy_intent_name


def intent(name: str, node: str, source: str = "Policy") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "nodeName": node,
            "action": "Shutdown",
            "source": source,
            "requestedBy": "nodewarden/d" if source == "Policy" else "alice",
            "reason": "test",
        },
    }


def shutting_down(name: str, transition_id: str) -> dict[str, Any]:
    state = NodePowerState(
        node=name,
        state=PowerState.SHUTTING_DOWN,
        transition=Transition(
            id=transition_id,
            kind=TransitionKind.SHUTDOWN,
            started_at=T0,
            deadline=T0 + timedelta(hours=1),
        ),
        seq=3,
    )
    return {"powerState": state.model_dump(mode="json", by_alias=True)}


async def test_an_intent_of_a_transition_never_recorded_is_aborted_by_the_next_leader() -> None:
    kube = MemoryKube()
    ctrl = controller(kube)
    orphan = policy_intent_name("idle", "shutdown-20260101-000000-dead")
    resumed = policy_intent_name("busy", "shutdown-20260101-000000-live")
    bodies = [
        intent(orphan, "idle"),
        intent(resumed, "busy"),
        intent("alice-off", "idle", source="Manual"),
        intent(policy_intent_name("theirs", "shutdown-x"), "theirs"),  # not our node
    ]
    for body in bodies:
        ctrl.observe_intent(kube.put(POWER_INTENT, NS, body))
    busy = side_node("busy")
    busy["status"] = shutting_down("busy", "shutdown-20260101-000000-live")
    ctrl.observe_node(kube.put(WORKER_NODE, NS, side_node("idle")))
    ctrl.observe_node(kube.put(WORKER_NODE, NS, busy))
    await ctrl.start()
    mine = await ctrl.intents.create_policy_intent("busy", "wake-1", "Wake", "policy", T0)
    await ctrl.round()
    await settle(ctrl)
    aborted = kube.status(POWER_INTENT, NS, orphan)
    assert aborted["phase"] == "Aborted"
    assert aborted["reasons"] == ["TRANSITION_ABORTED"]
    assert "no power request of it was sent" in aborted["message"]
    assert aborted["finishedAt"]
    assert kube.status(POWER_INTENT, NS, resumed).get("phase") != "Aborted"
    assert kube.status(POWER_INTENT, NS, mine.name).get("phase") != "Aborted"
    assert kube.status(POWER_INTENT, NS, "alice-off").get("phase") != "Aborted"
    assert not kube.status(POWER_INTENT, NS, policy_intent_name("theirs", "shutdown-x"))
    # once closed, it is never taken up again
    assert ctrl.intents.abandoned(ctrl._round._transition_intent) == []
