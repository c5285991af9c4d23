"""The discrete-event simulation of one policy on one trace and fleet.

    Simulation(trace, fleet, policy, seed, options).run() -> RunResult

A simulated clock (integer microseconds since the trace start) and a heap of events; no
sleeps, threads or I/O. The loop, per event:

1. Arrivals queue containers. A dispatcher round (at most one per `controller.tickInterval`,
   only when something changed) calls the scheduler's `plan()` with the capacity ledger
   of the operator's dispatcher (`scheduling.ledger.account`: a started container holds
   its node from its start, the runner's start latency included, until it ends; the queued
   ones) and every node as the dispatcher's `NodeView`s, then carries the plan
   out: starts (the container runs for its run time after the runner's start latency),
   creates (a cloud VM: its WorkerNode at once, its instance listed after the create
   latency, ready after the boot delay), and unsatisfiable containers (never run).
2. Queued demand per node is what the operator's power controller takes from each round
   (`power.demand.planned_demand`): for a side node that is off or waking, the containers
   the plan waits on it for (the plan decides which node to wake); for any other node,
   the queued containers it qualifies for (`scheduler.qualified_demand`). A change between
   none and some is fed to the machine as NewDemand; the reading itself is as fresh as
   the operator's, whose dispatcher plans every tick.
3. Every node decision goes through `nodewarden.simulate.decide.decide_node`, i.e. the
   real state machine, with the events the operator's shell feeds it (Evaluate,
   DeadlineReached, AdmissionClosed, DemandReread, NewDemand, request outcomes,
   PowerObserved, ReadyProbeResult); the actions it returns are carried out against the
   simulated hardware:
   * side nodes: a BMC answering after a latency, sometimes dropping an accepted request
     or answering with an error; boot and shutdown delays; PowerState read every
     `bmc.pollInterval` (a change is observed at the next read) and when the machine asks;
   * cloud VMs: the cloud's instance list, read every `cloud.listInterval`, is the trusted
     power source (listed = On, destroyed = PoweringOff, no longer listed = Off); the
     shutdown request is a destroy through the cloud API; the node-manager facts
     (`VmReading`: launch time, paired, last heartbeat, probe attempts) come from the
     list and the probes, as `PowerController._update_vm` builds them; the WorkerNode
     goes once Off is observed;
   * SSH probes: every `probe.bootInterval` while a node boots (its first success pairs a
     VM and delivers the passing ReadyProbeResult), then every `probe.interval`, some
     failing; readings (work, and on side nodes inhibitors and uptime) are stamped with
     the probe's own time. A probe that gets no answer delivers no probe result.
4. The run stops once every container has finished (or can never run) and the trace is
   over, or `SimOptions.max_overrun` after the trace's end; nodes still on are billed up
   to that moment.

Randomness comes from streams seeded by (seed, node, purpose), so a side node sees the
same draws whatever policy is simulated, and the same seed gives the same result.
"""

from __future__ import annotations

import heapq
import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from uuid import NAMESPACE_URL, uuid5

from nodewarden.api.workernode import NodeType, ObservedPower
from nodewarden.policy.actions import (
    CancelPendingShutdown,
    CloseAdmission,
    CloseTransition,
    OpenAdmission,
    OpenTransition,
    PollObservedPower,
    RefreshFacts,
    RequestPower,
    RereadDemand,
    RunReadyProbe,
    ScheduleRecheck,
)
from nodewarden.policy.events import (
    AdmissionClosed,
    DeadlineReached,
    DemandReread,
    Evaluate,
    Event,
    NewDemand,
    PowerObserved,
    ReadyProbeResult,
    RequestAccepted,
    RequestErrored,
)
from nodewarden.policy.facts import (
    CapabilityReading,
    DemandReading,
    DesiredReading,
    FleetReading,
    IdentityReading,
    InhibitorReading,
    NodeFacts,
    PowerReading,
    ReadyReading,
    UptimeReading,
    VmReading,
    WorkReading,
)
from nodewarden.policy.reasons import Decision, ReasonCode
from nodewarden.policy.state import ON_STATES, NodePowerState, PowerState
from nodewarden.scheduling import ledger as capacity
from nodewarden.scheduling.instancetypes import Catalogue, InstanceType
from nodewarden.scheduling.scheduler import plan, qualified_demand
from nodewarden.scheduling.views import (
    Capacity,
    CloudState,
    ContainerView,
    Limits,
    NodeState,
    NodeView,
    Phase,
    Plan,
)
from nodewarden.simulate.accounting import Ledger, billed_us
from nodewarden.simulate.decide import MachineQuery, decide_node
from nodewarden.simulate.distributions import Delay, stream, to_us
from nodewarden.simulate.fleet import Fleet, SideNodeGroup, side_capacity_bytes
from nodewarden.simulate.nodes import MachineNode, PowerModel
from nodewarden.simulate.policies import SimPolicy
from nodewarden.simulate.trace import Trace, TraceContainer

_US = 1_000_000
_ONE_US = timedelta(microseconds=1)
_SAME_INSTANT_LIMIT = 500
_READING_FIELDS = tuple(n for n in NodeFacts.model_fields if n not in ("node", "node_type"))
_PLANNED = "queue (dispatcher plan)"
_LIVE = "queue (live list of ContainerDispatches)"


_PROGRESS = frozenset(
    {
        ReasonCode.GATES_PASSED,
        ReasonCode.POWER_ON_CONFIRMED,
        ReasonCode.POWER_OFF_CONFIRMED,
        ReasonCode.READY_CONFIRMED,
        ReasonCode.OVERRIDE_APPLIED,
    }
)
"""Codes that report progress, not what holds a node on."""
_READS_DEMAND = frozenset(
    {PowerState.OFF, PowerState.ON_IDLE, PowerState.DRAINING, PowerState.SHUTTING_DOWN}
)


class SimulationError(RuntimeError):
    """The simulation cannot go on (a decision loop that never lets time advance)."""


