"""The simulator's nodes look to the scheduler as the operator's nodes look to it.

`MachineNode.node_view` and the dispatcher's `NodeViews` (fed by the power board's
`board_view`) both call `rules.nodeview`, from different facts: the dispatcher from live
objects (workers, the board), the simulator from its machine nodes. This test builds
those live objects for every power state, admission and readiness of a side node (with
and without a wake action) and of a cloud VM (pending, booting, destroy requested) and
compares; and pins the board's view (`board_view`) to the rule's parts of it.
"""

from __future__ import annotations

import itertools
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from nodewarden.api.powerpolicy import PowerPolicySpec
from nodewarden.api.workernode import WorkerNodeSpec
from nodewarden.cloud.model import CloudInstance, InstanceState
from nodewarden.dispatch.views import NodeViews
from nodewarden.fleet.board import PowerBoard
from nodewarden.policy.facts import CapabilityReading, NodeFacts, ReadyReading
from nodewarden.policy.state import (
    AdmissionState,
    NodePowerState,
    PowerRequest,
    PowerState,
    Transition,
    TransitionKind,
)
from nodewarden.policy.view import PolicyView
from nodewarden.pool.worker import Worker
from nodewarden.power.nodestatus import board_view
from nodewarden.power.runtime import NodeRuntime
from nodewarden.rules.nodeview import admits, can_wake, is_ready
from nodewarden.scheduling.instancetypes import InstanceType
from nodewarden.scheduling.views import Capacity
from nodewarden.simulate.distributions import Delay
from nodewarden.simulate.nodes import MachineNode, PowerModel

T0 = datetime(2026, 11, 30, tzinfo=UTC)
NOW = 10_000_000
ITYPE = InstanceType(name="m5.large", provider_type="m5.large", vcpus=2, ram=8 << 30, price=0.096)
SIDE_SPEC = {
    "nodeType": "SideNode",
    "controlMethod": "Redfish",
    "capacity": {"vcpus": 16, "ram": "64Gi", "gpus": 2},
    "costPerHour": 1.0,
}
MODEL = PowerModel(
    control_method="Redfish",
    allowable=("On", "GracefulShutdown"),
    source="redfish",
    latency=Delay(fixed="1s"),
    drop_rate=0.0,
    error_rate=0.0,
    poll_interval=10_000_000,
    boot=Delay(fixed="1m"),
    shutdown=Delay(fixed="1m"),
)
READINESS = (None, True, False)


def _facts(name: str, node_type: str, ready: bool | None, control: str) -> NodeFacts:
    facts = NodeFacts(
        node=name,
        node_type=node_type,  # type: ignore[arg-type]
        capability=CapabilityReading(
            source="t",
            observed_at=T0,
            control_method=control,  # type: ignore[arg-type]
            allowable=("On", "GracefulShutdown") if control == "Redfish" else ("GracefulShutdown",),
        ),
    )
    if ready is not None:
        facts = facts.model_copy(
            update={"ready": ReadyReading(source="t", observed_at=T0, passed=ready)}
        )
    return facts


def _state(name: str, power: PowerState, admission: AdmissionState) -> NodePowerState:
    return NodePowerState.initial(name).model_copy(update={"state": power, "admission": admission})


def _node(name: str, state: NodePowerState, facts: NodeFacts, **kind: Any) -> MachineNode:
    return MachineNode(
        name=name,
        model=MODEL,
        rng=random.Random(1),
        state=state,
        facts=facts,
        powered=True,
        power_since=0,
        ready_at=0,
        **kind,
    )


def _operator_view(worker: Worker, rt: NodeRuntime) -> object:
    board = PowerBoard()
    board.set(worker.name, board_view(rt, policy_valid=True))
    return NodeViews(board).node_view(worker)


def _side_node(
    name: str, state: NodePowerState, ready: bool | None, control: str
) -> tuple[MachineNode, Worker, NodeRuntime]:
    """A simulated side node and the live objects (worker, runtime) of the same node."""
    facts = _facts(name, "SideNode", ready, control)
    spec = WorkerNodeSpec.model_validate(SIDE_SPEC)
    worker = Worker(
        name=name, instance_type=None, created_at=T0, body={"spec": SIDE_SPEC}, side=True
    )
    rt = NodeRuntime(name, spec, {}, state, facts, spec_seen_at=T0)
    node = _node(
        name,
        state,
        facts,
        node_type="SideNode",
        capacity=Capacity(16, 64 << 30, 0, 2),
        price=1.0,
        instance_type=None,
    )
    return node, worker, rt


CASES = list(itertools.product(PowerState, AdmissionState, READINESS))


@pytest.mark.parametrize(("power", "admission", "ready"), CASES)
def test_side_node_view_is_the_dispatchers(
    power: PowerState, admission: AdmissionState, ready: bool | None
) -> None:
    node, worker, rt = _side_node("gpu", _state("gpu", power, admission), ready, "Redfish")
    assert node.node_view(NOW) == _operator_view(worker, rt)


