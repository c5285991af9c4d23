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
   (`rules.demand`, called from `simulate.dispatching`): for a side node that is off or
   waking, the containers the plan waits on it for (the plan decides which node to
   wake); for any other node, the queued containers it qualifies for
   (`scheduler.qualified_demand`). A change of the count is fed to the machine as
   Evaluate, as the live shell does (`rules.demand.demand_event`); the reading itself is
   as fresh as the operator's, whose dispatcher plans every tick.
3. Every node decision goes through `nodewarden.simulate.decide.decide_node`, i.e. the
   real state machine, with the events the operator's shell feeds it (Evaluate,
   DeadlineReached, AdmissionClosed, DemandReread, request outcomes,
   PowerObserved, ReadyProbeResult); the actions it returns are carried out against the
   simulated hardware:
   * side nodes: a BMC answering after a latency, sometimes dropping an accepted request
     or answering with an error; boot and shutdown delays; PowerState read every
     `bmc.pollInterval` (a change is observed at the next read) and when the machine asks;
   * cloud VMs: the cloud's instance list, read every `cloud.listInterval`, is the trusted
     power source (listed = On, destroyed = PoweringOff, no longer listed = Off); the
     shutdown request is a destroy through the cloud API; the node-manager facts
     (`VmReading`: launch time, paired, last heartbeat, probe attempts) come from the
     list and the probes, through the live rule (`rules.vm.vm_reading`); the WorkerNode
     goes once Off is observed;
   * SSH probes: every `probe.bootInterval` while a node boots (its first success pairs a
     VM and delivers the passing ReadyProbeResult), then every `probe.interval`, some
     failing; readings (work, and on side nodes inhibitors and uptime) are stamped with
     the probe's own time. A probe that gets no answer delivers no probe result.
4. The run stops once every container has finished (or can never run) and the trace is
   over, or `SimOptions.max_overrun` after the trace's end; nodes still on are billed up
   to that moment.

The rooms: `simulate.dispatching` (containers, rounds, demand), `simulate.steps` (machine
steps and their effects), `simulate.sensing` (what the shell knows before a step), this
module (the clock, the event queue, cloud VMs and side nodes coming and going).

Randomness comes from streams seeded by (seed, node, purpose), so a side node sees the
same draws whatever policy is simulated, and the same seed gives the same result.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from nodewarden.api.powerpolicy import zone_of
from nodewarden.api.workernode import NodeType
from nodewarden.policy.facts import (
    DemandReading,
    NodeFacts,
    UptimeReading,
)
from nodewarden.policy.state import NodePowerState, PowerState
from nodewarden.rules.energy import local_midnight
from nodewarden.rules.fleet import in_budget, warm_idle
from nodewarden.rules.inforce import UNCLASSED, in_force, member
from nodewarden.rules.readings import cloud_capability
from nodewarden.scheduling.instancetypes import Catalogue, InstanceType
from nodewarden.scheduling.views import Capacity, ContainerView, Limits, NodeView, Phase, Plan
from nodewarden.simulate.accounting import Ledger, billed_us
from nodewarden.simulate.consolidation import SimConsolidation
from nodewarden.simulate.dispatching import Dispatching, SimContainer, container_shape
from nodewarden.simulate.distributions import Delay, stream, to_us
from nodewarden.simulate.energy import EnergyLedger
from nodewarden.simulate.fleet import Fleet, SideNodeGroup, side_capacity_bytes
from nodewarden.simulate.nodes import (
    GpuRule,
    MachineNode,
    PowerModel,
    initial_facts,
    side_power_model,
)
from nodewarden.simulate.policies import SimPolicy
from nodewarden.simulate.results import Recording, RunResult, SimOptions
from nodewarden.simulate.sensing import Sensing
from nodewarden.simulate.steps import PROGRESS, Machines
from nodewarden.simulate.trace import Trace
from nodewarden.simulate.warmth import SimWarmth

