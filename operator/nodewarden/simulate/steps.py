"""The simulated power controller's side: stepping each node's machine and carrying out
the actions it returns against the simulated hardware.

`Machines` feeds `nodewarden.simulate.decide.decide_node` (the real state machine) the
events the operator's shell feeds it, with the readings `Sensing` says the shell holds,
and carries out each step's effects (`rules.effects`, what each action means, as the
live round reads it) as simulated physics: BMC / cloud requests answering after a
latency (sometimes dropped or errored), boot and shutdown, power reads, probes, the
demand re-read (`rules.demand`), admission closing, rechecks and the periodic
re-evaluation. What it needs of the simulation (clock, event queue, containers, ledger,
fleet counts) it asks through `World`, which `Simulation` implements.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import datetime
from typing import Any, Protocol

from nodewarden.policy.actions import RequestPower
from nodewarden.policy.events import (
    AdmissionClosed,
    DeadlineReached,
    DemandReread,
    Evaluate,
    Event,
    PowerObserved,
    ReadyProbeResult,
    RequestAccepted,
    RequestErrored,
)
from nodewarden.policy.facts import DemandReading, NodeFacts, ReadyReading
from nodewarden.policy.reasons import Decision, ReasonCode
from nodewarden.policy.state import ON_STATES, PowerState
from nodewarden.rules.demand import LIVE
from nodewarden.rules.effects import (
    AllowAdmission,
    Effect,
    Observation,
    Observe,
    Recheck,
    ReEvaluate,
    SendPowerRequest,
    ShutdownCancelled,
    StopAdmission,
    TransitionClosed,
    TransitionOpened,
    effects,
)
from nodewarden.simulate.accounting import Ledger
from nodewarden.simulate.decide import MachineQuery, decide_node
from nodewarden.simulate.nodes import MachineNode
from nodewarden.simulate.policies import SimPolicy
from nodewarden.simulate.results import READING_FIELDS, Recording, SimulationError, StepRecord
from nodewarden.simulate.sensing import Sensing

_US = 1_000_000
_SAME_INSTANT_LIMIT = 500

PROGRESS = frozenset(
    {
        ReasonCode.GATES_PASSED,
        ReasonCode.POWER_ON_CONFIRMED,
        ReasonCode.POWER_OFF_CONFIRMED,
        ReasonCode.READY_CONFIRMED,
        ReasonCode.OVERRIDE_APPLIED,
    }
)
"""Codes that report progress, not what holds a node on."""


class World(Protocol):
    """What the machines' side asks of the simulation (`Simulation` implements it)."""

    now: int
    ledger: Ledger
    nodes: dict[str, MachineNode]
    policy: SimPolicy
    sensing: Sensing
    _api: int
    _tick: int
    _resync: int
    _probe: int
    _boot_probe: int
    _nodes_on: int
    _in_transition: set[str]
    _warm: set[str]
    _recordings: dict[str, Recording]
    _stepped: dict[str, NodeFacts]

    def at(self, us: int) -> datetime: ...
    def us(self, when: datetime) -> int: ...
    def _schedule(self, t: int, fn: Callable[[Any], None], arg: Any = None) -> None: ...
    def _request_round(self) -> None: ...
    def _cause(self, node: MachineNode, cause: str | None) -> None: ...
    def _machine_cause(self, node: MachineNode) -> str | None: ...
    def _remove(self, node: MachineNode) -> None: ...
    def _requeue(self, node: MachineNode) -> None: ...
    def _touch(self, node: MachineNode) -> None: ...
    def _look_again(self, code: str) -> None: ...
    def _warm_reading(self, node: MachineNode) -> None: ...
    def _bill(self, node: MachineNode, end: int) -> None: ...
    def _sample(self) -> None: ...
    def _qualified(self, node: MachineNode) -> int: ...
    def _demand_reading(self, node: MachineNode, queued: int, source: str) -> DemandReading: ...
    def _next_list(self, t: int) -> int: ...


