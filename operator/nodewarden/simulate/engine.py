"""The discrete-event simulation of one policy on one trace and fleet.

    Simulation(trace, fleet, policy, seed, options).run() -> RunResult

A simulated clock (integer microseconds since the trace start) and a heap of events; no
sleeps, threads or I/O. The loop, per event:

1. Arrivals queue containers. A dispatcher round (at most one per `controller.tickInterval`,
   only when something changed) calls the scheduler's `plan()` with every queued and
   running container and every node as `NodeView`s, then carries the plan out: starts
   (the container runs for its run time after the runner's start latency), creates
   (a cloud VM launched now, listed after the create latency, ready after the boot
   delay, paired at its first successful probe), and unsatisfiable containers (never run).
2. Qualified demand for each machine-path node is the number of queued containers that
   fit it by the scheduler's own rules (`plan()` on a one-node snapshot, memoised per
   shape); a change between none and some is fed to the machine as NewDemand.
3. Every node decision goes through `nodewarden.simulate.decide.decide_node`: side nodes
   step the real state machine with the events the shell would feed it (Evaluate,
   DeadlineReached, AdmissionClosed, DemandReread, NewDemand, request outcomes,
   PowerObserved, ReadyProbeResult); the actions it returns are carried out against the
   simulated hardware (a BMC answering after a latency, sometimes dropping an accepted
   request or answering with an error; boot and shutdown delays; SSH probe readings
   stamped with the probe's own time, some probes failing). Cloud VMs on the dispatcher
   path are decided by the node-manager matrix when they become idle, when their idle
   grace, billing window or boot grace may have changed, and when they leave the
   kept-warm set.
4. The run stops once every container has finished (or can never run) and the trace is
   over, or `SimOptions.max_overrun` after the trace's end; nodes still on are billed up
   to that moment.

Randomness comes from streams seeded by (seed, node, purpose), so a node sees the same
draws whatever policy is simulated, and the same seed gives the same result.
"""

from __future__ import annotations

import heapq
import math
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from nodewarden.api.workernode import NodeType
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
    InhibitorReading,
    NodeFacts,
    PowerReading,
    ReadyReading,
    UptimeReading,
    WorkReading,
)
from nodewarden.policy.nodemanager import CloudWorkerFacts
from nodewarden.policy.reasons import Decision, ReasonCode
from nodewarden.policy.state import ON_STATES, NodePowerState, PowerState
from nodewarden.scheduling.instancetypes import Catalogue, InstanceType
from nodewarden.scheduling.scheduler import (
    Capacity,
    CloudState,
    ContainerView,
    Limits,
    NodeState,
    NodeView,
    Phase,
    plan,
)
from nodewarden.simulate.accounting import Ledger, billed_us
from nodewarden.simulate.decide import (
    DecisionPath,
    MachineQuery,
    VmQuery,
    decide_node,
    path_for,
)
from nodewarden.simulate.distributions import stream, to_us
from nodewarden.simulate.fleet import Fleet, SideNodeGroup, side_capacity_bytes
from nodewarden.simulate.nodes import DispatcherVm, MachineNode, Node, PowerModel
from nodewarden.simulate.policies import SimPolicy
from nodewarden.simulate.trace import Trace, TraceContainer

_US = 1_000_000
_SAME_INSTANT_LIMIT = 500
_READING_FIELDS = tuple(n for n in NodeFacts.model_fields if n not in ("node", "node_type"))


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


class SimulationError(RuntimeError):
    """The simulation cannot go on (a decision loop that never lets time advance)."""