_US = 1_000_000
_ONE_US = timedelta(microseconds=1)


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
        self.energy = EnergyLedger(fleet.side_nodes)
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
        self.containers: list[SimContainer] = []
        self.nodes: dict[str, MachineNode] = {}
        self._slots: dict[str, set[int]] = {}
        self._in_transition: set[str] = set()
        self._warm: set[str] = set()
        self._nodes_on = 0
        self._done = 0
        self.sensing = Sensing(
            trace.start,
            seed,
            probe=self._probe,
            boot_probe=self._boot_probe,
            probe_failure=self._probe_failure,
            list_interval=self._list,
            tick=self._tick,
            resync=self._resync,
        )
        self._recordings: dict[str, Recording] = {}
        self._stepped: dict[str, NodeFacts] = {}
        self.machines = Machines(self)
        self.dispatching = Dispatching(self)
        self.warmth = SimWarmth(self, policy.spec, policy.forecast)
        """The warm-capacity levers (windows, forecast wake; `simulate.warmth`)."""
        self.consolidation = SimConsolidation(
            self,
            policy.spec.consolidation,
            lambda: [self.dispatching.node_view(n) for n in self.nodes.values()],
            self.dispatching.held,
            self.dispatching.rules,
            self._qualified,
            self.dispatching.only_here,
        )
        """Consolidation by drain (`simulate.consolidation`, `rules.consolidation`)."""

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
            c = SimContainer(
                spec=spec,
                queued_view=ContainerView(
                    uuid=spec.uuid,
                    phase=Phase.QUEUED,
                    priority=spec.priority,
                    first_seen=self.at(spec.arrival),
                    resources=spec.resources,
                ),
                shape=container_shape(spec),
            )
            self.containers.append(c)
            self._schedule(spec.arrival, self.dispatching.arrive, c)
        for group in self.fleet.side_nodes:
            for name in group.names():
                self._add_side_node(group, name)
        if self.warmth.active:
            self.warmth.start()
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
                self.energy.busy_interval(node, node.work.busy_since, end)
        for c in self.containers:
            if c.started is None:
                self.ledger.not_run += 1
            elif c.finished is None:
                self.ledger.unfinished += 1
        return RunResult(
            policy=self.policy,
            figures={
                **self.ledger.figures(),
                **self.energy.figures(end),
                "inForce": self._in_force(end),
                "savedTodayByClass": self._saved_today_by_class(end),
            },
            series=tuple(self.ledger.series),
            recordings=self._recordings,
            end=end,
        )

    def _in_force(self, end: int) -> dict[str, Any]:
        """The policy in force at the end of the run, as PowerPolicy `status.inForce`
        shows it (`rules.inforce`, the live controller's code)."""
        h = self.warmth.histogram
        members = [
            member(self.warmth.node_class(n), n.node_type, n.state) for n in self.nodes.values()
        ]
        days = h.days_observed if h is not None else None
        draining = len(self.consolidation.draining)
        return in_force(self.policy.spec, members, self.at(end), days, draining).status

    def _saved_today_by_class(self, end: int) -> list[dict[str, Any]]:
        """Per node class, its side nodes' saving since local midnight (the policy's time
        zone) before the run's end -- PowerPolicy status.energy.classes' figures."""
        spec = self.policy.spec
        midnight = local_midnight(self.at(end), zone_of(spec.time_zone))
        since = max(0, self.us(midnight))
        nodes = self.nodes

        def class_of(name: str) -> str | None:
            node = nodes.get(name)
            return self.warmth.node_class(node) if node is not None else None

        names = [c.name for c in spec.node_classes]
        return self.energy.saved_by_class(since, end, class_of, names, UNCLASSED)

    def _bill(self, node: MachineNode, end: int) -> None:
        """Charge a node's time on: a VM from launch to termination under the cloud's
        billing, a side node its cost per hour from power-on to off."""
        assert node.power_since is not None
        billed = None
        if node.node_type == "CloudVM":
            billed = billed_us(end - node.power_since, self._billing_period, self._billing_minimum)
        self.ledger.on_interval(node.power_since, end, node.price, billed)
        self.energy.on_interval(node, node.power_since, end)

    def _sample(self) -> None:
        self.ledger.sample(self.now, self._nodes_on, len(self.dispatching.queued))

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
        held = [r for r in node.state.last_reasons if r not in PROGRESS]
        return held[0].value if held else "idle, not yet evaluated"

    # -- what the machines' side asks of the dispatcher ----------------------------------

    def _request_round(self) -> None:
        self.dispatching.request_round()

    def _requeue(self, node: MachineNode) -> None:
        self.dispatching.requeue(node)

    def _qualified(self, node: MachineNode) -> int:
        return self.dispatching.qualified(node)

    def _demand_reading(self, node: MachineNode, queued: int, source: str) -> DemandReading:
        return self.dispatching.demand_reading(node, queued, source)

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
            self._schedule(first, self.machines.first_success, (node, node.power_change))
        view = self.policy.view
        for after in sorted({view.boot_grace, view.lame_after}):
            # the unpaired and lame rules fire on the first probe after these ages
            self._schedule(self.now + after // _ONE_US + self._boot_probe, self._vm_grace, node)
        self._sample()

    def _vm_grace(self, node: MachineNode) -> None:
        if node.seen_ready_at is None:  # still unpaired: the lame / unpaired rules may fire
            self.machines.evaluate(node)

    def _next_list(self, t: int) -> int:
        """The first listing of the cloud at or after t (every cloud.listInterval)."""
        return math.ceil(t / self._list) * self._list

    def _vm_listed(self, node: MachineNode) -> None:
        """The instance appears in the cloud list: observed power, launch time, the
        destroy capability (`PowerController.listed` and `rules.vm`)."""
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
            update["capability"] = cloud_capability("cloud", when)
        node.facts = node.facts.model_copy(update=update)
        self.machines.observe(node)

    def _remove(self, node: MachineNode) -> None:
        del self.nodes[node.name]
        itype = node.instance_type or ""
        self._slots.get(itype, set()).discard(node.slot)
        self._in_transition.discard(node.name)
        self._warm.discard(node.name)
        if self.warmth.active:
            self.warmth.forget(node)
        if node.powered:
            self._nodes_on -= 1
        self._sample()
        self.dispatching.request_round()

    # -- fleet counts ---------------------------------------------------------------------

    def _touch(self, node: MachineNode) -> None:
        if warm_idle(node.state):
            if node.name not in self._warm:
                self._warm.add(node.name)
                self._look_again("MIN_WARM_NODES")
        else:
            self._warm.discard(node.name)
        if in_budget(node.node_type, node.state):
            self._in_transition.add(node.name)
        else:
            self._in_transition.discard(node.name)
        if self.warmth.active:
            self.warmth.touch(node)
        if self.consolidation.active:
            self.consolidation.touched(node)

    # -- warm capacity (simulate.warmth) --------------------------------------------------

    def _evaluate(self, node: MachineNode) -> None:
        self.machines.evaluate(node)

    def _warm_reading(self, node: MachineNode) -> None:
        """The node's fleet reading with its class's warm counts and target."""
        if not self.warmth.active:
            return
        reading = self.warmth.reading(node)
        if reading is not None:
            node.facts = node.facts.model_copy(update={"fleet": reading})

    def _warm_creates(
        self, nodes: list[NodeView] | None, plan: Plan | None, room: int | None
    ) -> None:
        """The cloud VMs the warm levers want created after a dispatcher round (`room`
        None: the round's room is counted here)."""
        if not self.warmth.active or not self.warmth.wants_vms():
            return
        if room is None:
            room = self.dispatching.room()
        if room <= 0:
            return
        if nodes is None:
            nodes = [n.node_view(self.now) for n in self.nodes.values()]
        wanted = [t for t in self.warmth.creates(nodes, plan or Plan()) if t in self._types]
        for itype in wanted[:room]:
            self._create_vm(itype)

    def _look_again(self, code: str) -> None:
        """Nodes a fleet count held back (`code`) look again: the count changed."""
        for other in self.nodes.values():
            if other.last_key is not None and code in other.last_key[1]:
                self._schedule(self.now, self.machines.evaluate, other)

    # -- nodes ----------------------------------------------------------------------------

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
            name, "SideNode", capacity, group.cost_per_hour, None, side_power_model(group), on, rng
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
        facts = initial_facts(name, node_type, model, powered, t0, self.policy.never_off)
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
        node.demand = facts.demand
        if capacity.gpus > 0:
            view = self.policy.view
            node.gpu_rule = GpuRule(
                self.trace.start, view.idle_threshold, view.telemetry_max_age, view.gpu_only
            )
        self.nodes[name] = node
        if powered:
            self._nodes_on += 1
            self._cause(node, "booting / verifying")
        if name in self.options.record and name not in self._recordings:
            self._recordings[name] = Recording(name, node.state, node.facts)
            self._stepped[name] = node.facts
        self._schedule(self.now, self.machines.evaluate, node)
        return node
