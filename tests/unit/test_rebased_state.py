"""A stored power state written by a clock ahead of ours (another replica, before a
takeover) is moved onto ours when it is read back: evidence "observed at or after" a
time 90 s in our future would otherwise be refused for 90 s, a deadline stretched by 90 s
(in process; the controller's read-back runs on the in-memory API)."""

from __future__ import annotations

from datetime import timedelta

from test_per_object_catch import NS, T0, controller, settle, side_node

from memkube import MemoryKube
from nodewarden.api.kinds import WORKER_NODE
from nodewarden.policy.state import (
    AdmissionState,
    NodePowerState,
    PowerState,
    Transition,
    TransitionKind,
    rebased,
)

AHEAD = timedelta(seconds=90)


def verifying(at: timedelta) -> NodePowerState:
    """UNKNOWN, verifying since T0 + `at` (deadline 5 min later)."""
    start = T0 + at
    return NodePowerState(
        node="n1",
        state=PowerState.UNKNOWN,
        state_since=start,
        admission=AdmissionState.CLOSED,
        admission_since=start,
        transition=Transition(
            id="v1",
            kind=TransitionKind.VERIFY,
            started_at=start,
            deadline=start + timedelta(minutes=5),
            verify_since=start,
        ),
        seq=3,
    )


def test_a_state_from_a_clock_ahead_moves_back_by_its_lead() -> None:
    state, lead = rebased(verifying(AHEAD), T0)
    assert lead == AHEAD
    assert state == verifying(timedelta(0))


def test_a_state_from_our_own_past_is_kept() -> None:
    past = verifying(-timedelta(seconds=30))
    state, lead = rebased(past, T0)
    assert lead == timedelta(0) and state is past
    # a deadline ahead is what a deadline is: no lead by itself
    assert rebased(verifying(-timedelta(minutes=1)), T0)[1] == timedelta(0)


async def test_the_controller_reads_a_stored_state_back_on_its_own_clock() -> None:
    kube = MemoryKube()
    ctrl = controller(kube)
    node = side_node("n1")
    node["status"] = {
        "powerState": verifying(AHEAD).model_dump(mode="json", by_alias=True),
    }
    ctrl.observe_node(kube.put(WORKER_NODE, NS, node))
    t = ctrl.nodes["n1"].state.transition
    assert t is not None and t.verify_since == T0 and t.deadline == T0 + timedelta(minutes=5)
    await settle(ctrl)