@pytest.mark.parametrize(("power", "admission", "ready"), CASES)
@pytest.mark.parametrize("phase", ["pending", "listed", "destroying"])
def test_vm_view_is_the_dispatchers(
    power: PowerState, admission: AdmissionState, ready: bool | None, phase: str
) -> None:
    name = "vm-m5.large-0"
    state = _state(name, power, admission)
    facts = _facts(name, "CloudVM", ready, "Cloud")
    instance = CloudInstance(
        id="i-1",
        name=name,
        instance_type="m5.large",
        provider_type="m5.large",
        state=InstanceState.RUNNING,
        price=0.096,
        created_at=T0,
        observed_at=T0,
        source="cloud:stub",
    )
    worker = Worker(
        name=name,
        instance_type=ITYPE,
        created_at=T0,
        instance=None if phase == "pending" else instance,
        destroy_requested_at=T0 if phase == "destroying" else None,
    )
    spec = WorkerNodeSpec.model_validate(
        {"nodeType": "CloudVM", "controlMethod": "Cloud", "instanceType": "m5.large"}
    )
    rt = NodeRuntime(name, spec, {}, state, facts, spec_seen_at=T0)
    node = _node(
        name,
        state,
        facts,
        node_type="CloudVM",
        capacity=Capacity.of(ITYPE),
        price=0.096,
        instance_type="m5.large",
        listed_at=NOW + 1 if phase == "pending" else NOW - 1,
        destroying=phase == "destroying",
    )
    # a VM coming up is seen since its create (the wait budget's boot times)
    assert node.node_view(NOW, created_at=T0) == _operator_view(worker, rt)


def test_a_waking_side_node_is_seen_since_its_wake_began() -> None:
    """Both shells show when a waking side node's wake began (its transition's start)."""
    wake = Transition(
        id="t-1",
        kind=TransitionKind.WAKE,
        started_at=T0,
        deadline=T0 + timedelta(minutes=10),
        request=PowerRequest(action="On", attempt=1, requested_at=T0),
    )
    state = _state("gpu", PowerState.WAKING, AdmissionState.CLOSED).model_copy(
        update={"transition": wake}
    )
    node, worker, rt = _side_node("gpu", state, None, "Redfish")
    view = node.node_view(NOW)
    assert view == _operator_view(worker, rt)
    assert view.coming_since == T0


@pytest.mark.parametrize("power", list(PowerState))
def test_side_node_without_a_wake_action_is_wakeable_in_neither(power: PowerState) -> None:
    """A side node whose power controller allows no wake action (here only
    GracefulShutdown) is never wakeable: the simulator once said it was while off."""
    state = _state("nowake", power, AdmissionState.OPEN)
    node, worker, rt = _side_node("nowake", state, True, "None")
    view = node.node_view(NOW)
    assert view == _operator_view(worker, rt)
    assert view.wakeable is False


@pytest.mark.parametrize(("power", "admission", "ready"), CASES)
@pytest.mark.parametrize("control", ["Redfish", "None"])
@pytest.mark.parametrize("node_type", ["SideNode", "CloudVM"])
@pytest.mark.parametrize("policy_valid", [True, False])
def test_the_boards_view_is_the_rule(
    power: PowerState,
    admission: AdmissionState,
    ready: bool | None,
    control: str,
    node_type: str,
    policy_valid: bool,
) -> None:
    """`power.nodestatus.board_view` gives what `rules.nodeview` says of the node."""
    state = _state("n", power, admission)
    facts = _facts("n", node_type, ready, control)
    spec = WorkerNodeSpec.model_validate(
        SIDE_SPEC
        if node_type == "SideNode"
        else {"nodeType": "CloudVM", "controlMethod": "Cloud", "instanceType": "m5.large"}
    )
    rt = NodeRuntime("n", spec, {}, state, facts, spec_seen_at=T0)
    board = board_view(rt, policy_valid)
    assert board.state is power
    assert board.admission_open is admits(admission)
    assert board.ready is is_ready(power, facts.ready)
    assert board.wakeable is can_wake(
        node_type,  # type: ignore[arg-type]
        power,
        facts.capability,
        policy_valid,
    )


def test_an_off_side_node_shows_when_its_wake_timing_lets_it_wake_in_both() -> None:
    """min-off since it went off, cooldown since its last transition: the board's view
    (live) and the simulator's (`wake_timing`) name the same time."""
    policy = PolicyView.from_spec(PowerPolicySpec(min_off="10m", cooldown="15m"))
    state = _state("gpu", PowerState.OFF, AdmissionState.CLOSED).model_copy(
        update={"off_since": T0, "last_transition_at": T0 + timedelta(minutes=1)}
    )
    node, worker, rt = _side_node("gpu", state, None, "Redfish")
    board = PowerBoard()
    board.set(worker.name, board_view(rt, True, policy))
    live = NodeViews(board).node_view(worker)
    simulated = node.node_view(NOW, wake_timing=(policy.min_off, policy.cooldown))
    assert simulated == live
    assert live.wake_after == T0 + timedelta(minutes=16)  # the cooldown ends last
