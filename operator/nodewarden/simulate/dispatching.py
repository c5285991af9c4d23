"""The simulated dispatcher: containers arriving, starting, finishing and requeued, the
dispatcher round and the queued demand per node it hands the power side.

A round (at most one per `controller.tickInterval`, only when something changed) calls
the scheduler's `plan()` with the capacity ledger of the operator's dispatcher
(`scheduling.ledger.account`) and every node's `NodeView`, then carries the plan out:
starts (the container runs for its run time after the runner's start latency), creates
(a cloud VM), and unsatisfiable containers (never run). Queued demand per node is the
live rule (`rules.demand`): for a node that is Off or waking, the containers the plan
waits on it for (`plan_waits`); for any other node, the queued containers it qualifies
for (`scheduler.qualified_demand`, memoised per container shape); a change of the count
is fed to the node as the live shell feeds it (`demand_event`: Evaluate). What it needs
of the simulation it asks through `World`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from nodewarden.policy.events import Event
from nodewarden.policy.facts import DemandReading
from nodewarden.rules.boots import BootTimes
from nodewarden.rules.consolidation import only_here
from nodewarden.rules.demand import PLANNED, demand_event, idle_view, plan_waits, waits_on_plan
from nodewarden.scheduling import ledger as capacity
from nodewarden.scheduling.instancetypes import (
    Catalogue,
    InstanceTypePolicy,
    Requirements,
    effective_requirements,
)
from nodewarden.scheduling.placement import PlacementRules
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
from nodewarden.simulate.accounting import Ledger
from nodewarden.simulate.consolidation import SimConsolidation
from nodewarden.simulate.energy import EnergyLedger
from nodewarden.simulate.fleet import Fleet
from nodewarden.simulate.nodes import MachineNode
from nodewarden.simulate.policies import SimPolicy
from nodewarden.simulate.sensing import Sensing
from nodewarden.simulate.trace import Trace, TraceContainer
from nodewarden.simulate.utilisation import dominant_share, weighted_work

_US = 1_000_000


@dataclass(slots=True)
class SimContainer:
    """One container of the trace, queued, running or done."""

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
    instance: str | None = None
    """The node instance it last started on (a VM: name@launch; a side node: its name)."""


class Steps(Protocol):
    """The machines' side as the dispatcher calls it."""

    def evaluate(self, node: MachineNode) -> None: ...
    def deliver(self, arg: tuple[MachineNode, Event]) -> None: ...


class World(Protocol):
    """What the dispatcher asks of the simulation (`Simulation` implements it)."""

    now: int
    ledger: Ledger
    energy: EnergyLedger
    nodes: dict[str, MachineNode]
    fleet: Fleet
    trace: Trace
    sensing: Sensing
    _done: int
    policy: SimPolicy
    _catalogue: Catalogue
    _type_policy: InstanceTypePolicy
    _limits: Limits
    _start_latency: int
    consolidation: SimConsolidation

    @property
    def machines(self) -> Steps: ...

    def at(self, us: int) -> datetime: ...
    def us(self, when: datetime) -> int: ...
    def _schedule(self, t: int, fn: Callable[[Any], None], arg: Any = None) -> None: ...
    def _next_tick(self) -> int: ...
    def _cause(self, node: MachineNode, cause: str | None) -> None: ...
    def _touch(self, node: MachineNode) -> None: ...
    def _sample(self) -> None: ...
    def _create_vm(self, type_name: str) -> None: ...
    def _warm_creates(
        self, nodes: list[NodeView] | None, plan: Plan | None, room: int | None
    ) -> None: ...