@dataclass(frozen=True, slots=True)
class SimOptions:
    max_overrun: int = 2 * 86_400 * _US
    """How long past the trace's end the run may go on for queued work."""
    record: frozenset[str] = frozenset()
    """Nodes whose every step is recorded (for `nodewarden explain` replays); a VM name
    records the first VM of that name."""


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One recorded machine step: the readings the shell replaced before it, the event,
    and what the machine decided."""

    time: datetime
    event: Event
    patch: dict[str, Any]
    decision: Decision
    reasons: tuple[str, ...]
    state: PowerState
    admission: str


@dataclass(slots=True)
class Recording:
    node: str
    initial_state: NodePowerState
    initial_facts: NodeFacts
    steps: list[StepRecord] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class RunResult:
    policy: SimPolicy
    figures: dict[str, Any]
    series: tuple[tuple[int, int, int], ...]
    recordings: dict[str, Recording]
    end: int


@dataclass(slots=True)
class _Container:
    spec: TraceContainer
    queued_view: ContainerView
    shape: tuple[object, ...]
    node: str | None = None
    started: int | None = None
    finished: int | None = None
    run_view: ContainerView | None = None
    placement: capacity.Placement | None = None
    """What the ledger counts while it runs (its node holds it from its start)."""
    done: bool = False
    token: int = 0


class Simulation:
    """One policy, one trace, one fleet, one seed (see the module docstring)."""

    def __init__(
        self,
        trace: Trace,
        fleet: Fleet,
        policy: SimPolicy,
        seed: int,
        options: SimOptions | None = None,
    ) -> None:
        self.trace = trace
        self.fleet = fleet
        self.policy = policy
        self.seed = seed
        self.options = options or SimOptions()
        self.now = 0
        self.ledger = Ledger()
        self._heap: list[tuple[int, int, Callable[[Any], None], Any]] = []
        self._seq = 0
        controller = fleet.controller
        self._tick = to_us(controller.tick_interval)
        self._api = to_us(controller.api_latency)
        self._resync = to_us(controller.resync_interval)
        self._start_latency = to_us(controller.start_latency)
        self._probe = to_us(fleet.probe.interval)
        self._boot_probe = to_us(fleet.probe.boot_interval)
        self._probe_failure = fleet.probe.failure_rate
        cloud = fleet.cloud
        self._list = to_us(cloud.list_interval)
        self._catalogue: Catalogue = cloud.catalogue
        self._types: dict[str, InstanceType] = {t.name: t for t in cloud.instance_types}
        self._type_policy = cloud.instance_type_policy
        self._vm_model = PowerModel(
            control_method="Cloud",
            allowable=("GracefulShutdown",),
            source="cloud",
            latency=Delay(fixed=controller.api_latency),
            drop_rate=0.0,
            error_rate=0.0,
            poll_interval=self._list,
            boot=cloud.boot,
            shutdown=cloud.shutdown,
        )
        spec = policy.spec
        self._limits = Limits(
            max_nodes=spec.max_nodes,
            per_type_max={lim.instance_type: lim.max for lim in spec.instance_type_limits},
            max_hourly_spend=spec.max_hourly_spend,
            min_warm_nodes=spec.min_warm_nodes,
        )
        self._billing_period = to_us(cloud.billing.period)
        self._billing_minimum = to_us(cloud.billing.minimum)
        self.containers: list[_Container] = []
        self.queued: dict[str, _Container] = {}
        self.running: dict[str, _Container] = {}
        self.nodes: dict[str, MachineNode] = {}
        self._shapes: dict[tuple[object, ...], list[Any]] = {}  # shape -> [resources, count]
        self._qualifies: dict[tuple[tuple[object, ...], str], bool] = {}
        self._slots: dict[str, set[int]] = {}
        self._round_pending = False
        self._in_transition: set[str] = set()
        self._warm: set[str] = set()
        self._nodes_on = 0
        self._done = 0
        self._recordings: dict[str, Recording] = {}
        self._stepped: dict[str, NodeFacts] = {}

    # -- clock and queue ------------------------------------------------------------------

    def at(self, us: int) -> datetime:
        return self.trace.start + timedelta(microseconds=us)

    def us(self, when: datetime) -> int:
        return (when - self.trace.start) // timedelta(microseconds=1)

    def _schedule(self, t: int, fn: Callable[[Any], None], arg: Any = None) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (max(t, self.now), self._seq, fn, arg))

    def _next_tick(self) -> int:
        return math.ceil(self.now / self._tick) * self._tick

    # -- run ------------------------------------------------------------------------------

    def run(self) -> RunResult:
        for spec in self.trace.containers:
            c = _Container(
                spec=spec,
                queued_view=ContainerView(
                    uuid=spec.uuid,
                    phase=Phase.QUEUED,
                    priority=spec.priority,
                    first_seen=self.at(spec.arrival),
                    resources=spec.resources,
                ),
                shape=_shape(spec),
            )
            self.containers.append(c)
            self._schedule(spec.arrival, self._arrive, c)
        for group in self.fleet.side_nodes:
            for name in group.names():
                self._add_side_node(group, name)
        total = len(self.containers)
        cap = self.trace.end + self.options.max_overrun
        while self._heap:
            t, _, fn, arg = heapq.heappop(self._heap)
            if t > cap:
                break
            self.now = t
            fn(arg)
            if self._done >= total and self.now >= self.trace.end:
                break
        return self._close()

    def _close(self) -> RunResult:
        end = self.now
        for node in list(self.nodes.values()):
            self._cause(node, None)
            if node.powered and node.power_since is not None:
                self._bill(node, end)
            if node.work.busy_since is not None:
                self.ledger.busy_interval(node.work.busy_since, end, node.price)
        for c in self.containers:
            if c.started is None:
                self.ledger.not_run += 1
            elif c.finished is None:
                self.ledger.unfinished += 1
        return RunResult(
            policy=self.policy,
            figures=self.ledger.figures(),
            series=tuple(self.ledger.series),
            recordings=self._recordings,
            end=end,
        )

    def _bill(self, node: MachineNode, end: int) -> None:
        """Charge a node's time on: a VM from launch to termination under the cloud's
        billing, a side node its cost per hour from power-on to off."""
        assert node.power_since is not None
        billed = None
        if node.node_type == "CloudVM":
            billed = billed_us(end - node.power_since, self._billing_period, self._billing_minimum)
        self.ledger.on_interval(node.power_since, end, node.price, billed)

    def _sample(self) -> None:
        self.ledger.sample(self.now, self._nodes_on, len(self.queued))

    def _cause(self, node: MachineNode, cause: str | None) -> None:
        """Charge the node's idle stretch so far to its cause; start a new stretch."""
        if node.idle_cause is not None and self.now > node.idle_cause_since:
            self.ledger.idle_interval(node.idle_cause, node.idle_cause_since, self.now, node.price)
        node.idle_cause = cause
        node.idle_cause_since = self.now

    def _machine_cause(self, node: MachineNode) -> str | None:
        if not node.powered or node.work.running:
            return None
        state = node.state.state
        if state in (PowerState.WAKING, PowerState.UNKNOWN, PowerState.OFF):
            return "booting / verifying"
        if state in (PowerState.DRAINING, PowerState.SHUTTING_DOWN):
            return "draining / shutting down"
        if state is PowerState.BLOCKED:
            return "BLOCKED (needs a person)"
        held = [r for r in node.state.last_reasons if r not in _PROGRESS]
        return held[0].value if held else "idle, not yet evaluated"

    # -- containers -----------------------------------------------------------------------

    def _arrive(self, c: _Container) -> None:
        self.queued[c.spec.uuid] = c
        if c.spec.priority > 0:
            self._count_shape(c, 1)
        else:
            self._done += 1  # held: it can never start
        self._sample()
        self._request_round()

    def _count_shape(self, c: _Container, delta: int) -> None:
        entry = self._shapes.setdefault(c.shape, [c.spec.resources, 0])
        entry[1] += delta
        if entry[1] <= 0:
            del self._shapes[c.shape]

    def _dequeue(self, c: _Container) -> None:
        del self.queued[c.spec.uuid]
        if c.spec.priority > 0:
            self._count_shape(c, -1)

    def _start(self, c: _Container, node: MachineNode) -> None:
        self._dequeue(c)
        c.node = node.name
        c.started = self.now + self._start_latency
        c.token += 1
        c.run_view = ContainerView(
            uuid=c.spec.uuid,
            phase=Phase.RUNNING,
            priority=c.spec.priority,
            first_seen=c.queued_view.first_seen,
            resources=c.spec.resources,
            node=node.name,
        )
        c.placement = capacity.Placement(c.run_view)
        self.running[c.spec.uuid] = c
        work = node.work
        if not work.running:
            work.busy_since = self.now
            self._cause(node, None)
        work.running.add(c.spec.uuid)
        work.change(self.now)
        self._touch(node)
        self._schedule(c.started + c.spec.runtime, self._finish, (c, c.token))
        self._sample()

    def _release(self, c: _Container) -> MachineNode | None:
        """Take a running container off its node; returns the node if it became idle."""
        node = self.nodes.get(c.node or "")
        del self.running[c.spec.uuid]
        c.run_view = None
        c.placement = None
        if node is None:
            return None
        work = node.work
        work.running.discard(c.spec.uuid)
        work.change(self.now)
        if work.running:
            return None
        if work.busy_since is not None:
            self.ledger.busy_interval(work.busy_since, self.now, node.price)
            work.busy_since = None
        return node

    def _finish(self, arg: tuple[_Container, int]) -> None:
        c, token = arg
        if token != c.token or c.done:
            return
        c.finished = self.now
        c.done = True
        self._done += 1
        assert c.started is not None
        self.ledger.waits.append((c.started - c.spec.arrival) / _US)
        idle = self._release(c)
        if idle is not None:
            self._node_idle(idle)
        self._sample()
        self._request_round()

    def _requeue(self, node: MachineNode) -> None:
        """The node went away under running containers: they go back to the queue."""
        for uuid in sorted(node.work.running):
            c = self.running[uuid]
            self._release(c)
            c.token += 1
            c.node = None
            c.started = None
            self.ledger.requeued += 1
            self.queued[uuid] = c
            if c.spec.priority > 0:
                self._count_shape(c, 1)
        self._request_round()

    def _node_idle(self, node: MachineNode) -> None:
        self._touch(node)
        self._cause(node, "idle, not yet evaluated")
        # the next probe sees the node idle; the machine re-evaluates then
        self._schedule(self._next_probe(node), self._m_evaluate, node)

    # -- dispatcher round -----------------------------------------------------------------

    def _request_round(self) -> None:
        if not self._round_pending:
            self._round_pending = True
            self._schedule(self._next_tick(), self._round)

    def _round(self, _: Any) -> None:
        self._round_pending = False
        if not self._shapes:
            # nothing startable is queued: the plan would start and create nothing, and
            # every node's demand is zero
            self._update_demand(None)
            return
        placed = [c.placement for c in self.running.values() if c.placement is not None]
        queued = [c.queued_view for c in self.queued.values()]
        # simulated runners are exactly the running containers: no runner lists to read
        views = capacity.account(placed, queued, {}, _no_listed_runner).views
        nodes = [n.node_view(self.now) for n in self.nodes.values()]
        pending = sum(1 for v in nodes if v.state is NodeState.PENDING)
        room = self.fleet.cloud.max_new_nodes_per_round - pending
        cloud = CloudState(max_new_nodes=max(0, room))
        if not self._catalogue.types:
            cloud = CloudState(creates_blocked="no cloud instance types in the fleet")
        result = plan(
            views, nodes, self._catalogue, self._type_policy, self._limits, cloud, self.at(self.now)
        )
        for start in result.starts:
            c = self.queued.get(start.uuid)
            node = self.nodes.get(start.node)
            if c is not None and node is not None:
                self._start(c, node)
        for create in result.creates:
            self._create_vm(create.instance_type)
        for uuid in result.unsatisfiable:
            c = self.queued.get(uuid)
            if c is not None and not c.done:
                self._dequeue(c)
                c.done = True
                self._done += 1
                self.ledger.failed_unsatisfiable += 1
        self._update_demand(result)
        self._sample()

    # -- queued demand --------------------------------------------------------------------

    def _qualified(self, node: MachineNode) -> int:
        """Queued containers the node qualifies for (`scheduler.qualified_demand` on the
        node as an idle node of its shape, memoised per container shape)."""
        view = NodeView(node.name, NodeState.IDLE, node.capacity, node.instance_type, node.price)
        kind = node.instance_type or node.name
        total = 0
        for shape, (resources, count) in self._shapes.items():
            key = (shape, kind)
            hit = self._qualifies.get(key)
            if hit is None:
                probe = ContainerView("demand-probe", Phase.QUEUED, 1, self.trace.start, resources)
                hit = bool(qualified_demand(view, [probe], self._catalogue, self._type_policy))
                self._qualifies[key] = hit
            if hit:
                total += count
        return total

    def _demand_reading(self, node: MachineNode, queued: int, source: str) -> DemandReading:
        return DemandReading(source=source, observed_at=self.at(self.now), queued=queued)

    def _update_demand(self, result: Plan | None) -> None:
        """The operator's planned demand after a round (`power.demand.planned_demand`);
        `result` None: nothing is queued."""
        waiting: dict[str, int] = {}
        if result is not None:
            for node_name in result.wait_nodes.values():
                waiting[node_name] = waiting.get(node_name, 0) + 1
            for node_name, uuids in result.wakes.items():
                extra = sum(1 for u in uuids if result.wait_nodes.get(u) != node_name)
                waiting[node_name] = waiting.get(node_name, 0) + extra
        by_kind: dict[str, int] = {}
        for node in list(self.nodes.values()):
            if result is None:
                queued = 0
            elif node.state.state in (PowerState.OFF, PowerState.WAKING):
                queued = waiting.get(node.name, 0)
            else:
                kind = node.instance_type or node.name
                known = by_kind.get(kind)
                queued = by_kind[kind] = self._qualified(node) if known is None else known
            node.demand_queued = queued
            positive = queued > 0
            if positive != node.demand_positive:
                node.demand_positive = positive
                event = NewDemand(reading=self._demand_reading(node, queued, _PLANNED))
                self._schedule(self.now, self._m_new_demand, (node, event))

    # -- cloud VMs ------------------------------------------------------------------------

    def _slot(self, kind: str) -> int:
        used = self._slots.setdefault(kind, set())
        slot = 0
        while slot in used:
            slot += 1
        used.add(slot)
        self.ledger.slots.add(f"{kind}#{slot}")
        return slot

    def _create_vm(self, type_name: str) -> None:
        """The dispatcher creates the WorkerNode now and the instance in the background:
        listed after the create latency, SSH and ready after the boot delay (never, for
        the share of instances that fail to boot)."""
        itype = self._types[type_name]
        slot = self._slot(type_name)
        name = f"vm-{type_name}-{slot}"
        cloud = self.fleet.cloud
        rng = stream(self.seed, "vm", name, str(self.ledger.cycles))
        listed = self.now + cloud.create_latency.sample(rng)
        failed = rng.random() < cloud.boot_failure_rate
        boot = cloud.boot.sample(rng)
        node = self._machine_node(
            name, "CloudVM", Capacity.of(itype), itype.price, itype.name, self._vm_model, True, rng
        )
        node.slot = slot
        node.listed_at = listed
        node.ready_at = None if failed else listed + boot
        self.ledger.cycles += 1
        self._schedule(self._next_list(listed), self._vm_listed, node)
        if node.ready_at is not None:
            first = (
                listed + math.ceil((node.ready_at - listed) / self._boot_probe) * self._boot_probe
            )
            self._schedule(first, self._first_success, (node, node.power_change))
        view = self.policy.view
        for after in sorted({view.boot_grace, view.lame_after}):
            # the unpaired and lame rules fire on the first probe after these ages
            self._schedule(self.now + after // _ONE_US + self._boot_probe, self._vm_grace, node)
        self._sample()

    def _vm_grace(self, node: MachineNode) -> None:
        if node.seen_ready_at is None:  # still unpaired: the lame / unpaired rules may fire
            self._m_evaluate(node)

    def _next_list(self, t: int) -> int:
        """The first listing of the cloud at or after t (every cloud.listInterval)."""
        return math.ceil(t / self._list) * self._list

    def _vm_listed(self, node: MachineNode) -> None:
        """The instance appears in the cloud list: observed power, launch time, the
        destroy capability (`PowerController.listed` and `_update_vm`)."""
        if self.nodes.get(node.name) is not node or not node.powered:
            return
        when = self.at(self.now)
        update: dict[str, Any] = {
            "uptime": UptimeReading(
                source=f"cloud:{node.name} launch time",
                observed_at=when,
                on_since=self.at(node.power_since or 0),
            )
        }
        if node.facts.capability is None:
            update["capability"] = CapabilityReading(
                source="cloud (destroy)",
                observed_at=when,
                control_method="Cloud",
                allowable=node.model.allowable,
            )
        node.facts = node.facts.model_copy(update=update)
        self._observe(node)

    def _vm_reading(self, node: MachineNode) -> VmReading | None:
        """What `PowerController._update_vm` reads from the list and the probe history."""
        listed = node.listed_at
        launched = node.power_since
        if listed is None or launched is None or self.now < listed:
            return None
        seen = node.seen_ready_at
        if seen is None:
            attempts = (self.now - listed) // self._boot_probe + 1
            last_attempt = listed + (attempts - 1) * self._boot_probe
            heartbeat = None
        else:
            k = (self.now - node.probe_phase) // self._probe
            last_attempt = max(seen, node.probe_phase + k * self._probe)
            beat = self._last_probe(node.name, node.probe_phase, seen)
            heartbeat = seen if beat is None else beat
            attempts = (last_attempt - heartbeat) // self._probe
        observed = max(last_attempt, (self.now // self._list) * self._list)
        key = (observed, heartbeat, attempts)
        vm = node.facts.vm
        if vm is not None and node.vm_key == key:
            return vm
        node.vm_key = key
        return VmReading(
            source="cloud list + ssh probes",
            observed_at=self.at(observed),
            booted_at=self.at(min(launched, observed)),
            paired=seen is not None,
            last_heartbeat=None if heartbeat is None else self.at(heartbeat),
            probe_attempts=attempts,
        )

    def _remove(self, node: MachineNode) -> None:
        del self.nodes[node.name]
        itype = node.instance_type or ""
        self._slots.get(itype, set()).discard(node.slot)
        self._in_transition.discard(node.name)
        self._warm.discard(node.name)
        if node.powered:
            self._nodes_on -= 1
        self._sample()
        self._request_round()

    # -- probes ---------------------------------------------------------------------------

    def _probe_failed(self, name: str, k: int) -> bool:
        if self._probe_failure <= 0:
            return False
        digest = zlib.crc32(f"{self.seed}/{name}/{k}".encode())
        return digest / 2**32 < self._probe_failure

    def _last_probe(self, name: str, phase: int, floor: int) -> int | None:
        """The last successful probe tick at or before now, not before `floor`."""
        k = (self.now - phase) // self._probe
        t = phase + k * self._probe
        for _ in range(10_000):
            if t < floor:
                return None
            if not self._probe_failed(name, k):
                return t
            k -= 1
            t -= self._probe
        return None

    def _next_probe(self, node: MachineNode) -> int:
        """The next probe of a ready node at or after now."""
        phase = node.probe_phase
        return phase + math.ceil((self.now - phase) / self._probe) * self._probe

    def _first_success(self, arg: tuple[MachineNode, int]) -> None:
        """The first probe that finds the node up since it came on: a VM pairs; the
        ready probe passes (`WorkerPool.probe_once` -> `PowerController.probed`)."""
        node, token = arg
        if (
            token != node.power_change
            or self.nodes.get(node.name) is not node
            or not node.reachable(self.now)
            or node.power_since is None
        ):
            return
        node.seen_ready_at = self.now
        node.probe_phase = self.now % self._probe
        node.last_probe = self.now
        self.ledger.boots.append((self.now - node.power_since) / _US)
        self._m_probe_answer(node)

    def _m_probe_answer(self, node: MachineNode) -> None:
        node.facts = node.facts.model_copy(update=self._probe_readings(node, self.now))
        reading = ReadyReading(
            source=f"ssh:{node.name}/ready-probe",
            observed_at=self.at(self.now),
            passed=True,
            detail="ready",
        )
        self._m_step(node, ReadyProbeResult(reading=reading))

    # -- fleet counts ---------------------------------------------------------------------

    def _touch(self, node: MachineNode) -> None:
        if node.warm():
            if node.name not in self._warm:
                self._warm.add(node.name)
                self._look_again("MIN_WARM_NODES")
        else:
            self._warm.discard(node.name)
        if node.transitioning():
            self._in_transition.add(node.name)
        else:
            self._in_transition.discard(node.name)

    def _look_again(self, code: str) -> None:
        """Nodes a fleet count held back (`code`) look again: the count changed."""
        for other in self.nodes.values():
            if other.last_key is not None and code in other.last_key[1]:
                self._schedule(self.now, self._m_evaluate, other)

    # -- nodes ----------------------------------------------------------------------------

    def _power_model(self, group: SideNodeGroup) -> PowerModel:
        redfish = group.control_method == "Redfish"
        return PowerModel(
            control_method=group.control_method,
            allowable=("On", "GracefulShutdown", "ForceOff")
            if redfish
            else ("WakeOnLan", "SshPoweroff"),
            source="redfish" if redfish else "wol+ssh",
            latency=group.bmc.latency,
            drop_rate=group.bmc.drop_rate,
            error_rate=group.bmc.error_rate,
            poll_interval=to_us(group.bmc.poll_interval),
            boot=group.boot,
            shutdown=group.shutdown,
        )

    def _add_side_node(self, group: SideNodeGroup, name: str) -> None:
        ram, scratch = side_capacity_bytes(group.capacity)
        capacity = Capacity(
            vcpus=group.capacity.vcpus,
            ram=ram,
            scratch=scratch,
            gpus=group.capacity.gpus,
            gpu_model=group.capacity.gpu_model,
        )
        on = group.initial_power == "On"
        rng = stream(self.seed, "node", name)
        node = self._machine_node(
            name, "SideNode", capacity, group.cost_per_hour, None, self._power_model(group), on, rng
        )
        if on:
            node.ready_at = node.seen_ready_at = self.now
        node.poll_phase = rng.randrange(node.model.poll_interval)
        self.ledger.slots.add(name)

    def _machine_node(
        self,
        name: str,
        node_type: NodeType,
        capacity: Capacity,
        price: float,
        instance_type: str | None,
        model: PowerModel,
        powered: bool,
        rng: Any,
    ) -> MachineNode:
        t0 = self.at(self.now)
        source = f"{model.source}:{name}"
        desired = "On" if self.policy.never_off else "Auto"
        facts = NodeFacts(
            node=name,
            node_type=node_type,
            desired=DesiredReading(
                source=f"WorkerNode/{name}#spec", observed_at=t0, power=desired, idle_behavior="run"
            ),
            demand=DemandReading(source=_PLANNED, observed_at=t0, queued=0),
        )
        if node_type == "SideNode":
            facts = facts.model_copy(
                update={
                    "power": PowerReading(
                        source=source, observed_at=t0, power="On" if powered else "Off"
                    ),
                    "capability": CapabilityReading(
                        source=source,
                        observed_at=t0,
                        control_method=model.control_method,
                        allowable=model.allowable,
                    ),
                    "inhibitors": InhibitorReading(source=f"ssh:{name}/logind", observed_at=t0),
                }
            )
        node = MachineNode(
            name=name,
            node_type=node_type,
            capacity=capacity,
            price=price,
            instance_type=instance_type,
            model=model,
            rng=rng,
            state=NodePowerState.initial(name),
            facts=facts,
            powered=powered,
            power_since=self.now if powered else None,
            ready_at=None,
            probe_phase=rng.randrange(self._probe),
        )
        self.nodes[name] = node
        if powered:
            self._nodes_on += 1
            self._cause(node, "booting / verifying")
        if name in self.options.record and name not in self._recordings:
            self._recordings[name] = Recording(name, node.state, node.facts)
            self._stepped[name] = node.facts
        self._schedule(self.now, self._m_evaluate, node)
        return node

    # -- what the shell knows before each step --------------------------------------------

    def _telemetry(self, node: MachineNode) -> None:
        """Bring the node's readings up to what the operator's shell holds now: the last
        successful probe's (work; side nodes also inhibitors and uptime), the last read of
        the power source when it still says the same, the last round's demand, the node-
        manager facts of a VM, and the fleet counts."""
        facts = node.facts
        update: dict[str, Any] = {}
        seen = node.seen_ready_at
        if seen is not None and node.reachable(self.now):
            tick = self._last_probe(node.name, node.probe_phase, seen)
            work = facts.work
            if tick is not None and (work is None or self.us(work.observed_at) < tick):
                update.update(self._probe_readings(node, tick))
        power = facts.power
        read = self._last_read(node)
        if (
            power is not None
            and read is not None
            and node.power_changed_at <= read
            and self.us(power.observed_at) < read
            and power.power == self._power_value(node)
        ):
            update["power"] = power.model_copy(update={"observed_at": self.at(read)})
            uptime = facts.uptime
            if node.node_type == "CloudVM" and uptime is not None:
                update["uptime"] = uptime.model_copy(update={"observed_at": self.at(read)})
        demand = facts.demand
        planned = (self.now // self._tick) * self._tick
        if (
            demand is None
            or demand.queued != node.demand_queued
            or (self.us(demand.observed_at) < planned)
        ):
            update["demand"] = DemandReading(
                source=_PLANNED, observed_at=self.at(planned), queued=node.demand_queued
            )
        if node.node_type == "CloudVM":
            vm = self._vm_reading(node)
            if vm is not facts.vm:
                update["vm"] = vm
        fleet = facts.fleet
        transitions, warm = len(self._in_transition), len(self._warm)
        if (
            fleet is None
            or fleet.transitions_in_progress != transitions
            or fleet.warm_idle_nodes != warm
            or self.now - self.us(fleet.observed_at) > self._resync
        ):
            update["fleet"] = FleetReading(
                source="simulator:fleet",
                observed_at=self.at(self.now),
                transitions_in_progress=transitions,
                warm_idle_nodes=warm,
            )
        if update:
            node.facts = facts.model_copy(update=update)

    def _probe_readings(self, node: MachineNode, tick: int) -> dict[str, Any]:
        assert node.seen_ready_at is not None and node.power_since is not None
        active, idle_since = node.work.at(tick, node.seen_ready_at)
        when = self.at(tick)
        work = WorkReading(
            source=f"ssh:{node.name}/runners",
            observed_at=when,
            active_jobs=active,
            idle_since=self.at(idle_since) if idle_since is not None else None,
        )
        if node.node_type == "CloudVM":
            return {"work": work}  # VM probes read the runners only
        return {
            "work": work,
            "inhibitors": InhibitorReading(source=f"ssh:{node.name}/logind", observed_at=when),
            "uptime": UptimeReading(
                source=f"ssh:{node.name}/proc/uptime",
                observed_at=when,
                on_since=self.at(node.power_since),
            ),
            # a simulated machine is the one its BMC manages: the UUIDs match
            "identity": _matching_identity(node.name, when),
        }

    # -- the power source -----------------------------------------------------------------

    def _power_value(self, node: MachineNode) -> ObservedPower | None:
        """What the node's power source says now (None: a VM not listed yet)."""
        if node.node_type == "SideNode":
            return "On" if node.powered else "Off"
        if not node.powered:
            return "Off"  # no longer listed
        if node.listed_at is None or self.now < node.listed_at:
            return None
        return "PoweringOff" if node.stopping else "On"

    def _last_read(self, node: MachineNode) -> int | None:
        """The last periodic read of the node's power source at or before now."""
        if node.node_type == "CloudVM":
            return (self.now // self._list) * self._list
        interval = node.model.poll_interval
        k = (self.now - node.poll_phase) // interval
        return node.poll_phase + k * interval

    def _power_reading(self, node: MachineNode, value: ObservedPower) -> PowerReading:
        if node.node_type == "CloudVM":
            source = (
                f"cloud:{node.name} no longer listed"
                if value == "Off"
                else f"cloud:{node.name}#list"
            )
        else:
            source = f"{node.model.source}:{node.name}#PowerState"
        return PowerReading(source=source, observed_at=self.at(self.now), power=value)

    def _power_changed(self, node: MachineNode) -> None:
        """The physical power changed: the next periodic read observes it."""
        node.power_changed_at = self.now
        if node.node_type == "CloudVM":
            at = self._next_list(self.now)
        else:
            interval = node.model.poll_interval
            phase = node.poll_phase
            at = phase + math.ceil((self.now - phase) / interval) * interval
        self._schedule(at, self._m_observed, (node, node.power_change))

    def _m_observed(self, arg: tuple[MachineNode, int]) -> None:
        node, token = arg
        if token != node.power_change:
            return
        self._observe(node)

    def _observe(self, node: MachineNode) -> None:
        """A read of the power source that found a value the machine has not seen."""
        if self.nodes.get(node.name) is not node:
            return
        value = self._power_value(node)
        power = node.facts.power
        if value is None or (power is not None and power.power == value):
            return
        self._m_step(node, PowerObserved(reading=self._power_reading(node, value)))

    # -- machine steps --------------------------------------------------------------------

    def _m_evaluate(self, node: MachineNode) -> None:
        self._m_deliver((node, Evaluate()))

    def _m_new_demand(self, arg: tuple[MachineNode, Event]) -> None:
        """Demand appeared or went: a step for a node whose decision reads demand (off:
        wake; idle, draining, shutting down: shutdown and races). Verifying, waking,
        busy or blocked nodes decide the same either way; their next step reads it."""
        if arg[0].state.state in _READS_DEMAND:
            self._m_deliver(arg)

    def _m_deliver(self, arg: tuple[MachineNode, Event]) -> None:
        node, event = arg
        if self.nodes.get(node.name) is not node:
            return
        self._m_step(node, event)

    def _m_step(self, node: MachineNode, event: Event) -> None:
        instant, count = node.same_instant
        count = count + 1 if instant == self.now else 1
        node.same_instant = (self.now, count)
        if count > _SAME_INSTANT_LIMIT:
            raise SimulationError(
                f"node {node.name}: {count} decisions at one instant ({self.at(self.now)}); "
                f"last state {node.state.state}, reasons {node.state.last_reasons}"
            )
        self._telemetry(node)
        before = node.facts
        view = node.node_view(self.now)
        result = decide_node(
            MachineQuery(node.state, before, event), self.at(self.now), self.policy
        )
        node.state = result.next
        node.facts = result.facts
        self._touch(node)
        key = (result.decision.value, tuple(r.value for r in result.reasons))
        if key != node.last_key:
            for code in key[1]:
                self.ledger.decisions[f"{key[0]} {code}"] += 1
            node.last_key = key
        recording = self._recordings.get(node.name)
        if recording is not None and self._stepped.get(node.name) is not None:
            self._record(node, recording, before, event, result.decision, key[1])
        self._execute(node, result.actions, result.decision)
        self._catch_up(node)
        cause = self._machine_cause(node)
        if cause != node.idle_cause:
            self._cause(node, cause)
        if node.node_view(self.now) != view:
            self._request_round()  # the dispatcher's view of the node changed
        if node.node_type == "CloudVM" and node.state.state is PowerState.OFF:
            self._remove(node)  # destroyed and confirmed: the WorkerNode goes
            if recording is not None:
                self._stepped.pop(node.name, None)

    def _catch_up(self, node: MachineNode) -> None:
        """The machine decided on a probe reading that is behind (work started or ended
        since, or the last probe failed): the next probe brings the change, and the
        operator steps a node on every probe, so look again then."""
        work = node.facts.work
        if (
            work is None
            or node.seen_ready_at is None
            or (work.active_jobs > 0) == bool(node.work.running)
            or node.probe_check_at > self.now
            or not node.reachable(self.now)
        ):
            return
        at = self._next_probe(node)
        node.probe_check_at = at if at > self.now else at + self._probe
        self._schedule(node.probe_check_at, self._m_evaluate, node)

    def _record(
        self,
        node: MachineNode,
        recording: Recording,
        before: NodeFacts,
        event: Event,
        decision: Decision,
        reasons: tuple[str, ...],
    ) -> None:
        previous = self._stepped[node.name]
        patch = {
            name: getattr(before, name)
            for name in _READING_FIELDS
            if getattr(before, name) is not getattr(previous, name)
        }
        recording.steps.append(
            StepRecord(
                time=self.at(self.now),
                event=event,
                patch=patch,
                decision=decision,
                reasons=reasons,
                state=node.state.state,
                admission=node.state.admission.value,
            )
        )
        self._stepped[node.name] = node.facts

    def _execute(self, node: MachineNode, actions: tuple[Any, ...], decision: Decision) -> None:
        rescheduled = False
        recheck: ScheduleRecheck | None = None
        for action in actions:
            if isinstance(action, ScheduleRecheck):
                recheck = action
            elif isinstance(action, CloseAdmission):
                at = self.now + self._api
                event = AdmissionClosed(at=self.at(at), source="simulator:dispatcher")
                self._schedule(at, self._m_deliver, (node, event))
                self._request_round()
            elif isinstance(action, OpenAdmission):
                self._request_round()
            elif isinstance(action, RereadDemand):
                if node.reread_at is None:
                    node.reread_at = self.now + self._api
                    self._schedule(node.reread_at, self._m_reread, node)
            elif isinstance(action, PollObservedPower):
                if node.poll_at is None:
                    node.poll_at = self._poll_time(node)
                    self._schedule(node.poll_at, self._m_poll, node)
            elif isinstance(action, RunReadyProbe):
                if node.probe_at is None:
                    gap = self._probe if node.seen_ready_at is not None else self._boot_probe
                    node.probe_at = max(self.now, node.last_probe + gap) + self._api
                    self._schedule(node.probe_at, self._m_probe, node)
            elif isinstance(action, RefreshFacts):
                if node.refresh_at is None:
                    node.refresh_at = max(self.now, node.last_refresh + self._probe) + self._api
                    self._schedule(node.refresh_at, self._m_refresh, node)
            elif isinstance(action, RequestPower):
                self._m_request(node, action)
            elif isinstance(action, OpenTransition):
                self.ledger.transitions[f"{action.kind.value} opened"] += 1
            elif isinstance(action, CloseTransition):
                self.ledger.transitions[f"{action.kind.value} {action.outcome}"] += 1
                self._look_again("DISRUPTION_BUDGET_EXHAUSTED")
            elif isinstance(action, CancelPendingShutdown):
                self.ledger.transitions["Shutdown cancelled"] += 1
        waiting = (
            node.poll_at is not None
            or node.probe_at is not None
            or node.refresh_at is not None
            or node.reread_at is not None
        )
        if recheck is not None:
            at = self.us(recheck.at)
            if at > self.now:
                node.timer += 1
                node.timer_at = at
                self._schedule(at, self._m_timer, (node, node.timer))
                rescheduled = True
            elif not waiting:
                # A recheck due now while nothing is outstanding: look again one tick
                # later. While a requested observation is outstanding its answer steps
                # the machine; honouring "now" literally would spin (the machine keeps a
                # passed next-attempt time as its recheck until the probe answers).
                node.timer += 1
                self._schedule(self.now + self._tick, self._m_timer, (node, node.timer))
                rescheduled = True
            else:
                rescheduled = True
        # An idle node that only just came on (its last reasons report progress, nothing
        # holds it) has not been judged yet: nothing else would wake it up.
        unjudged = (
            node.state.state in ON_STATES
            and not node.work.running
            and all(r in _PROGRESS for r in node.state.last_reasons)
        )
        if (decision is Decision.DEFER or unjudged) and not rescheduled and not waiting:
            # the shell's periodic re-evaluation
            node.timer += 1
            self._schedule(self.now + self._resync, self._m_timer, (node, node.timer))

    def _poll_time(self, node: MachineNode) -> int:
        """When a power read the machine asked for answers: a VM's at the next cloud
        listing, a side node's BMC at most every pollInterval, after its latency."""
        if node.node_type == "CloudVM":
            return self._next_list(self.now + 1)
        lag = node.model.latency.sample(node.rng)
        return max(self.now, node.last_poll + node.model.poll_interval) + lag

    def _m_timer(self, arg: tuple[MachineNode, int]) -> None:
        node, token = arg
        if token != node.timer or self.nodes.get(node.name) is not node:
            return
        t = node.state.transition
        if t is not None and self.now >= self.us(t.deadline):
            self._m_step(node, DeadlineReached(transition_id=t.id))
        else:
            self._m_step(node, Evaluate())

    def _m_reread(self, node: MachineNode) -> None:
        node.reread_at = None
        if self.nodes.get(node.name) is not node:
            return
        event = DemandReread(reading=self._demand_reading(node, self._qualified(node), _LIVE))
        self._m_step(node, event)

    def _m_poll(self, node: MachineNode) -> None:
        node.poll_at = None
        node.last_poll = self.now
        if self.nodes.get(node.name) is not node:
            return
        value = self._power_value(node)
        if value is None:
            return  # not listed yet: the listing will be observed
        power = node.facts.power
        known = (
            node.node_type == "CloudVM"
            and power is not None
            and power.power == value
            and (
                node.state.state is not PowerState.UNKNOWN or self.us(power.observed_at) == self.now
            )
        )
        if known:
            # the list says what the machine knows: the reading is refreshed before the
            # next step, and a change (Off) is delivered when the list shows it
            return
        self._m_step(node, PowerObserved(reading=self._power_reading(node, value)))

    def _m_probe(self, node: MachineNode) -> None:
        """A probe the machine asked for (RunReadyProbe)."""
        node.probe_at = None
        node.last_probe = self.now
        if self.nodes.get(node.name) is not node:
            return
        if node.seen_ready_at is not None and node.reachable(self.now):
            self._m_probe_answer(node)
        elif (node.ready_at is None or not node.powered) and node.timer_at <= self.now:
            # no answer, none coming, and no recheck due: the shell looks again (the
            # operator steps a VM after every failed probe; decisions change only at
            # the rechecks and grace timers, which are scheduled)
            self._m_step(node, Evaluate())
        # else: booting (its first successful probe answers), or a recheck is due

    def _m_refresh(self, node: MachineNode) -> None:
        node.refresh_at = None
        node.last_refresh = self.now
        if self.nodes.get(node.name) is not node:
            return
        if node.seen_ready_at is not None and node.reachable(self.now):
            node.facts = node.facts.model_copy(update=self._probe_readings(node, self.now))
        self._m_step(node, Evaluate())

    def _m_request(self, node: MachineNode, action: RequestPower) -> None:
        model = node.model
        if node.node_type == "CloudVM":
            node.destroying = True  # WorkerPool.destroy: the dispatcher counts it as leaving
            self._request_round()
        lag = model.latency.sample(node.rng)
        errored = node.rng.random() < model.error_rate
        applied = node.rng.random() < 0.5 if errored else node.rng.random() >= model.drop_rate
        at = self.now + lag
        outcome_type = RequestErrored if errored else RequestAccepted
        outcome = outcome_type(
            transition_id=action.transition_id,
            attempt=action.attempt,
            action=action.action,
            at=self.at(at),
            source=f"{model.source}:{node.name}",
            detail="HTTP 500" if errored else "HTTP 204",
        )
        self._schedule(at, self._m_deliver, (node, outcome))
        if applied:
            node.power_change += 1
            self._schedule(at, self._m_power, (node, action.action, node.power_change))

    def _m_power(self, arg: tuple[MachineNode, str, int]) -> None:
        node, action, token = arg
        if token != node.power_change or self.nodes.get(node.name) is not node:
            return
        if action in ("On", "WakeOnLan"):
            if node.powered:
                return
            node.powered = True
            node.power_since = self.now
            node.seen_ready_at = None
            self._cause(node, "booting / verifying")
            node.ready_at = self.now + node.model.boot.sample(node.rng)
            first = self.now + math.ceil((node.ready_at - self.now) / self._boot_probe) * (
                self._boot_probe
            )
            self._schedule(first, self._first_success, (node, token))
            self.ledger.cycles += 1
            self._nodes_on += 1
            self._power_changed(node)
            self._sample()
            return
        if not node.powered:
            return
        node.ready_at = None  # shutting down: SSH is gone
        node.stopping = True
        if node.node_type == "CloudVM":
            self._power_changed(node)  # listed as shutting down
        delay = 0 if action == "ForceOff" else node.model.shutdown.sample(node.rng)
        self._schedule(self.now + delay, self._m_off, (node, token))

    def _m_off(self, arg: tuple[MachineNode, int]) -> None:
        node, token = arg
        if token != node.power_change or not node.powered:
            return
        if node.work.running:
            self._requeue(node)
        self._cause(node, None)
        self._bill(node, self.now)
        node.powered = False
        node.stopping = False
        node.power_since = None
        node.seen_ready_at = None
        self._nodes_on -= 1
        self._power_changed(node)
        self._sample()


def _no_listed_runner(uuid: str) -> None:
    return None


def _shape(spec: TraceContainer) -> tuple[object, ...]:
    r = spec.resources
    return (r.vcpus, r.ram, r.scratch, r.gpus, r.gpu_model, r.preemptible)


def _matching_identity(name: str, when: datetime) -> IdentityReading:
    """A side node's BMC system UUID and its host's DMI product UUID (the same machine),
    as the live operator reads them with each BMC read and probe."""
    machine = str(uuid5(NAMESPACE_URL, f"nodewarden-simulated-machine:{name}"))
    return IdentityReading(
        source=f"ssh:{name}/sys/class/dmi/id/product_uuid",
        observed_at=when,
        bmc_uuid=machine,
        bmc_source=f"simulator:{name} BMC",
        bmc_observed_at=when,
        host_uuid=machine,
        host_source=f"ssh:{name}/sys/class/dmi/id/product_uuid",
        host_observed_at=when,
        matched_at=when,
        matched_uuid=machine,
    )
