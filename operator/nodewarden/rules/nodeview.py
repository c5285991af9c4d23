"""The one node view the scheduler sees (`NodeView`), from plain facts.

The live dispatcher (`dispatch/views.py`, from the pool's worker and the power board) and
the simulator (`simulate/nodes.py`, from its machine nodes) both build every node's view
here, so the scheduler's input is the same rule on the same facts:

- what the power controller shows of a node (the board's facts): admission open, ready
  (on and the ready probe passed), wakeable (a side node off or waking whose power
  controller allows a wake action, under a valid policy) -- `admits`, `is_ready`,
  `can_wake`;
- a side node's view: its state by its power state, capacity from its spec, when its
  wake began (`waking_since`) or may begin (`wake_not_before`), and how long it takes to
  come up (`rules.boots`);
- a cloud VM's view: shutting down once a destroy is requested, draining while the
  machine leaves, pending until the cloud lists it and booting until it is verified
  ready (both counted open when it will run work: the work planned for it waits for it;
  since its create), else idle or active.

A node's occupancy is not here: the scheduler reads it from the capacity ledger
(`scheduling.ledger.account`), which both callers feed.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta

from nodewarden.api.workernode import NodeCapacity, NodeType
from nodewarden.policy.facts import CapabilityReading, ReadyReading
from nodewarden.policy.state import ON_STATES, AdmissionState, NodePowerState, PowerState
from nodewarden.scheduling.views import COMING_UP, Capacity, NodeState, NodeView
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


def wake_not_before(
    state: NodePowerState, min_off: timedelta, cooldown: timedelta
) -> datetime | None:
    """When the wake gates' timing lets an off node be woken: min-off since it went off
    and the cooldown since its last transition (`policy.timing.wake_timing`); None: not
    off, or nothing holds it."""
    if state.state is not PowerState.OFF:
        return None
    times = [
        since + wait
        for since, wait in ((state.off_since, min_off), (state.last_transition_at, cooldown))
        if since is not None
    ]
    return max(times, default=None)


def waking_since(state: NodePowerState) -> datetime | None:
    """When a waking side node's wake began (its transition's start), else None."""
    transition = state.transition
    if state.state is not PowerState.WAKING or transition is None:
        return None
    return transition.started_at


def side_view(
    name: str,
    capacity: Capacity,
    price: float,
    power: PowerState | None,
    *,
    admission_open: bool,
    ready: bool,
    wakeable: bool,
    coming_since: datetime | None = None,
    boot_seconds: float | None = None,
    boot_slowest: float | None = None,
    wake_after: datetime | None = None,
    gpu_only: bool = False,
) -> NodeView:
    """A side node's view (`power` None: the power controller shows nothing of it yet;
    `coming_since`: when its wake began, `waking_since`; `boot_seconds`, `boot_slowest`:
    how long it takes to come up, as seen, `rules.boots`; `wake_after`: when it may be
    woken, `wake_not_before`; `gpu_only`: admission open to GPU work only)."""
    return NodeView(
        name=name,
        state=SIDE_STATE.get(power, NodeState.UNKNOWN) if power is not None else NodeState.UNKNOWN,
        capacity=capacity,
        instance_type=None,
        price=price,
        admission_open=power is not None and admission_open,
        ready=power is not None and ready,
        wakeable=power is not None and wakeable,
        coming_since=coming_since if power is PowerState.WAKING else None,
        boot_seconds=boot_seconds,
        boot_slowest=boot_slowest,
        wake_after=wake_after if power is PowerState.OFF else None,
        gpu_only=gpu_only,
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
    created_at: datetime | None = None,
    gpu_only: bool = False,
) -> NodeView:
    """A cloud VM's view (`listed`: the cloud lists its instance; `destroying`: a destroy
    was requested; `runs_work`: idle behaviour run and not broken, so it takes the work
    planned for it once verified ready; `created_at`: when its create was asked;
    `gpu_only`: admission open to GPU work only)."""
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
        coming_since=created_at if state in COMING_UP else None,
        gpu_only=gpu_only,
    )