class Machines:
    """Every node's machine steps and their effects (see the module docstring)."""

    def __init__(self, world: World) -> None:
        self.w = world

    # -- probes ---------------------------------------------------------------------------

    def first_success(self, arg: tuple[MachineNode, int]) -> None:
        """The first probe that finds the node up since it came on: a VM pairs; the
        ready probe passes (`WorkerPool.probe_once` -> `PowerController.probed`)."""
        node, token = arg
        if (
            token != node.power_change
            or self.w.nodes.get(node.name) is not node
            or not node.reachable(self.w.now)
            or node.power_since is None
        ):
            return
        node.seen_ready_at = self.w.now
        node.probe_phase = self.w.now % self.w._probe
        node.last_probe = self.w.now
        self.w.ledger.boots.append((self.w.now - node.power_since) / _US)
        self.probe_answer(node)

    def probe_answer(self, node: MachineNode) -> None:
        node.facts = node.facts.model_copy(update=self.w.sensing.probe_readings(node, self.w.now))
        reading = ReadyReading(
            source=f"ssh:{node.name}/ready-probe",
            observed_at=self.w.at(self.w.now),
            passed=True,
            detail="ready",
        )
        self.step(node, ReadyProbeResult(reading=reading))

    # -- what the shell knows before each step --------------------------------------------

    # -- the power source -----------------------------------------------------------------

    def power_changed(self, node: MachineNode) -> None:
        """The physical power changed: the next periodic read observes it."""
        node.power_changed_at = self.w.now
        if node.node_type == "CloudVM":
            at = self.w._next_list(self.w.now)
        else:
            interval = node.model.poll_interval
            phase = node.poll_phase
            at = phase + math.ceil((self.w.now - phase) / interval) * interval
        self.w._schedule(at, self.observed, (node, node.power_change))

    def observed(self, arg: tuple[MachineNode, int]) -> None:
        node, token = arg
        if token != node.power_change:
            return
        self.observe(node)

    def observe(self, node: MachineNode) -> None:
        """A read of the power source that found a value the machine has not seen."""
        if self.w.nodes.get(node.name) is not node:
            return
        value = self.w.sensing.power_value(node, self.w.now)
        power = node.facts.power
        if value is None or (power is not None and power.power == value):
            return
        self.step(
            node, PowerObserved(reading=self.w.sensing.power_reading(node, value, self.w.now))
        )

    # -- machine steps --------------------------------------------------------------------

    def evaluate(self, node: MachineNode) -> None:
        self.deliver((node, Evaluate()))

    def deliver(self, arg: tuple[MachineNode, Event]) -> None:
        node, event = arg
        if self.w.nodes.get(node.name) is not node:
            return
        self.step(node, event)

    def step(self, node: MachineNode, event: Event) -> None:
        instant, count = node.same_instant
        count = count + 1 if instant == self.w.now else 1
        node.same_instant = (self.w.now, count)
        if count > _SAME_INSTANT_LIMIT:
            raise SimulationError(
                f"node {node.name}: {count} decisions at one instant ({self.w.at(self.w.now)}); "
                f"last state {node.state.state}, reasons {node.state.last_reasons}"
            )
        self.w.sensing.telemetry(node, self.w.now, len(self.w._in_transition), len(self.w._warm))
        self.w._warm_reading(node)
        before = node.facts
        view = node.node_view(self.w.now)
        result = decide_node(
            MachineQuery(node.state, before, event), self.w.at(self.w.now), self.w.policy
        )
        node.state = result.next
        node.facts = result.facts
        self.w._touch(node)
        key = (result.decision.value, tuple(r.value for r in result.reasons))
        if key != node.last_key:
            for code in key[1]:
                self.w.ledger.decisions[f"{key[0]} {code}"] += 1
            node.last_key = key
        recording = self.w._recordings.get(node.name)
        if recording is not None and self.w._stepped.get(node.name) is not None:
            self.record(node, recording, before, event, result.decision, key[1])
        self.execute(node, effects(result.actions, self.w.at(self.w.now), result.decision))
        self.catch_up(node)
        cause = self.w._machine_cause(node)
        if cause != node.idle_cause:
            self.w._cause(node, cause)
        if node.node_view(self.w.now) != view:
            self.w._request_round()  # the dispatcher's view of the node changed
        if node.node_type == "CloudVM" and node.state.state is PowerState.OFF:
            self.w._remove(node)  # destroyed and confirmed: the WorkerNode goes
            if recording is not None:
                self.w._stepped.pop(node.name, None)

    def catch_up(self, node: MachineNode) -> None:
        """The machine decided on a probe reading that is behind (work started or ended
        since, or the last probe failed): the next probe brings the change, and the
        operator steps a node on every probe, so look again then."""
        work = node.facts.work
        if (
            work is None
            or node.seen_ready_at is None
            or (work.active_jobs > 0) == bool(node.work.running)
            or node.probe_check_at > self.w.now
            or not node.reachable(self.w.now)
        ):
            return
        at = self.w.sensing.next_probe(node, self.w.now)
        node.probe_check_at = at if at > self.w.now else at + self.w._probe
        self.w._schedule(node.probe_check_at, self.evaluate, node)

    def record(
        self,
        node: MachineNode,
        recording: Recording,
        before: NodeFacts,
        event: Event,
        decision: Decision,
        reasons: tuple[str, ...],
    ) -> None:
        previous = self.w._stepped[node.name]
        patch = {
            name: getattr(before, name)
            for name in READING_FIELDS
            if getattr(before, name) is not getattr(previous, name)
        }
        recording.steps.append(
            StepRecord(
                time=self.w.at(self.w.now),
                event=event,
                patch=patch,
                decision=decision,
                reasons=reasons,
                state=node.state.state,
                admission=node.state.admission.value,
            )
        )
        self.w._stepped[node.name] = node.facts

    def execute(self, node: MachineNode, fx: tuple[Effect, ...]) -> None:
        """Carry out a step's effects on the simulated hardware."""
        recheck: Recheck | None = None
        reevaluate = False
        for effect in fx:
            match effect:
                case Recheck():
                    recheck = effect
                case ReEvaluate():
                    reevaluate = True
                case StopAdmission():
                    at = self.w.now + self.w._api
                    event = AdmissionClosed(at=self.w.at(at), source="simulator:dispatcher")
                    self.w._schedule(at, self.deliver, (node, event))
                    self.w._request_round()
                case AllowAdmission():
                    self.w._request_round()
                case Observe(what=Observation.DEMAND):
                    if node.reread_at is None:
                        node.reread_at = self.w.now + self.w._api
                        self.w._schedule(node.reread_at, self.reread, node)
                case Observe(what=Observation.POWER):
                    if node.poll_at is None:
                        node.poll_at = self.poll_time(node)
                        self.w._schedule(node.poll_at, self.poll, node)
                case Observe(what=Observation.READY_PROBE):
                    if node.probe_at is None:
                        gap = (
                            self.w._probe if node.seen_ready_at is not None else self.w._boot_probe
                        )
                        node.probe_at = max(self.w.now, node.last_probe + gap) + self.w._api
                        self.w._schedule(node.probe_at, self.probe, node)
                case Observe():  # a probe's readings, the capability, the VM list: one refresh
                    if node.refresh_at is None:
                        node.refresh_at = (
                            max(self.w.now, node.last_refresh + self.w._probe) + self.w._api
                        )
                        self.w._schedule(node.refresh_at, self.refresh, node)
                case SendPowerRequest(request=request):
                    self.request(node, request)
                case TransitionOpened(kind=kind):
                    self.w.ledger.transitions[f"{kind.value} opened"] += 1
                case TransitionClosed(kind=kind, outcome=outcome):
                    self.w.ledger.transitions[f"{kind.value} {outcome}"] += 1
                    self.w._look_again("DISRUPTION_BUDGET_EXHAUSTED")
                case ShutdownCancelled():
                    self.w.ledger.transitions["Shutdown cancelled"] += 1
        waiting = (
            node.poll_at is not None
            or node.probe_at is not None
            or node.refresh_at is not None
            or node.reread_at is not None
        )
        if recheck is not None:
            # the machine's time, on the simulator's own clock (not the live shell's clamp)
            at = self.w.us(recheck.asked)
            if at > self.w.now:
                node.timer += 1
                node.timer_at = at
                self.w._schedule(at, self.timer, (node, node.timer))
            elif not waiting:
                # A recheck due now while nothing is outstanding: look again one tick
                # later. While a requested observation is outstanding its answer steps
                # the machine; honouring "now" literally would spin (the machine keeps a
                # passed next-attempt time as its recheck until the probe answers).
                node.timer += 1
                self.w._schedule(self.w.now + self.w._tick, self.timer, (node, node.timer))
        # An idle node that only just came on (its last reasons report progress, nothing
        # holds it) has not been judged yet: nothing else would wake it up.
        unjudged = (
            node.state.state in ON_STATES
            and not node.work.running
            and all(r in PROGRESS for r in node.state.last_reasons)
        )
        if (reevaluate or (unjudged and recheck is None)) and not waiting:
            # the shell's periodic re-evaluation
            node.timer += 1
            self.w._schedule(self.w.now + self.w._resync, self.timer, (node, node.timer))

    def poll_time(self, node: MachineNode) -> int:
        """When a power read the machine asked for answers: a VM's at the next cloud
        listing, a side node's BMC at most every pollInterval, after its latency."""
        if node.node_type == "CloudVM":
            return self.w._next_list(self.w.now + 1)
        lag = node.model.latency.sample(node.rng)
        return max(self.w.now, node.last_poll + node.model.poll_interval) + lag

    def timer(self, arg: tuple[MachineNode, int]) -> None:
        node, token = arg
        if token != node.timer or self.w.nodes.get(node.name) is not node:
            return
        t = node.state.transition
        if t is not None and self.w.now >= self.w.us(t.deadline):
            self.step(node, DeadlineReached(transition_id=t.id))
        else:
            self.step(node, Evaluate())

    def reread(self, node: MachineNode) -> None:
        node.reread_at = None
        if self.w.nodes.get(node.name) is not node:
            return
        event = DemandReread(reading=self.w._demand_reading(node, self.w._qualified(node), LIVE))
        self.step(node, event)

    def poll(self, node: MachineNode) -> None:
        node.poll_at = None
        node.last_poll = self.w.now
        if self.w.nodes.get(node.name) is not node:
            return
        value = self.w.sensing.power_value(node, self.w.now)
        if value is None:
            return  # not listed yet: the listing will be observed
        power = node.facts.power
        known = (
            node.node_type == "CloudVM"
            and power is not None
            and power.power == value
            and (
                node.state.state is not PowerState.UNKNOWN
                or self.w.us(power.observed_at) == self.w.now
            )
        )
        if known:
            # the list says what the machine knows: the reading is refreshed before the
            # next step, and a change (Off) is delivered when the list shows it
            return
        self.step(
            node, PowerObserved(reading=self.w.sensing.power_reading(node, value, self.w.now))
        )

    def probe(self, node: MachineNode) -> None:
        """A probe the machine asked for (RunReadyProbe)."""
        node.probe_at = None
        node.last_probe = self.w.now
        if self.w.nodes.get(node.name) is not node:
            return
        if node.seen_ready_at is not None and node.reachable(self.w.now):
            self.probe_answer(node)
        elif (node.ready_at is None or not node.powered) and node.timer_at <= self.w.now:
            # no answer, none coming, and no recheck due: the shell looks again (the
            # operator steps a VM after every failed probe; decisions change only at
            # the rechecks and grace timers, which are scheduled)
            self.step(node, Evaluate())
        # else: booting (its first successful probe answers), or a recheck is due

    def refresh(self, node: MachineNode) -> None:
        node.refresh_at = None
        node.last_refresh = self.w.now
        if self.w.nodes.get(node.name) is not node:
            return
        if node.seen_ready_at is not None and node.reachable(self.w.now):
            node.facts = node.facts.model_copy(
                update=self.w.sensing.probe_readings(node, self.w.now)
            )
        self.step(node, Evaluate())

    def request(self, node: MachineNode, action: RequestPower) -> None:
        model = node.model
        if node.node_type == "CloudVM":
            node.destroying = True  # WorkerPool.destroy: the dispatcher counts it as leaving
            self.w._request_round()
        lag = model.latency.sample(node.rng)
        errored = node.rng.random() < model.error_rate
        applied = node.rng.random() < 0.5 if errored else node.rng.random() >= model.drop_rate
        at = self.w.now + lag
        outcome_type = RequestErrored if errored else RequestAccepted
        outcome = outcome_type(
            transition_id=action.transition_id,
            attempt=action.attempt,
            action=action.action,
            at=self.w.at(at),
            source=f"{model.source}:{node.name}",
            detail="HTTP 500" if errored else "HTTP 204",
        )
        self.w._schedule(at, self.deliver, (node, outcome))
        if applied:
            node.power_change += 1
            self.w._schedule(at, self.power, (node, action.action, node.power_change))

    def power(self, arg: tuple[MachineNode, str, int]) -> None:
        node, action, token = arg
        if token != node.power_change or self.w.nodes.get(node.name) is not node:
            return
        if action in ("On", "WakeOnLan"):
            if node.powered:
                return
            node.powered = True
            node.power_since = self.w.now
            node.seen_ready_at = None
            self.w._cause(node, "booting / verifying")
            node.ready_at = self.w.now + node.model.boot.sample(node.rng)
            first = self.w.now + math.ceil((node.ready_at - self.w.now) / self.w._boot_probe) * (
                self.w._boot_probe
            )
            self.w._schedule(first, self.first_success, (node, token))
            self.w.ledger.cycles += 1
            self.w._nodes_on += 1
            self.power_changed(node)
            self.w._sample()
            return
        if not node.powered:
            return
        node.ready_at = None  # shutting down: SSH is gone
        node.stopping = True
        if node.node_type == "CloudVM":
            self.power_changed(node)  # listed as shutting down
        delay = 0 if action == "ForceOff" else node.model.shutdown.sample(node.rng)
        self.w._schedule(self.w.now + delay, self.off, (node, token))

    def off(self, arg: tuple[MachineNode, int]) -> None:
        node, token = arg
        if token != node.power_change or not node.powered:
            return
        if node.work.running:
            self.w._requeue(node)
        self.w._cause(node, None)
        self.w._bill(node, self.w.now)
        node.powered = False
        node.stopping = False
        node.power_since = None
        node.seen_ready_at = None
        self.w._nodes_on -= 1
        self.power_changed(node)
        self.w._sample()