@dataclass(frozen=True, slots=True)
class SimOptions:
    max_overrun: int = 2 * 86_400 * _US
    """How long past the trace's end the run may go on for queued work."""
    record: frozenset[str] = frozenset()
    """Machine-path nodes whose every step is recorded (for `nodewarden explain` replays)."""
    paths: Mapping[NodeType, DecisionPath] | None = None
    """Override of `decide.PATHS` (tests run cloud VMs on the machine path with it)."""


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
        self._tick = to_us(fleet.controller.tick_interval)
        self._api = to_us(fleet.controller.api_latency)
        self._resync = to_us(fleet.controller.resync_interval)
        self._start_latency = to_us(fleet.controller.start_latency)
        self._probe = to_us(fleet.probe.interval)
        self._probe_failure = fleet.probe.failure_rate
        self._catalogue: Catalogue = fleet.cloud.catalogue
        self._types: dict[str, InstanceType] = {t.name: t for t in fleet.cloud.instance_types}
        self._type_policy = fleet.cloud.instance_type_policy
        spec = policy.spec
        self._limits = Limits(
            max_nodes=spec.max_nodes,
            per_type_max={lim.instance_type: lim.max for lim in spec.instance_type_limits},
            max_hourly_spend=spec.max_hourly_spend,
            min_warm_nodes=spec.min_warm_nodes,
        )
        self._billing_period = to_us(fleet.cloud.billing.period)
        self._billing_minimum = to_us(fleet.cloud.billing.minimum)
        self.containers: list[_Container] = []
        self.queued: dict[str, _Container] = {}
        self.running: dict[str, _Container] = {}
        self.nodes: dict[str, Node] = {}
        self._shapes: dict[tuple[object, ...], list[Any]] = {}  # shape -> [resources, count]
        self._fits: dict[tuple[tuple[object, ...], str], bool] = {}
        self._slots: dict[str, set[int]] = {}
        self._round_pending = False
        self._kept_warm: frozenset[str] = frozenset()
        self._in_transition: set[str] = set()
        self._warm: set[str] = set()
        self._nodes_on = 0
        self._done = 0
        self._recordings: dict[str, Recording] = {}
        self._stepped: dict[str, NodeFacts] = {}
        self._cloud_rng = stream(seed, "cloud")

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
            if isinstance(node, DispatcherVm):
                life = end - node.launched
                self.ledger.on_interval(
                    node.launched,
                    end,
                    node.price,
                    billed_us(life, self._billing_period, self._billing_minimum),
                )
            elif node.powered and node.power_since is not None:
                self._bill_machine(node, end)
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

    def _bill_machine(self, node: MachineNode, end: int) -> None:
        assert node.power_since is not None
        billed = None
        if node.node_type == "CloudVM":
            billed = billed_us(end - node.power_since, self._billing_period, self._billing_minimum)
        self.ledger.on_interval(node.power_since, end, node.price, billed)

    def _sample(self) -> None:
        self.ledger.sample(self.now, self._nodes_on, len(self.queued))

    def _cause(self, node: Node, cause: str | None) -> None:
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
            entry = self._shapes.setdefault(c.shape, [c.spec.resources, 0])
            entry[1] += 1
        else:
            self._done += 1  # held: it can never start
        self._sample()
        self._request_round()

    def _dequeue(self, c: _Container) -> None:
        del self.queued[c.spec.uuid]
        if c.spec.priority > 0:
            self._shapes[c.shape][1] -= 1

    def _start(self, c: _Container, node: Node) -> None:
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
        self.running[c.spec.uuid] = c
        work = node.work
        if not work.running:
            work.busy_since = self.now
            self._cause(node, None)
        work.running.add(c.spec.uuid)
        work.change(self.now)
        if isinstance(node, DispatcherVm):
            node.idle_since = None
        self._touch(node)
        self._schedule(c.started + c.spec.runtime, self._finish, (c, c.token))
        self._sample()

    def _release(self, c: _Container) -> Node | None:
        """Take a running container off its node; returns the node if it became idle."""
        node = self.nodes.get(c.node or "")
        del self.running[c.spec.uuid]
        c.run_view = None
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

    def _requeue(self, node: Node) -> None:
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
                self._shapes[c.shape][1] += 1
        self._request_round()

    def _node_idle(self, node: Node) -> None:
        self._touch(node)
        self._cause(node, "idle, not yet evaluated")
        if isinstance(node, DispatcherVm):
            node.idle_since = self.now
            self._vm_check(node)
        else:
            # the next probe sees the node idle; the machine re-evaluates then
            self._schedule(self.now + self._probe, self._m_evaluate, node)

    # -- dispatcher round -----------------------------------------------------------------

    def _request_round(self) -> None:
        if not self._round_pending:
            self._round_pending = True
            self._schedule(self._next_tick(), self._round)

    def _round(self, _: Any) -> None:
        self._round_pending = False
        views = [c.queued_view for c in self.queued.values()]
        views += [c.run_view for c in self.running.values() if c.run_view is not None]
        nodes = [n.node_view(self.now) for n in self.nodes.values()]
        pending = sum(
            1 for n in self.nodes.values() if isinstance(n, DispatcherVm) and self.now < n.listed_at
        )
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
        kept = frozenset(result.kept_warm)
        left = sorted(self._kept_warm - kept)
        self._kept_warm = kept
        for name in left:
            node = self.nodes.get(name)
            if isinstance(node, DispatcherVm):
                self._vm_check(node)
        self._update_demand()
        self._sample()

    # -- qualified demand -----------------------------------------------------------------

    def _node_fits(self, shape: tuple[object, ...], resources: Any, node: MachineNode) -> bool:
        """Whether the scheduler would place a container of this shape on the node when
        it is idle and open: `plan()` on a one-container, one-node snapshot."""
        key = (shape, node.name)
        hit = self._fits.get(key)
        if hit is None:
            itype = self._types.get(node.instance_type or "")
            view = NodeView(
                name=node.name,
                state=NodeState.IDLE,
                capacity=node.capacity,
                instance_type=node.instance_type,
                price=node.price,
                admission_open=True,
                ready=True,
            )
            probe = ContainerView(
                uuid="demand-probe",
                phase=Phase.QUEUED,
                priority=1,
                first_seen=self.trace.start,
                resources=resources,
            )
            result = plan(
                [probe],
                [view],
                Catalogue(types=(itype,)) if itype is not None else Catalogue(),
                self._type_policy,
                Limits(),
                CloudState(creates_blocked="qualified-demand probe"),
                self.trace.start,
            )
            hit = bool(result.starts)
            self._fits[key] = hit
        return hit

    def _qualified(self, node: MachineNode) -> int:
        return sum(
            count
            for shape, (resources, count) in self._shapes.items()
            if count > 0 and self._node_fits(shape, resources, node)
        )

    def _demand_reading(self, node: MachineNode, queued: int) -> DemandReading:
        return DemandReading(
            source=f"simulator:containerdispatches?fits={node.name}",
            observed_at=self.at(self.now),
            queued=queued,
        )

    def _update_demand(self) -> None:
        for node in list(self.nodes.values()):
            if not isinstance(node, MachineNode):
                continue
            queued = self._qualified(node)
            positive = queued > 0
            if positive != node.demand_positive:
                node.demand_positive = positive
                event = NewDemand(reading=self._demand_reading(node, queued))
                self._schedule(self.now, self._m_deliver, (node, event))

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
        itype = self._types[type_name]
        slot = self._slot(type_name)
        name = f"vm-{type_name}-{slot}"
        if path_for("CloudVM", self.options.paths) == "machine":
            self._create_machine_vm(itype, slot, name)
            return
        cloud = self.fleet.cloud
        rng = stream(self.seed, "vm", name, str(self.ledger.cycles))
        listed = self.now + cloud.create_latency.sample(rng)
        failed = rng.random() < cloud.boot_failure_rate
        boot = cloud.boot.sample(rng)
        vm = DispatcherVm(
            name=name,
            instance_type=type_name,
            capacity=Capacity.of(itype),
            price=itype.price,
            slot=slot,
            launched=self.now,
            listed_at=listed,
            ready_at=None if failed else listed + boot,
            probe_phase=rng.randrange(self._probe),
        )
        self.nodes[name] = vm
        self._cause(vm, "booting / verifying")
        self.ledger.cycles += 1
        self._nodes_on += 1
        self._sample()
        if vm.ready_at is not None:
            paired = self._first_probe(name, vm.probe_phase, vm.ready_at)
            self._schedule(paired, self._vm_paired, vm)
        self._schedule(listed, self._vm_check_event, (vm, vm.check_token))

    def _vm_paired(self, vm: DispatcherVm) -> None:
        if vm.destroy_at is not None or self.nodes.get(vm.name) is not vm:
            return
        vm.paired_at = self.now
        self.ledger.boots.append((self.now - vm.launched) / _US)
        if not vm.work.running:
            vm.idle_since = self.now
        self._touch(vm)
        self._request_round()
        self._vm_check(vm)

    def _vm_check_event(self, arg: tuple[DispatcherVm, int]) -> None:
        vm, token = arg
        if token == vm.check_token:
            self._vm_check(vm)

    def _vm_check(self, vm: DispatcherVm) -> None:
        if vm.destroy_at is not None or self.nodes.get(vm.name) is not vm:
            return
        now = self.now
        heartbeat = None
        if vm.paired_at is not None:
            beat = self._last_probe(vm.name, vm.probe_phase, vm.paired_at)
            heartbeat = self.at(beat) if beat is not None else self.at(vm.paired_at)
        busy = bool(vm.work.running)
        attempts = max(0, (now - vm.listed_at) // self._probe + 1) if now >= vm.listed_at else 0
        query = VmQuery(
            facts=CloudWorkerFacts(
                paired=vm.paired_at is not None,
                scheduler_state=None,
                last_heartbeat=heartbeat,
                booted_at=self.at(vm.launched),
                idle_since=self.at(vm.idle_since)
                if vm.idle_since is not None and not busy
                else None,
            ),
            busy=busy,
            draining=vm.draining,
            idle_behavior="run",
            kept_warm=vm.name in self._kept_warm,
            probe_attempts=int(attempts),
        )
        verdict = decide_node(query, self.at(now), self.policy)
        key = (verdict.decision, verdict.reasons)
        if key != vm.last_key and verdict.reasons != ("ACTIVE_WORK",):
            for code in verdict.reasons:
                self.ledger.decisions[f"{verdict.decision} {code}"] += 1
        vm.last_key = key
        if not busy and vm.paired_at is not None:
            self._cause(vm, verdict.reasons[0] if verdict.reasons else "idle")
        if verdict.action == "destroy":
            self._destroy_vm(vm)
            return
        if verdict.action == "drain" and not vm.draining:
            vm.draining = True
            self._touch(vm)
            self._request_round()
        vm.check_token += 1
        if verdict.recheck_at is not None:
            at = max(self.us(verdict.recheck_at), now)
            at = math.ceil(at / self._tick) * self._tick
            self._schedule(at, self._vm_check_event, (vm, vm.check_token))

    def _destroy_vm(self, vm: DispatcherVm) -> None:
        vm.destroy_at = self.now
        vm.check_token += 1
        self._touch(vm)
        if vm.work.running:
            self._requeue(vm)
        self._cause(vm, "draining / shutting down")
        rng = stream(self.seed, "vm-shutdown", vm.name, str(vm.launched))
        self._schedule(self.now + self.fleet.cloud.shutdown.sample(rng), self._vm_gone, vm)
        self._request_round()

    def _vm_gone(self, vm: DispatcherVm) -> None:
        self._cause(vm, None)
        life = self.now - vm.launched
        self.ledger.on_interval(
            vm.launched,
            self.now,
            vm.price,
            billed_us(life, self._billing_period, self._billing_minimum),
        )
        self._remove(vm)

    def _remove(self, node: Node) -> None:
        del self.nodes[node.name]
        itype = node.instance_type or ""
        self._slots.get(itype, set()).discard(node.slot)
        self._in_transition.discard(node.name)
        self._warm.discard(node.name)
        if isinstance(node, DispatcherVm) or node.powered:
            self._nodes_on -= 1
        self._sample()
        self._request_round()

    # -- probes ---------------------------------------------------------------------------

    def _probe_failed(self, name: str, k: int) -> bool:
        if self._probe_failure <= 0:
            return False
        digest = zlib.crc32(f"{self.seed}/{name}/{k}".encode())
        return digest / 2**32 < self._probe_failure

    def _first_probe(self, name: str, phase: int, ready: int) -> int:
        """The first successful probe tick at or after `ready`."""
        k = math.ceil((ready - phase) / self._probe)
        while self._probe_failed(name, k):
            k += 1
        return phase + k * self._probe

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

    # -- fleet counts ---------------------------------------------------------------------

    def _touch(self, node: Node) -> None:
        if node.warm():
            self._warm.add(node.name)
        else:
            self._warm.discard(node.name)
        if isinstance(node, MachineNode) and node.transitioning():
            self._in_transition.add(node.name)
        else:
            self._in_transition.discard(node.name)

    # -- machine-path nodes ---------------------------------------------------------------

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
        self._machine_node(
            name, "SideNode", capacity, group.cost_per_hour, None, self._power_model(group), on
        )
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
        slot: int = 0,
    ) -> MachineNode:
        rng = stream(self.seed, "node", name)
        t0 = self.at(self.now)
        source = f"{model.source}:{name}"
        desired = "On" if self.policy.never_off and node_type == "SideNode" else "Auto"
        facts = NodeFacts(
            node=name,
            node_type=node_type,
            power=PowerReading(source=source, observed_at=t0, power="On" if powered else "Off"),
            capability=CapabilityReading(
                source=source,
                observed_at=t0,
                control_method=model.control_method,
                allowable=model.allowable,
            ),
            desired=DesiredReading(
                source=f"WorkerNode/{name}#spec", observed_at=t0, power=desired, idle_behavior="run"
            ),
            demand=DemandReading(
                source=f"simulator:containerdispatches?fits={name}", observed_at=t0, queued=0
            ),
            inhibitors=InhibitorReading(source=f"ssh:{name}/logind", observed_at=t0),
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
            ready_at=self.now if powered else None,
            slot=slot,
            probe_phase=rng.randrange(self._probe),
        )
        self.nodes[name] = node
        if powered:
            self._nodes_on += 1
            node.ever_on = node_type == "SideNode"
            self._cause(node, "booting / verifying")
        if name in self.options.record:
            self._recordings[name] = Recording(name, node.state, node.facts)
            self._stepped[name] = node.facts
        self._schedule(self.now, self._m_evaluate, node)
        return node

    def _create_machine_vm(self, itype: InstanceType, slot: int, name: str) -> None:
        cloud = self.fleet.cloud
        model = PowerModel(
            control_method="Cloud",
            allowable=("On", "GracefulShutdown"),
            source="cloud",
            latency=cloud.create_latency,
            drop_rate=0.0,
            error_rate=0.0,
            poll_interval=self._probe,
            boot=cloud.boot,
            shutdown=cloud.shutdown,
        )
        node = self._machine_node(
            name, "CloudVM", Capacity.of(itype), itype.price, itype.name, model, True, slot
        )
        node.ready_at = self.now + cloud.boot.sample(node.rng)
        self.ledger.cycles += 1
        self.ledger.boots.append((node.ready_at - self.now) / _US)
        self._sample()

    def _telemetry(self, node: MachineNode) -> None:
        """The shell's SSH-probe readings (work, inhibitors, uptime) as of the node's last
        successful probe, and the fleet counts."""
        facts = node.facts
        update: dict[str, Any] = {}
        if node.reachable(self.now) and node.ready_at is not None:
            tick = self._last_probe(node.name, node.probe_phase, node.ready_at)
            work = facts.work
            if tick is not None and (work is None or self.us(work.observed_at) < tick):
                update.update(self._probe_readings(node, tick))
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
        assert node.ready_at is not None and node.power_since is not None
        active, idle_since = node.work.at(tick, node.ready_at)
        when = self.at(tick)
        return {
            "work": WorkReading(
                source=f"ssh:{node.name}/runners",
                observed_at=when,
                active_jobs=active,
                idle_since=self.at(idle_since) if idle_since is not None else None,
            ),
            "inhibitors": InhibitorReading(source=f"ssh:{node.name}/logind", observed_at=when),
            "uptime": UptimeReading(
                source=f"ssh:{node.name}/proc/uptime",
                observed_at=when,
                on_since=self.at(node.power_since),
            ),
        }

    def _m_evaluate(self, node: MachineNode) -> None:
        self._m_deliver((node, Evaluate()))

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
        result = decide_node(
            MachineQuery(node.state, before, event), self.at(self.now), self.policy
        )
        node.state = result.next
        node.facts = result.facts
        if node.state.state in (PowerState.ON_IDLE, PowerState.ACTIVE):
            node.ever_on = True
        self._touch(node)
        key = (result.decision.value, tuple(r.value for r in result.reasons))
        if key != node.last_key:
            for code in key[1]:
                self.ledger.decisions[f"{key[0]} {code}"] += 1
            node.last_key = key
        recording = self._recordings.get(node.name)
        if recording is not None:
            self._record(node, recording, before, event, result.decision, key[1])
        self._execute(node, result.actions, result.decision)
        cause = self._machine_cause(node)
        if cause != node.idle_cause:
            self._cause(node, cause)
        if node.node_type == "CloudVM" and node.state.state is PowerState.OFF and node.ever_on:
            self._remove(node)

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
                    lag = node.model.latency.sample(node.rng)
                    node.poll_at = max(self.now, node.last_poll + node.model.poll_interval) + lag
                    self._schedule(node.poll_at, self._m_poll, node)
            elif isinstance(action, RunReadyProbe):
                if node.probe_at is None:
                    node.probe_at = max(self.now, node.last_probe + self._probe) + self._api
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
                self._budget_freed()
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

    def _budget_freed(self) -> None:
        """A transition ended: nodes held back by the disruption budget look again."""
        for other in self.nodes.values():
            if (
                isinstance(other, MachineNode)
                and other.last_key is not None
                and "DISRUPTION_BUDGET_EXHAUSTED" in other.last_key[1]
            ):
                self._schedule(self.now, self._m_evaluate, other)

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
        event = DemandReread(reading=self._demand_reading(node, self._qualified(node)))
        self._m_step(node, event)

    def _m_poll(self, node: MachineNode) -> None:
        node.poll_at = None
        node.last_poll = self.now
        if self.nodes.get(node.name) is not node:
            return
        reading = PowerReading(
            source=f"{node.model.source}:{node.name}#PowerState",
            observed_at=self.at(self.now),
            power="On" if node.powered else "Off",
        )
        self._m_step(node, PowerObserved(reading=reading))

    def _m_probe(self, node: MachineNode) -> None:
        node.probe_at = None
        node.last_probe = self.now
        if self.nodes.get(node.name) is not node:
            return
        reachable = node.reachable(self.now)
        if reachable:
            node.facts = node.facts.model_copy(update=self._probe_readings(node, self.now))
        reading = ReadyReading(
            source=f"ssh:{node.name}/ready-probe",
            observed_at=self.at(self.now),
            passed=reachable,
            detail="ready" if reachable else "no answer",
        )
        self._m_step(node, ReadyProbeResult(reading=reading))

    def _m_refresh(self, node: MachineNode) -> None:
        node.refresh_at = None
        node.last_refresh = self.now
        if self.nodes.get(node.name) is not node:
            return
        if node.reachable(self.now):
            node.facts = node.facts.model_copy(update=self._probe_readings(node, self.now))
        self._m_step(node, Evaluate())

    def _m_request(self, node: MachineNode, action: RequestPower) -> None:
        model = node.model
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
            self._cause(node, "booting / verifying")
            boot = node.model.boot.sample(node.rng)
            node.ready_at = self.now + boot
            self.ledger.cycles += 1
            self.ledger.boots.append(boot / _US)
            self._nodes_on += 1
            self._sample()
            return
        if not node.powered:
            return
        node.ready_at = None  # shutting down: SSH is gone
        delay = 0 if action == "ForceOff" else node.model.shutdown.sample(node.rng)
        self._schedule(self.now + delay, self._m_off, (node, token))

    def _m_off(self, arg: tuple[MachineNode, int]) -> None:
        node, token = arg
        if token != node.power_change or not node.powered:
            return
        if node.work.running:
            self._requeue(node)
        self._cause(node, None)
        self._bill_machine(node, self.now)
        node.powered = False
        node.power_since = None
        self._nodes_on -= 1
        self._sample()


def _shape(spec: TraceContainer) -> tuple[object, ...]:
    r = spec.resources
    return (r.vcpus, r.ram, r.scratch, r.gpus, r.gpu_model, r.preemptible)
