"""What the power controller holds per node between steps (`NodeRuntime`), its timing
settings, and the small helpers its other modules share."""

from __future__ import annotations

import zlib
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from nodewarden.api.workernode import WorkerNodeSpec
from nodewarden.policy.events import Event
from nodewarden.policy.facts import NodeFacts
from nodewarden.policy.record import SafetyRecord
from nodewarden.policy.state import NodePowerState
from nodewarden.power.agenda import TIMER_OF_ATTRIBUTE, Agenda, EventQueue
from nodewarden.power.control import NodeRef
from nodewarden.power.enrolment import IdentityState
from nodewarden.rules.energy import EnergyMeter, EnergySample
from nodewarden.rules.fleet import FleetTally
from nodewarden.rules.savings import EnergyClass
from nodewarden.validation import Verdict

HISTORY = 10
"""Decisions kept per node for `nodewarden explain workernode`."""


@dataclass(frozen=True, slots=True)
class EnergyBook:
    """Energy readings and figures (operator config `power.energy`, `cloud.currency`)."""

    classes: Mapping[str, EnergyClass] = field(default_factory=dict)
    """Per node class: configured draws, cycle energy and energy price."""
    currency: str = "USD"
    read_interval: float = 60.0
    """Seconds between two power readings of a node while it is On (default: a minute)."""
    status_interval: float = 900.0
    """A node's and a policy's figures are written at most this often (besides a
    transition)."""
    idle_measure: float = 600.0
    """Seconds of integrated idle readings after which the idle draw counts as measured."""

    def class_of(self, spec: WorkerNodeSpec | None) -> str:
        """The node's class: spec.nodeClass, else its instance type (VM) or 'default'."""
        if spec is not None and spec.node_class:
            return spec.node_class
        if spec is not None and spec.node_type == "CloudVM" and spec.instance_type:
            return spec.instance_type
        return "default"

    def klass(self, name: str) -> EnergyClass:
        """The configured class `name` (else 'default', else all zeros)."""
        return self.classes.get(name) or self.classes.get("default") or _NO_CLASS


_NO_CLASS = EnergyClass()


@dataclass(frozen=True, slots=True)
class ControllerSettings:
    """Timing of the controller (operator config `power`)."""

    power_poll_interval: float = 15.0
    """Seconds between BMC PowerState reads of a side node whose state is moving (a
    transition, an unsettled decision)."""
    power_poll_interval_at_rest: float = 60.0
    """Seconds between BMC PowerState reads of a side node at rest (never longer than
    half the policy's telemetry max age, so its power reading stays fresh)."""
    capability_interval: float = 600.0
    """Seconds between re-discoveries of a node's power control (and after errors)."""
    evaluate_interval: float = 30.0
    """A node whose last decision was DEFER is evaluated again at least this often."""
    resync_interval: float = 30.0
    """Re-validation of every WorkerNode (credentials may have changed)."""
    first_write_hold: float = 20.0
    """Seconds a node's first status write at start-up waits at most for its facts
    (`power.firstwrites`; 0: written as each fact arrives)."""
    keep_finished_intents: int = 5
    keep_intents_of_gone_nodes: float = 3600.0
    """Seconds the finished policy-made intents of a deleted node are kept."""
    delete_finished_manual_intents: bool = False
    finished_manual_intent_retention: float = 90 * 86400.0
    """Seconds a finished manual intent is kept when deleting them is switched on."""
    energy: EnergyBook = field(default_factory=EnergyBook)
    cross_process_admission: bool = False
    """Before persist-before-send of a shutdown request, confirm admission closed and
    re-read the containers holding the node through the API server (`power.admitting`,
    docs/sharding.md section 2). Off: the in-memory acknowledgement alone."""