class Dispatching:
    """The dispatcher's queue, rounds and planned demand (see the module docstring)."""

    def __init__(self, world: World) -> None:
        self.w = world
        self.queued: dict[str, SimContainer] = {}
        self.running: dict[str, SimContainer] = {}
        self.shapes: dict[tuple[object, ...], list[Any]] = {}  # shape -> [resources, count]
        self.qualifies: dict[tuple[tuple[object, ...], str], bool] = {}
        self.needs: dict[tuple[object, ...], Requirements] = {}
        self.round_pending = False
        self.rules = PlacementRules.of(world.policy.spec.placement)
        """The placement levers of the policy under test (the live dispatcher reads its
        default policy's)."""
        self.boots = BootTimes()
        self.due_at: int | None = None
        self.side: tuple[Capacity, ...] | None = None
        """The fleet's side-node capacities (the GPU rule reads them)."""

    # -- containers -----------------------------------------------------------------------

    def arrive(self, c: SimContainer) -> None:
        self.queued[c.spec.uuid] = c
        if c.spec.priority > 0:
            self.count_shape(c, 1)
        else:
            self.w._done += 1  # held: it can never start
        self.w._sample()
        self.request_round()

    def count_shape(self, c: SimContainer, delta: int) -> None:
        entry = self.shapes.setdefault(c.shape, [c.spec.resources, 0])
        entry[1] += delta
        if entry[1] <= 0:
            del self.shapes[c.shape]

    def dequeue(self, c: SimContainer) -> None:
        del self.queued[c.spec.uuid]
        if c.spec.priority > 0:
            self.count_shape(c, -1)

    def start(self, c: SimContainer, node: MachineNode) -> None:
        self.dequeue(c)
        c.node = node.name
        c.started = self.w.now + self.w._start_latency
        vm = node.node_type == "CloudVM"
        c.instance = f"{node.name}@{node.power_since}" if vm else node.name
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
            work.busy_since = self.w.now
            self.w._cause(node, None)
        work.running.add(c.spec.uuid)
        work.change(self.w.now)
        if c.spec.resources.gpus > 0:
            work.gpu_running.add(c.spec.uuid)
            work.gpu_change(self.w.now)
        self.w._touch(node)
        self.w.consolidation.work_changed(node)
        self.w._schedule(c.started + c.spec.runtime, self.finish, (c, c.token))
        self.w._sample()

    def release(self, c: SimContainer) -> MachineNode | None:
        """Take a running container off its node; returns the node if it became idle."""
        node = self.w.nodes.get(c.node or "")
        del self.running[c.spec.uuid]
        c.run_view = None
        c.placement = None
        if node is None:
            return None
        work = node.work
        work.running.discard(c.spec.uuid)
        work.change(self.w.now)
        if c.spec.uuid in work.gpu_running:
            work.gpu_running.discard(c.spec.uuid)
            work.gpu_change(self.w.now)
        self.w.consolidation.work_changed(node)
        if work.running:
            return None
        if work.busy_since is not None:
            self.w.ledger.busy_interval(work.busy_since, self.w.now, node.price)
            self.w.energy.busy_interval(node, work.busy_since, self.w.now)
            work.busy_since = None
        return node

    def finish(self, arg: tuple[SimContainer, int]) -> None:
        c, token = arg
        if token != c.token or c.done:
            return
        c.finished = self.w.now
        c.done = True
        self.w._done += 1
        assert c.started is not None
        self.w.ledger.waits.append((c.started - c.spec.arrival) / _US)
        self.count_work(c)
        idle = self.release(c)
        if idle is not None:
            self.node_idle(idle)
        self.w._sample()
        self.request_round()

    def count_work(self, c: SimContainer) -> None:
        """The finished container's price-weighted work (`simulate.utilisation`)."""
        node = self.w.nodes.get(c.node or "")
        if node is None:
            return
        need = self.needs.get(c.shape)
        if need is None:
            need = self.needs[c.shape] = effective_requirements(
                c.spec.resources, self.w._type_policy
            )
        share = dominant_share(need, node.capacity)
        self.w.ledger.useful += weighted_work(c.spec.runtime, share, node.price)

    def requeue(self, node: MachineNode) -> None:
        """The node went away under running containers: they go back to the queue."""
        for uuid in sorted(node.work.running):
            c = self.running[uuid]
            self.release(c)
            c.token += 1
            c.node = None
            c.started = None
            self.w.ledger.requeued += 1
            self.queued[uuid] = c
            if c.spec.priority > 0:
                self.count_shape(c, 1)
        self.request_round()

    def node_idle(self, node: MachineNode) -> None:
        self.w._touch(node)
        self.w._cause(node, "idle, not yet evaluated")
        # the next probe sees the node idle; the machine re-evaluates then
        self.w._schedule(
            self.w.sensing.next_probe(node, self.w.now), self.w.machines.evaluate, node
        )

    def held(self) -> list[ContainerView]:
        """The running containers as the capacity ledger holds them (consolidation's
        placement query reads them)."""
        return [c.run_view for c in self.running.values() if c.run_view is not None]

    # -- dispatcher round -----------------------------------------------------------------

    def request_round(self) -> None:
        if not self.round_pending:
            self.round_pending = True
            self.w._schedule(self.w._next_tick(), self.round)

    def round_at(self, t: int) -> None:
        """A round at `t` (the plan's due time: a wait budget running out), the way the
        live dispatcher plans at a due time; one timer, the earliest."""
        if self.due_at is not None and self.w.now <= self.due_at <= t:
            return
        self.due_at = t
        self.w._schedule(t, self._due_round, t)

    def _due_round(self, t: int) -> None:
        if self.due_at == t:
            self.due_at = None
            self.request_round()

    def node_view(self, node: MachineNode) -> NodeView:
        """A node's view as the live dispatcher builds it (`MachineNode.node_view`): a VM
        since its launch, a side node with its boot time as seen (`rules.boots`)."""
        if node.instance_type is not None:
            launched = node.power_since
            created = self.w.at(launched) if launched is not None else None
            return node.node_view(self.w.now, created_at=created)
        view = self.w.policy.view
        return node.node_view(
            self.w.now,
            boot=self.boots.estimate(node.name),
            wake_timing=(view.min_off, view.cooldown),
        )

    def round(self, _: Any) -> None:
        self.round_pending = False
        now = self.w.at(self.w.now)
        if not self.shapes:
            # nothing startable is queued: the plan would start and create nothing, and
            # every node's demand is zero; the nodes coming up are still timed
            known = self.w.nodes
            coming = (known.get(name) for name in self.boots.tracking())
            self.boots.watch([self.node_view(n) for n in coming if n is not None], now)
            self.update_demand(None)
            self.w._warm_creates(None, None, None)
            return
        nodes = [self.node_view(n) for n in self.w.nodes.values()]
        self.boots.watch(nodes, now)  # as the live planner does at every plan
        placed = [c.placement for c in self.running.values() if c.placement is not None]
        queued = [c.queued_view for c in self.queued.values()]
        # simulated runners are exactly the running containers: no runner lists to read
        views = capacity.account(placed, queued, {}, _no_listed_runner).views
        pending = sum(1 for v in nodes if v.state is NodeState.PENDING)
        room = self.w.fleet.cloud.max_new_nodes_per_round - pending
        cloud = CloudState(max_new_nodes=max(0, room), boot_seconds=self.boots.types())
        if not self.w._catalogue.types:
            cloud = CloudState(creates_blocked="no cloud instance types in the fleet")
        result = plan(
            views,
            nodes,
            self.w._catalogue,
            self.w._type_policy,
            self.w._limits,
            cloud,
            now,
            self.rules,
        )
        if result.due is not None:
            self.round_at(self.w.us(result.due))
        for start in result.starts:
            c = self.queued.get(start.uuid)
            node = self.w.nodes.get(start.node)
            if c is not None and node is not None:
                self.start(c, node)
        for create in result.creates:
            self.w._create_vm(create.instance_type)
        self.w._warm_creates(nodes, result, room - len(result.creates))
        for uuid in result.unsatisfiable:
            c = self.queued.get(uuid)
            if c is not None and not c.done:
                self.dequeue(c)
                c.done = True
                self.w._done += 1
                self.w.ledger.failed_unsatisfiable += 1
        self.update_demand(result)
        self.w._sample()

    def room(self) -> int:
        """Creates the cloud may still start this round (`maxNewNodesPerRound`)."""
        pending = sum(
            1 for n in self.w.nodes.values() if n.node_view(self.w.now).state is NodeState.PENDING
        )
        return self.w.fleet.cloud.max_new_nodes_per_round - pending

    # -- queued demand --------------------------------------------------------------------

    def only_here(self, node: MachineNode) -> int:
        """Queued containers the node qualifies for that nothing else could ever run
        (`rules.consolidation.only_here`: no instance type, no other side node)."""
        if self.qualified(node) == 0:
            return 0
        kind = node.instance_type or node.name
        others = tuple(
            {
                n.capacity: None
                for n in self.w.nodes.values()
                if n.instance_type is None and n is not node
            }
        )
        total = 0
        for shape, (resources, count) in self.shapes.items():
            if self.qualifies.get((shape, kind)) and only_here(
                [resources], others, self.w._catalogue, self.w._type_policy
            ):
                total += count
        return total

    def qualified(self, node: MachineNode) -> int:
        """Queued containers the node qualifies for (`scheduler.qualified_demand` on the
        node as an idle node of its shape, memoised per container shape)."""
        view = idle_view(node.name, node.capacity, node.instance_type, node.price)
        kind = node.instance_type or node.name
        total = 0
        for shape, (resources, count) in self.shapes.items():
            key = (shape, kind)
            hit = self.qualifies.get(key)
            if hit is None:
                probe = ContainerView(
                    "demand-probe", Phase.QUEUED, 1, self.w.trace.start, resources
                )
                if self.side is None:
                    self.side = tuple(
                        {n.capacity: None for n in self.w.nodes.values() if n.instance_type is None}
                    )
                hit = bool(
                    qualified_demand(
                        view, [probe], self.w._catalogue, self.w._type_policy, self.rules, self.side
                    )
                )
                self.qualifies[key] = hit
            if hit:
                total += count
        return total

    def demand_reading(self, node: MachineNode, queued: int, source: str) -> DemandReading:
        return DemandReading(source=source, observed_at=self.w.at(self.w.now), queued=queued)

    def update_demand(self, result: Plan | None) -> None:
        """The operator's planned demand after a round (`rules.demand.planned_demand`);
        `result` None: nothing is queued."""
        waiting = plan_waits(result) if result is not None else {}
        by_kind: dict[str, int] = {}
        for node in list(self.w.nodes.values()):
            if result is None:
                queued = 0
            elif waits_on_plan(node.state.state):
                queued = len(waiting.get(node.name, ()))
            else:
                kind = node.instance_type or node.name
                known = by_kind.get(kind)
                queued = by_kind[kind] = self.qualified(node) if known is None else known
            previous = node.demand
            reading = self.demand_reading(node, queued, PLANNED)
            node.demand_queued = queued
            node.demand = reading
            event = demand_event(previous, reading)
            if event is not None:
                self.w._schedule(self.w.now, self.w.machines.deliver, (node, event))


def _no_listed_runner(uuid: str) -> None:
    return None


def container_shape(spec: TraceContainer) -> tuple[object, ...]:
    r = spec.resources
    return (r.vcpus, r.ram, r.scratch, r.gpus, r.gpu_model, r.preemptible)
