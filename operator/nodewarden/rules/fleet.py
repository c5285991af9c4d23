"""The fleet counts the core reads per policy: side-node transitions in progress (the
disruption budget) and warm idle nodes (min warm). Pure: callers pass each node's
policy, type and power state."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from nodewarden.policy.facts import FleetReading
from nodewarden.policy.state import NodePowerState, PowerState, TransitionKind, api_admission

SOURCE = "power controller (every node under the policy)"

FleetMember = tuple[str | None, str, NodePowerState]
"""(policy name, node type, power state) of one node."""


def in_budget(node_type: str, state: NodePowerState) -> bool:
    """Whether the node uses up its policy's disruption budget: a side node with a Wake
    or Shutdown transition open (the budget protects fixed capacity: side nodes only;
    a cloud VM draining or being destroyed never counts)."""
    t = state.transition
    return t is not None and t.kind is not TransitionKind.VERIFY and node_type == "SideNode"


def warm_idle(state: NodePowerState) -> bool:
    """Whether the node counts as a warm idle node: On and idle, admission open."""
    return state.state is PowerState.ON_IDLE and api_admission(state.admission) == "Open"


def fleet_marks(node_type: str, state: NodePowerState) -> tuple[bool, bool]:
    """What one node adds to its policy's fleet counts: (in the budget, warm idle)."""
    return in_budget(node_type, state), warm_idle(state)


def recounted(
    reading: FleetReading | None,
    before: tuple[bool, bool],
    after: tuple[bool, bool],
    now: datetime,
) -> FleetReading:
    """`reading` once one node's marks went from `before` to `after` (a step opened or
    closed a transition, or the node left or joined the warm idle nodes): the next node
    stepped in the same round reads the budget with this node's transition counted."""
    transitions = reading.transitions_in_progress if reading is not None else 0
    warm = reading.warm_idle_nodes if reading is not None else 0
    transitions += int(after[0]) - int(before[0])
    warm += int(after[1]) - int(before[1])
    return fleet_reading(max(transitions, 0), max(warm, 0), now)


def fleet_reading(transitions: int, warm: int, now: datetime) -> FleetReading:
    return FleetReading(
        source=SOURCE, observed_at=now, transitions_in_progress=transitions, warm_idle_nodes=warm
    )


def fleet_readings(nodes: Iterable[FleetMember], now: datetime) -> dict[str | None, FleetReading]:
    """Per policy name: the fleet reading of every node under it."""
    counts: dict[str | None, list[int]] = {}
    for policy, node_type, state in nodes:
        c = counts.setdefault(policy, [0, 0])
        if in_budget(node_type, state):
            c[0] += 1
        if warm_idle(state):
            c[1] += 1
    return {key: fleet_reading(c[0], c[1], now) for key, c in counts.items()}
