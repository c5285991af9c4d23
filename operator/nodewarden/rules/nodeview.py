"""The one node view the scheduler sees (`NodeView`), from plain facts.

The live dispatcher (`dispatch/views.py`, from the pool's worker and the power board) and
the simulator (`simulate/nodes.py`, from its machine nodes) both build every node's view
here, so the scheduler's input is the same rule on the same facts:

- what the power controller shows of a node (the board's facts): admission open, ready
  (on and the ready probe passed), wakeable (a side node off or waking whose power
  controller allows a wake action, under a valid policy) -- `admits`, `is_ready`,
  `can_wake`;
- a side node's view: its state by its power state, capacity from its spec;
- a cloud VM's view: shutting down once a destroy is requested, draining while the
  machine leaves, pending until the cloud lists it and booting until it is verified
  ready (both counted open when it will run work: the work planned for it waits for it),
  else idle or active.

A node's occupancy is not here: the scheduler reads it from the capacity ledger
(`scheduling.ledger.account`), which both callers feed.
"""

from __future__ import annotations

from collections.abc import Mapping

from nodewarden.api.workernode import NodeCapacity, NodeType
from nodewarden.policy.facts import CapabilityReading, ReadyReading
from nodewarden.policy.state import ON_STATES, AdmissionState, PowerState
from nodewarden.scheduling.views import Capacity, NodeState, NodeView
from nodewarden.units import parse_quantity

SIDE_STATE: Mapping[PowerState, NodeState] = {
    PowerState.OFF: NodeState.OFF,
    PowerState.WAKING: NodeState.WAKING,
    PowerState.ON_IDLE: NodeState.IDLE,
    PowerState.ACTIVE: NodeState.ACTIVE,
    PowerState.DRAINING: NodeState.DRAINING,
    PowerState.SHUTTING_DOWN: NodeState.SHUTTING_DOWN,
    PowerState.UNKNOWN: NodeState.UNKNOWN,
    PowerState.BLOCKED: NodeState.UNKNOWN,
}
"""A side node's scheduler state by its power state."""
VM_LEAVING = frozenset({PowerState.DRAINING, PowerState.SHUTTING_DOWN, PowerState.BLOCKED})
"""Power states in which a VM takes no work (the scheduler sees it draining)."""
WAKE_ACTIONS = frozenset({"On", "WakeOnLan"})
"""Power actions that wake a node."""
WAKEABLE = frozenset({PowerState.OFF, PowerState.WAKING})
NO_CAPACITY = Capacity(0, 0, 0, 0)


def admits(admission: AdmissionState) -> bool:
    """Admission is open (only Open binds work; Closing is closed)."""
    return admission is AdmissionState.OPEN


def is_ready(state: PowerState, ready: ReadyReading | None) -> bool:
    """The node is on and its ready probe passed."""
    return state in ON_STATES and ready is not None and ready.passed


def can_wake(
    node_type: NodeType | str,
    state: PowerState,
    capability: CapabilityReading | None,
    policy_valid: bool,
) -> bool:
    """A side node, off or waking, whose power controller allows a wake action, under a
    valid policy: the power controller may wake it for demand."""
    return (
        node_type == "SideNode"
        and capability is not None
        and capability.allowable is not None
        and bool(WAKE_ACTIONS & set(capability.allowable))
        and policy_valid
        and state in WAKEABLE
    )


def spec_capacity(cap: NodeCapacity | None) -> Capacity:
    """A side node's capacity from its spec (none declared: nothing fits)."""
    if cap is None:
        return NO_CAPACITY
    return Capacity(
        cap.vcpus, parse_quantity(cap.ram), parse_quantity(cap.scratch), cap.gpus, cap.gpu_model
    )


def side_view(
    name: str,
    capacity: Capacity,
    price: float,
    power: PowerState | None,
    *,
    admission_open: bool,
    ready: bool,
    wakeable: bool,
) -> NodeView:
    """A side node's view (`power` None: the power controller shows nothing of it yet)."""
    return NodeView(
        name=name,
        state=SIDE_STATE.get(power, NodeState.UNKNOWN) if power is not None else NodeState.UNKNOWN,
        capacity=capacity,
        instance_type=None,
        price=price,
        admission_open=power is not None and admission_open,
        ready=power is not None and ready,
        wakeable=power is not None and wakeable,
    )


def cloud_view(
    name: str,
    capacity: Capacity,
    instance_type: str,
    price: float,
    power: PowerState | None,
    *,
    admission_open: bool,
    ready: bool,
    listed: bool,
    destroying: bool,
    runs_work: bool,
) -> NodeView:
    """A cloud VM's view (`listed`: the cloud lists its instance; `destroying`: a destroy
    was requested; `runs_work`: idle behaviour run and not broken, so it takes the work
    planned for it once verified ready)."""
    shown = power is not None
    ready = shown and ready
    admission_open = shown and admission_open
    if destroying:
        state = NodeState.SHUTTING_DOWN
    elif power in VM_LEAVING:
        state = NodeState.DRAINING
    elif not listed or not ready:
        state = NodeState.BOOTING if listed else NodeState.PENDING
        # a VM coming up takes the work planned for it once verified ready: count it
        admission_open = runs_work
    else:
        state = NodeState.ACTIVE if power is PowerState.ACTIVE else NodeState.IDLE
    return NodeView(
        name=name,
        state=state,
        capacity=capacity,
        instance_type=instance_type,
        price=price,
        admission_open=admission_open,
        ready=ready,
    )
