"""The simulated nodes: what each one physically does, and what the controller knows of it.

Two kinds of node, by decision path (`nodewarden.simulate.decide.PATHS`):

* `MachineNode`: a node whose power decisions go through `machine.step` (side nodes
  today; cloud VMs once their rules move there). It carries the machine's persisted
  `NodePowerState`, the shell's `NodeFacts`, and the physical truth the simulation
  produces: whether the node draws power, when it becomes reachable and ready, and the
  work running on it (with a short history, so a probe reading can report the value at
  the probe's own time). `PowerModel` says how its power controller behaves (answer
  latency, dropped and errored requests, poll interval, boot and shutdown delays).
* `DispatcherVm`: a cloud VM on the dispatcher path (created by the scheduler's plan,
  paired at its first successful probe, destroyed by the node-manager matrix).

Both expose `node_view(now)`, the `NodeView` the scheduler's `plan()` reads, built the
way the operator builds it (`Dispatcher._node_view` for VMs; the power state and
admission for machine nodes).
"""

from __future__ import annotations

import bisect
import random
from dataclasses import dataclass, field

from nodewarden.api.powerpolicy import ResetAction
from nodewarden.api.workernode import ControlMethod, NodeType
from nodewarden.policy.facts import NodeFacts
from nodewarden.policy.state import AdmissionState, NodePowerState, PowerState
from nodewarden.scheduling.scheduler import Capacity, NodeState, NodeView
from nodewarden.simulate.distributions import Delay

_SCHEDULER_STATE: dict[PowerState, NodeState] = {
    PowerState.OFF: NodeState.OFF,
    PowerState.WAKING: NodeState.BOOTING,
    PowerState.ON_IDLE: NodeState.IDLE,
    PowerState.ACTIVE: NodeState.ACTIVE,
    PowerState.DRAINING: NodeState.DRAINING,
    PowerState.SHUTTING_DOWN: NodeState.SHUTTING_DOWN,
    PowerState.UNKNOWN: NodeState.UNKNOWN,
    PowerState.BLOCKED: NodeState.UNKNOWN,
}
TRANSITION_STATES = frozenset({PowerState.WAKING, PowerState.DRAINING, PowerState.SHUTTING_DOWN})


@dataclass(frozen=True, slots=True)
class PowerModel:
    """How a node's power controller and the node itself behave."""

    control_method: ControlMethod
    allowable: tuple[ResetAction, ...]
    source: str
    latency: Delay
    drop_rate: float
    error_rate: float
    poll_interval: int
    boot: Delay
    shutdown: Delay


@dataclass(slots=True)
class Work:
    """Containers running on a node, with the recent history of their count."""

    running: set[str] = field(default_factory=set)
    log: list[tuple[int, int]] = field(default_factory=list)
    busy_since: int | None = None

    def change(self, now: int) -> None:
        self.log.append((now, len(self.running)))
        if len(self.log) > 32:
            del self.log[:16]

    def at(self, t: int, idle_floor: int) -> tuple[int, int | None]:
        """(active jobs, idle since) as a probe at time t would have seen them; idle
        since is never before `idle_floor` (when the node became reachable)."""
        index = bisect.bisect_right(self.log, (t, 1 << 62)) - 1
        if index < 0:
            return 0, idle_floor
        when, count = self.log[index]
        if count:
            return count, None
        return 0, max(when, idle_floor)


@dataclass(slots=True)
class MachineNode:
    """A node on the machine path (see the module docstring)."""

    name: str
    node_type: NodeType
    capacity: Capacity
    price: float
    instance_type: str | None
    model: PowerModel
    rng: random.Random
    state: NodePowerState
    facts: NodeFacts
    powered: bool
    power_since: int | None
    ready_at: int | None
    slot: int = 0
    probe_phase: int = 0
    work: Work = field(default_factory=Work)
    power_change: int = 0
    """Token of the pending physical power change (a newer request supersedes it)."""
    timer: int = 0
    poll_at: int | None = None
    probe_at: int | None = None
    refresh_at: int | None = None
    reread_at: int | None = None
    last_poll: int = -(1 << 62)
    last_probe: int = -(1 << 62)
    last_refresh: int = -(1 << 62)
    demand_positive: bool = False
    ever_on: bool = False
    same_instant: tuple[int, int] = (-1, 0)
    last_key: tuple[str, tuple[str, ...]] | None = None
    idle_cause: str | None = None
    """Why the node is on without work right now (None: off, or running work)."""
    idle_cause_since: int = 0

    def reachable(self, t: int) -> bool:
        """SSH answers (booted, not shutting down) at t."""
        return self.powered and self.ready_at is not None and self.ready_at <= t

    def node_view(self, now: int) -> NodeView:
        state = _SCHEDULER_STATE[self.state.state]
        if self.node_type == "CloudVM" and not self.ever_on and state is NodeState.UNKNOWN:
            state = NodeState.BOOTING  # a new VM being verified is coming up, not unknown
        ready = self.facts.ready
        return NodeView(
            name=self.name,
            state=state,
            capacity=self.capacity,
            instance_type=self.instance_type,
            price=self.price,
            admission_open=self.state.admission is AdmissionState.OPEN,
            ready=ready is not None and ready.passed,
        )

    def transitioning(self) -> bool:
        return self.state.state in TRANSITION_STATES

    def warm(self) -> bool:
        """On, ready, open and idle (what FleetReading.warm_idle_nodes counts)."""
        return (
            self.state.state is PowerState.ON_IDLE
            and self.state.admission is AdmissionState.OPEN
            and not self.work.running
        )


@dataclass(slots=True)
class DispatcherVm:
    """A cloud VM on the dispatcher path."""

    name: str
    instance_type: str
    capacity: Capacity
    price: float
    slot: int
    launched: int
    listed_at: int
    ready_at: int | None
    probe_phase: int
    work: Work = field(default_factory=Work)
    paired_at: int | None = None
    idle_since: int | None = None
    draining: bool = False
    destroy_at: int | None = None
    check_token: int = 0
    last_key: tuple[str, tuple[str, ...]] | None = None
    idle_cause: str | None = None
    idle_cause_since: int = 0

    def node_view(self, now: int) -> NodeView:
        if self.destroy_at is not None:
            state = NodeState.SHUTTING_DOWN
        elif now < self.listed_at:
            state = NodeState.PENDING
        elif self.paired_at is None:
            state = NodeState.BOOTING
        elif self.draining:
            state = NodeState.DRAINING
        else:
            state = NodeState.ACTIVE if self.work.running else NodeState.IDLE
        return NodeView(
            name=self.name,
            state=state,
            capacity=self.capacity,
            instance_type=self.instance_type,
            price=self.price,
            admission_open=not self.draining and self.destroy_at is None,
            ready=self.paired_at is not None,
        )

    def warm(self) -> bool:
        return (
            self.paired_at is not None
            and not self.draining
            and self.destroy_at is None
            and not self.work.running
        )


Node = MachineNode | DispatcherVm