@dataclass
class NodeRuntime:
    """Everything the controller holds about one node between steps."""

    name: str
    spec: WorkerNodeSpec | None
    meta: dict[str, Any]
    state: NodePowerState
    facts: NodeFacts
    spec_seen_at: datetime
    events: deque[Event] = field(default_factory=EventQueue)
    due_at: datetime | None = None
    """When the node is stepped again (a recheck; `Timer.STEP` of the agenda)."""
    expires_at: datetime | None = None
    """When the node's oldest decisive reading turns stale (`Timer.EXPIRY`): it is
    stepped then, even with no new event, so stale evidence is judged on time."""
    settled: bool = False
    """The node's last step asked for nothing (no read, probe, re-evaluation, request):
    an observation that only confirms what it holds needs no step (`quiet`)."""
    headline: tuple[Any, ...] | None = None
    record: SafetyRecord | None = None
    busy: set[str] = field(default_factory=set)
    next_poll: datetime | None = None
    next_discovery: datetime | None = None
    discovery_retries: int = 0
    """Capability discoveries in a row that failed or were refused (their back-off)."""
    idle_since: datetime | None = None
    verdict: Verdict | None = None
    validated_generation: int | None = None
    shadow_key: tuple[Any, ...] | None = None
    transition_intent: str | None = None
    persisted: NodePowerState | None = None
    """The power state last handed to the status writer."""
    unowned_runners: tuple[str, ...] | None = None
    """Runners the node listed without an owner (None: no listing yet): the
    `RunnersOwned` condition."""
    reported_error: str | None = None
    """The power-source error last announced by a Warning Event."""
    history: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=HISTORY))
    """The last decisions that changed the headline (time, decision, reasons, states)."""
    stale_since: datetime | None = None
    """Since when the node's decisions are held back by stale or missing telemetry
    (dated by `gauges.date_stale` after each step)."""
    polled: bool = False
    """Whether the BMC was read once (the second read is spread, see `poll_phase`)."""
    overcommit: str | None = None
    """What the node runs beyond its capacity, as the dispatcher's plan found it (None:
    it fits); the condition Overcommitted."""
    identity: IdentityState = field(default_factory=IdentityState)
    """The BMC's and the host's UUIDs and the enrolment (`power.enrolment`)."""
    failure: str | None = None
    """The error of this node's last power step, if it raised (condition `Reconciled`)."""
    order: int = 0
    """The node's place in the fleet (its arrival): the order in which a round steps."""
    energy: EnergyMeter | None = None
    """The side node's energy meter (`power.energy`; persisted in status.energy.meter)."""
    energy_due: datetime | None = None
    """When its energy figures are written next without a transition (`Timer.ENERGY`)."""
    energy_reading: EnergySample | None = None
    """Its last power reading (the watts metric)."""
    energy_none: str | None = None
    """Why it has no reading (a BMC without a power resource, no BMC, a cloud VM)."""
    node_class: str | None = None
    """The node's class under its policy (`spec.nodeClasses`; `power.warming`)."""
    classed_from: tuple[int, Any] | None = field(default=None, repr=False, compare=False)
    """(id of the spec, policy version) `node_class` was computed from."""
    agenda: Agenda | None = field(default=None, repr=False, compare=False)

    tally: FleetTally | None = field(default=None, repr=False, compare=False)

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        timer = TIMER_OF_ATTRIBUTE.get(name)
        if timer is not None and value is not None:
            agenda = self.__dict__.get("agenda")
            if agenda is not None:
                agenda.push(timer, value, self.name)
        elif name in _TALLIED:
            tally = self.__dict__.get("tally")
            if tally is not None:
                tally.set(self.name, self.policy_name, self.node_type, self.state, self.node_class)

    def bind(self, agenda: Agenda, order: int, tally: FleetTally) -> None:
        """Put the node on `agenda` (its events mark it dirty, its timers are pushed) and
        in the fleet's `tally` (kept as its state or spec changes)."""
        self.order = order
        self.agenda = agenda
        self.tally = tally
        tally.set(self.name, self.policy_name, self.node_type, self.state, self.node_class)
        events = self.events
        if not isinstance(events, EventQueue):
            events = EventQueue(events)
            self.events = events
        events.agenda, events.name = agenda, self.name
        if events:
            agenda.mark(self.name)
        for attribute, timer in TIMER_OF_ATTRIBUTE.items():
            at = getattr(self, attribute)
            if at is not None:
                agenda.push(timer, at, self.name)

    def unbind(self) -> None:
        """Take the node off its agenda (it left the fleet)."""
        events = self.events
        if isinstance(events, EventQueue):
            events.agenda = None
        self.agenda = None
        if self.tally is not None:
            self.tally.forget(self.name)
            self.tally = None

    def at_rest(self) -> bool:
        """Not in a transition, its last step asked for nothing: a confirmation of what it
        already holds (a probe, a read with the same values) needs no step."""
        return self.settled and self.state.transition is None and not self.events

    @property
    def node_type(self) -> str:
        return self.spec.node_type if self.spec is not None else "SideNode"

    @property
    def generation(self) -> int | None:
        gen = self.meta.get("generation")
        return int(gen) if gen is not None else None

    @property
    def policy_name(self) -> str | None:
        """The PowerPolicy the node names (None = the default policy)."""
        spec = self.spec
        return spec.policy_ref.name if spec is not None and spec.policy_ref else None

    @property
    def has_bmc_side(self) -> bool:
        """A side node whose power is read from a BMC."""
        return (
            self.spec is not None
            and self.spec.node_type == "SideNode"
            and self.spec.bmc is not None
        )

    def ref(self) -> NodeRef | None:
        return NodeRef(self.name, self.spec) if self.spec is not None else None


def poll_phase(name: str) -> float:
    """The part of the poll interval, in [0.5, 1), that node `name` waits between its
    first and second BMC read. A fleet's first reads all come at once (start-up, a burst of
    new nodes); spreading the second by name keeps them apart at every interval after, so
    the BMC connections (each holding a TLS read buffer of 256 KiB) are not all open at
    the same moment. Never longer than the interval: telemetry freshness is unchanged."""
    return 0.5 + 0.5 * zlib.crc32(name.encode()) / 2**32


_TALLIED = frozenset({"state", "spec", "node_class"})
"""The attributes a node's fleet marks come from (its policy, type, power state, class)."""

_UNPERSISTED = frozenset({"seq", "recheck_at"})


def persist_worthy(old: NodePowerState | None, new: NodePowerState) -> bool:
    """Whether the power state changed in something a restart needs (not only the step
    counter or the next recheck time, which move at every step)."""
    if old is None:
        return True
    return any(
        getattr(old, name) != getattr(new, name)
        for name in NodePowerState.model_fields
        if name not in _UNPERSISTED
    )


def iso(value: datetime | None) -> str | None:
    """RFC 3339 with a Z, as Kubernetes writes times."""
    return value.isoformat().replace("+00:00", "Z") if value is not None else None
