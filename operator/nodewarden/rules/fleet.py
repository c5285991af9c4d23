"""The fleet counts the core reads per policy: side-node transitions in progress (the
disruption budget) and warm idle nodes (min warm), and per node class its warm and
coming nodes (the warm-capacity levers, `rules.warm`). Pure: callers pass each node's
policy, type, power state and class.

`fleet_readings` counts a whole fleet at once (the reference); `FleetTally` keeps the same
counts as nodes change, one node at a time (the power controller's: a round that steps a
few nodes never counts the fleet)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Literal

from nodewarden.policy.facts import FleetReading
from nodewarden.policy.state import AdmissionState, NodePowerState, PowerState, TransitionKind

SOURCE = "power controller (every node under the policy)"

FleetMember = tuple[str | None, str, NodePowerState]
"""(policy name, node type, power state) of one node."""
ClassMark = Literal["warm", "coming"] | None
ClassKey = tuple[str | None, str]
"""(policy name, node class)."""


# Enum members bound to module names: on Python 3.11 `PowerState.ON_IDLE` goes through
# EnumType.__getattr__ (~4x a plain global read), and the round reads them for every
# node it steps.
_VERIFY = TransitionKind.VERIFY
_ON_IDLE = PowerState.ON_IDLE
_OPEN = AdmissionState.OPEN


def in_budget(node_type: str, state: NodePowerState) -> bool:
    """Whether the node uses up its policy's disruption budget: a side node with a Wake
    or Shutdown transition open (the budget protects fixed capacity: side nodes only;
    a cloud VM draining or being destroyed never counts)."""
    t = state.transition
    return t is not None and t.kind is not _VERIFY and node_type == "SideNode"


def warm_idle(state: NodePowerState) -> bool:
    """Whether the node counts as a warm idle node: On and idle, admission open (its
    `state.api_admission` is "Open" exactly when the admission is OPEN)."""
    return state.state is _ON_IDLE and state.admission is _OPEN


def fleet_marks(node_type: str, state: NodePowerState) -> tuple[bool, bool]:
    """What one node adds to its policy's fleet counts: (in the budget, warm idle)."""
    return in_budget(node_type, state), warm_idle(state)


def class_mark(state: NodePowerState) -> ClassMark:
    """What a node adds to its node class's counts (`rules.warm`): warm (on, idle,
    admission open), coming (waking, or being verified after a boot or wake), or nothing."""
    if warm_idle(state):
        return "warm"
    t = state.transition
    if state.state is PowerState.WAKING or (
        state.state is PowerState.UNKNOWN and t is not None and t.kind is TransitionKind.VERIFY
    ):
        return "coming"
    return None


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
    """The counts of `fleet_readings`, kept as each node changes (`set`, `forget`), and
    per node class (`rules.warm`) its warm and coming nodes and its members."""

    def __init__(self) -> None:
        self._marks: dict[str, tuple[str | None, bool, bool, str | None, ClassMark]] = {}
        self._counts: dict[str | None, list[int]] = {}
        """Per policy: [members, in the budget, warm idle]."""
        self._classes: dict[ClassKey, list[int]] = {}
        """Per (policy, class): [warm, coming]."""
        self._members: dict[ClassKey, set[str]] = {}
        self._last_reading: dict[str | None, tuple[int, int, datetime, FleetReading]] = {}
        """Per policy: the last reading made, with its counts and clock reading (every
        node a round steps reads its policy's at the round's clock: one model a round,
        not one per node, while the counts stay the same)."""
        self.class_changed: Callable[[ClassKey], None] | None = None
        """Told when a class's warm or coming count went down (it may need a node woken)."""
        self.regrouped: Callable[[str | None], None] | None = None
        """Told, per policy, when a node it had or has now moved into or out of it or
        changed its class there (its policy's per-class counts changed)."""

    def set(
        self,
        name: str,
        policy: str | None,
        node_type: str,
        state: NodePowerState,
        node_class: str | None = None,
    ) -> None:
        """Node `name` is under `policy` with this type, state and class now."""
        budget, warm = fleet_marks(node_type, state)
        mark = class_mark(state) if node_class is not None else None
        new = (policy, budget, warm, node_class, mark)
        old = self._marks.get(name)
        if old == new:
            return
        if old is not None:
            self._add(name, old, -1)
        self._marks[name] = new
        self._add(name, new, 1)
        if old is not None and (old[0] != policy or old[3] != node_class) and self.regrouped:
            self.regrouped(old[0])
            if old[0] != policy:
                self.regrouped(policy)
        if old is not None and old[4] is not None and old[3] is not None:
            lost = old[3] != node_class or old[0] != policy or old[4] != mark
            if lost and self.class_changed is not None:
                self.class_changed((old[0], old[3]))

    def forget(self, name: str) -> None:
        """Node `name` left the fleet."""
        old = self._marks.pop(name, None)
        if old is not None:
            self._add(name, old, -1)
            if old[4] is not None and old[3] is not None and self.class_changed is not None:
                self.class_changed((old[0], old[3]))

    def reading(self, policy: str | None, now: datetime) -> FleetReading | None:
        """The fleet reading of `policy` (None: no node is under it). The same object as
        the last call's when the counts and the clock reading (the same object) are."""
        c = self._counts.get(policy)
        if c is None:
            return None
        transitions, warm = c[1], c[2]
        last = self._last_reading.get(policy)
        if last is not None and last[2] is now and last[0] == transitions and last[1] == warm:
            return last[3]
        made = fleet_reading(transitions, warm, now)
        self._last_reading[policy] = (transitions, warm, now, made)
        return made

    def readings(self, now: datetime) -> dict[str | None, FleetReading]:
        return {policy: fleet_reading(c[1], c[2], now) for policy, c in self._counts.items()}

    def class_counts(self, policy: str | None, node_class: str) -> tuple[int, int]:
        """(warm, coming) nodes of `node_class` under `policy`."""
        c = self._classes.get((policy, node_class))
        return (c[0], c[1]) if c is not None else (0, 0)

    def members(self, policy: str | None, node_class: str) -> frozenset[str]:
        """The nodes of `node_class` under `policy`."""
        return frozenset(self._members.get((policy, node_class), ()))

    def _add(
        self,
        name: str,
        marks: tuple[str | None, bool, bool, str | None, ClassMark],
        sign: int,
    ) -> None:
        policy, budget, warm, node_class, mark = marks
        c = self._counts.setdefault(policy, [0, 0, 0])
        c[0] += sign
        c[1] += sign * int(budget)
        c[2] += sign * int(warm)
        if c[0] == 0:
            del self._counts[policy]
            self._last_reading.pop(policy, None)
        if node_class is None:
            return
        key = (policy, node_class)
        members = self._members.setdefault(key, set())
        if sign > 0:
            members.add(name)
        else:
            members.discard(name)
        k = self._classes.setdefault(key, [0, 0])
        k[0] += sign * int(mark == "warm")
        k[1] += sign * int(mark == "coming")
        if not members:
            del self._members[key]
            del self._classes[key]
