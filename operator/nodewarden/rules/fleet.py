"""The fleet counts the core reads per policy: side-node transitions in progress (the
disruption budget) and warm idle nodes (min warm). Pure: callers pass each node's
policy, type and power state.

`fleet_readings` counts a whole fleet at once (the reference); `FleetTally` keeps the same
counts as nodes change, one node at a time (the power controller's: a round that steps a
few nodes never counts the fleet)."""

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


class FleetTally:
    """The counts of `fleet_readings`, kept as each node changes (`set`, `forget`)."""

    def __init__(self) -> None:
        self._marks: dict[str, tuple[str | None, bool, bool]] = {}
        self._counts: dict[str | None, list[int]] = {}
        """Per policy: [members, in the budget, warm idle]."""

    def set(self, name: str, policy: str | None, node_type: str, state: NodePowerState) -> None:
        """Node `name` is under `policy` with this type and state now."""
        budget, warm = fleet_marks(node_type, state)
        new = (policy, budget, warm)
        old = self._marks.get(name)
        if old == new:
            return
        if old is not None:
            self._add(old, -1)
        self._marks[name] = new
        self._add(new, 1)

    def forget(self, name: str) -> None:
        """Node `name` left the fleet."""
        old = self._marks.pop(name, None)
        if old is not None:
            self._add(old, -1)

    def reading(self, policy: str | None, now: datetime) -> FleetReading | None:
        """The fleet reading of `policy` (None: no node is under it)."""
        c = self._counts.get(policy)
        return fleet_reading(c[1], c[2], now) if c is not None else None

    def readings(self, now: datetime) -> dict[str | None, FleetReading]:
        return {policy: fleet_reading(c[1], c[2], now) for policy, c in self._counts.items()}

    def _add(self, marks: tuple[str | None, bool, bool], sign: int) -> None:
        policy, budget, warm = marks
        c = self._counts.setdefault(policy, [0, 0, 0])
        c[0] += sign
        c[1] += sign * int(budget)
        c[2] += sign * int(warm)
        if c[0] == 0:
            del self._counts[policy]
