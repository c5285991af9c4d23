"""The world the peers act on: the simulated fleet, its physics and the bookkeeping.

Peers (Arvados, Karpenter, cluster-autoscaler, SLURM) are not nodewarden: they run
neither its state machine nor its scheduler nor its probes. Each is modelled from its own
documentation in a module of this package (`Peer`: its controller loop); this module is
what they act on, priced and timed like nodewarden's own rows (`simulate.engine`) with
the same fleet file and the same figures (`simulate.accounting.Ledger`):

* kinds (`Kind`): every VM instance type (any number of nodes) and every side-node group
  (its `count` members), with capacity and price. A GPU kind takes GPU work only (a GPU
  node pool is tainted, a GPU partition separate);
* VMs: billed from the create call to termination under the fleet's billing; ready after
  the create latency and the boot delay (never, for the fleet's boot-failure share);
  off after the shutdown delay;
* side nodes: a power request answered after the BMC latency, dropped or errored as the
  fleet says. A peer that observes power (`Peer.observes_power`) re-sends a request that
  did not take at the next power poll; one that assumes the power state from its
  program's exit (SLURM) never learns: a dropped power-off leaves the node on and billed;
* containers: queued at arrival; started on a ready node after the runner's start
  latency, holding their effective requirements (`effective_requirements`, as the
  scheduler counts them) until they end. A container planned onto a node that is still
  booting (`assign`) holds its room there and starts when the node is ready. An evicted
  container goes back to the queue and runs again from the start: its wasted run is
  billed on the node it ran on and its wait counts from its arrival to the start of the
  run that finished.

Randomness comes from streams seeded by (seed, node, purpose); one seed gives one result.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol

from nodewarden.scheduling.instancetypes import Requirements, effective_requirements
from nodewarden.scheduling.views import Capacity
from nodewarden.simulate.accounting import Ledger, billed_us
from nodewarden.simulate.distributions import Delay, stream, to_us
from nodewarden.simulate.fleet import Fleet, SideNodeGroup, side_capacity_bytes
from nodewarden.simulate.trace import Trace, TraceContainer
from nodewarden.simulate.utilisation import dominant_share, weighted_work

_US = 1_000_000


@dataclass(frozen=True, slots=True, eq=False)
class Kind:
    """A kind of node: a VM instance type, or a side-node group and its members."""

    name: str
    capacity: Capacity
    price: float
    vm: bool
    members: tuple[str, ...] = ()
    group: SideNodeGroup | None = None

    def fits(self, need: Requirements) -> bool:
        """The container fits an empty node of this kind (GPU kinds: GPU work only)."""
        cap = self.capacity
        return (
            need.vcpus <= cap.vcpus
            and need.ram <= cap.ram
            and need.scratch <= cap.scratch
            and need.gpus <= cap.gpus
            and need.preemptible == cap.preemptible
            and (need.gpus == 0 or not need.gpu_model or need.gpu_model == cap.gpu_model)
            and (need.gpus > 0) == (cap.gpus > 0)
        )


def fleet_kinds(fleet: Fleet) -> list[Kind]:
    """The fleet's kinds, cheapest first (then name)."""
    out = [Kind(t.name, Capacity.of(t), t.price, vm=True) for t in fleet.cloud.instance_types]
    for group in fleet.side_nodes:
        ram, scratch = side_capacity_bytes(group.capacity)
        cap = Capacity(
            group.capacity.vcpus, ram, scratch, group.capacity.gpus, group.capacity.gpu_model
        )
        out.append(Kind(group.name, cap, group.cost_per_hour, False, tuple(group.names()), group))
    return sorted(out, key=lambda k: (k.price, k.name))


class Phase(Enum):
    """What the peer knows of a node."""

    OFF = "off"
    BOOTING = "booting"
    READY = "ready"
    STOPPING = "stopping"


@dataclass(slots=True, eq=False)
class PContainer:
    """One container of the trace as the peers see it."""

    spec: TraceContainer
    need: Requirements
    node: PNode | None = None
    """The node it runs on, or (while queued) the node it is planned onto."""
    started: int | None = None
    instance: str = ""
    """The node instance it last started on (a VM: name@launch time; a side node)."""
    running: bool = False
    done: bool = False
    token: int = 0

    @property
    def uuid(self) -> str:
        return self.spec.uuid


@dataclass(slots=True, eq=False)
class PNode:
    """One node: what the peer knows (phase) and what is physically true (powered)."""

    name: str
    kind: Kind
    slot: int
    rng: random.Random
    phase: Phase = Phase.OFF
    powered: bool = False
    power_since: int | None = None
    launched_at: int = 0
    ready_at: int | None = None
    token: int = 0
    free: list[int] = field(default_factory=list)
    running: dict[str, PContainer] = field(default_factory=dict)
    planned: dict[str, PContainer] = field(default_factory=dict)
    """Queued containers planned onto it while it boots (their room is held)."""
    last_event: int = 0
    """When a container last started on it or left it."""
    idle_since: int | None = None
    cordoned: bool = False
    down: bool = False
    busy_since: int | None = None
    idle_cause: str | None = None
    idle_cause_since: int = 0

    def fits(self, need: Requirements) -> bool:
        return self.kind.fits(need) and self.has_room(need)

    def has_room(self, need: Requirements) -> bool:
        free = self.free
        return (
            need.vcpus <= free[0]
            and need.ram <= free[1]
            and need.scratch <= free[2]
            and need.gpus <= free[3]
        )

    def take(self, need: Requirements, sign: int = 1) -> None:
        free = self.free
        free[0] -= sign * need.vcpus
        free[1] -= sign * need.ram
        free[2] -= sign * need.scratch
        free[3] -= sign * need.gpus

    @property
    def empty(self) -> bool:
        return not self.running and not self.planned

    def usage(self) -> tuple[float, float, float]:
        """Reserved share of (vCPUs, RAM, GPUs)."""
        cap = self.kind.capacity
        return (
            1 - self.free[0] / cap.vcpus,
            1 - self.free[1] / cap.ram,
            1 - self.free[3] / cap.gpus if cap.gpus else 0.0,
        )


class Peer(Protocol):
    """A peer's controller: one loop the world runs whenever something changed."""

    name: str
    placement: str
    """Whose placement the row uses (the table's PLACEMENT column)."""
    observes_power: bool

    def round(self, world: PeerWorld) -> None: ...


@dataclass(frozen=True, slots=True)
class PeerRun:
    """What one peer run gives back (figures in the form of `Ledger.figures`)."""

    name: str
    placement: str
    figures: dict[str, Any]
    evicted: int
    down: int
    cost: float
    """The cost unrounded (the figures round it to cents)."""


class PeerWorld:
    """One peer, one trace, one fleet, one seed (see the module docstring)."""

    def __init__(
        self, trace: Trace, fleet: Fleet, peer: Peer, seed: int, max_overrun_s: float = 2 * 86400
    ) -> None:
        self.trace, self.fleet, self.peer, self.seed = trace, fleet, peer, seed
        self.now = 0
        self.ledger = Ledger()
        self.kinds = fleet_kinds(fleet)
        self.nodes: dict[str, PNode] = {}
        self.pending: dict[str, PContainer] = {}
        self.containers: list[PContainer] = []
        self.evicted = 0
        self.changes = 0
        """Counts events that may let a queued container fit where it did not (capacity
        freed, a node ready, a side node off): placement memos reset when it moves."""
        self.version = 0
        """Counts every change of what runs where (starts included)."""
        self._heap: list[tuple[int, int, Callable[[Any], None], Any]] = []
        self._seq = 0
        self._done = 0
        self._rounds: set[int] = set()
        self._slots: dict[str, set[int]] = {}
        self._nodes_on = 0
        controller = fleet.controller
        self.tick = to_us(controller.tick_interval)
        self.api = to_us(controller.api_latency)
        self.start_latency = to_us(controller.start_latency)
        cloud = fleet.cloud
        self._period = to_us(cloud.billing.period)
        self._minimum = to_us(cloud.billing.minimum)
        self._cap = trace.end + round(max_overrun_s * _US)
        policy = cloud.instance_type_policy
        needs: dict[tuple[object, ...], Requirements] = {}
        for spec in trace.containers:
            r = spec.resources
            key = (r.vcpus, r.ram, r.scratch, r.gpus, r.gpu_model, r.preemptible)
            need = needs.get(key)
            if need is None:
                need = needs[key] = effective_requirements(r, policy)
            self.containers.append(PContainer(spec, need))
        for kind in self.kinds:
            for name in kind.members:
                self._side_node(kind, name)

    # -- clock ----------------------------------------------------------------------------

    def schedule(self, t: int, fn: Callable[[Any], None], arg: Any = None) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (max(t, self.now), self._seq, fn, arg))

    def request_round(self, at: int | None = None) -> None:
        """Run the peer's loop at `at` (default: the next controller tick)."""
        t = math.ceil(self.now / self.tick) * self.tick if at is None else max(at, self.now)
        if t not in self._rounds:
            self._rounds.add(t)
            self.schedule(t, self._round, t)

    def _round(self, t: int) -> None:
        self._rounds.discard(t)
        self.peer.round(self)

    def run(self) -> PeerRun:
        for c in self.containers:
            self.schedule(c.spec.arrival, self._arrive, c)
        self.request_round(0)
        total = len(self.containers)
        while self._heap:
            t, _, fn, arg = heapq.heappop(self._heap)
            if t > self._cap:
                break
            self.now = t
            fn(arg)
            if self._done >= total and self.now >= self.trace.end:
                break
        return self._close()

    def _close(self) -> PeerRun:
        for node in self.nodes.values():
            self._cause(node, None)
            if node.powered:
                self._bill(node)
            if node.busy_since is not None:
                self.ledger.busy_interval(node.busy_since, self.now, node.kind.price)
        for c in self.containers:
            if c.spec.priority > 0 and c.started is None:
                self.ledger.not_run += 1
            elif c.running:
                self.ledger.unfinished += 1
        down = sum(1 for n in self.nodes.values() if n.down)
        figures = self.ledger.figures()
        return PeerRun(
            self.peer.name, self.peer.placement, figures, self.evicted, down, self.ledger.cost
        )

    # -- containers -----------------------------------------------------------------------

    def _arrive(self, c: PContainer) -> None:
        if c.spec.priority <= 0 or not any(k.fits(c.need) for k in self.kinds):
            self._done += 1  # held, or nothing in the fleet can ever hold it: never started
            return
        self.pending[c.uuid] = c
        self.request_round()

    def queued(self) -> list[PContainer]:
        """Queued containers not planned onto a node, by priority then arrival."""
        out = [c for c in self.pending.values() if c.node is None]
        out.sort(key=lambda c: (-c.spec.priority, c.spec.arrival, c.uuid))
        return out

    def assign(self, c: PContainer, node: PNode) -> None:
        """Start `c` on a ready node, or plan it onto a booting one (its room held)."""
        if c.node is not node:
            self.unplan(c)
            node.take(c.need)
            c.node = node
        if node.phase is Phase.READY:
            node.planned.pop(c.uuid, None)
            self._start(c, node)
        else:
            node.planned[c.uuid] = c

    def unplan(self, c: PContainer) -> None:
        """A queued container is no longer planned onto its node."""
        node = c.node
        if node is not None and not c.running:
            node.planned.pop(c.uuid, None)
            node.take(c.need, -1)
            c.node = None
            self.changes += 1
            self.version += 1

    def _start(self, c: PContainer, node: PNode) -> None:
        del self.pending[c.uuid]
        c.running = True
        c.started = self.now + self.start_latency
        c.instance = f"{node.name}@{node.launched_at}" if node.kind.vm else node.name
        c.token += 1
        self.version += 1
        node.running[c.uuid] = c
        node.last_event = self.now
        node.idle_since = None
        if node.busy_since is None:
            node.busy_since = self.now
            self._cause(node, None)
        self.schedule(c.started + c.spec.runtime, self._finish, (c, c.token))

    def _finish(self, arg: tuple[PContainer, int]) -> None:
        c, token = arg
        if token != c.token or not c.running:
            return
        node = c.node
        assert node is not None and c.started is not None
        c.done = True
        self._done += 1
        self.ledger.waits.append((c.started - c.spec.arrival) / _US)
        share = dominant_share(c.need, node.kind.capacity)
        self.ledger.useful += weighted_work(c.spec.runtime, share, node.kind.price)
        self._release(c, node)
        self.request_round()

    def _release(self, c: PContainer, node: PNode) -> None:
        c.running = False
        c.node = None
        del node.running[c.uuid]
        node.take(c.need, -1)
        node.last_event = self.now
        self.changes += 1
        self.version += 1
        if not node.running:
            if node.busy_since is not None:
                self.ledger.busy_interval(node.busy_since, self.now, node.kind.price)
                node.busy_since = None
            if node.phase is Phase.READY:
                node.idle_since = self.now
                self._cause(node, "idle (the peer's rule)")

    def evict(self, node: PNode) -> None:
        """The node's containers go back to the queue (they will run again from the start)."""
        for c in list(node.running.values()):
            self._release(c, node)
            c.token += 1
            c.started = None
            self.pending[c.uuid] = c
            self.evicted += 1
            self.ledger.requeued += 1
        for c in list(node.planned.values()):
            self.unplan(c)
        self.request_round()

    # -- nodes ----------------------------------------------------------------------------

    def _new_node(self, name: str, kind: Kind, slot: int, rng: random.Random) -> PNode:
        cap = kind.capacity
        node = PNode(name, kind, slot, rng, free=[cap.vcpus, cap.ram, cap.scratch, cap.gpus])
        self.nodes[name] = node
        return node

    def _side_node(self, kind: Kind, name: str) -> None:
        node = self._new_node(name, kind, 0, stream(self.seed, "peer-node", name))
        self.ledger.slots.add(name)
        assert kind.group is not None
        if kind.group.initial_power == "On":
            node.phase = Phase.READY
            node.ready_at = node.idle_since = 0
            self._power_on(node, cycle=False)
            self._cause(node, "idle (the peer's rule)")

    def off_member(self, kind: Kind) -> PNode | None:
        """An off side node of the kind that can be woken (not marked down)."""
        for name in kind.members:
            node = self.nodes[name]
            if node.phase is Phase.OFF and not node.down:
                return node
        return None

    def launch(self, kind: Kind) -> PNode | None:
        """Create a VM of the kind, or wake an off member of a side-node kind."""
        if not kind.vm:
            node = self.off_member(kind)
            if node is not None:
                self.wake(node)
            return node
        used = self._slots.setdefault(kind.name, set())
        slot = 0
        while slot in used:
            slot += 1
        used.add(slot)
        name = f"{kind.name}-{slot}"
        self.ledger.slots.add(f"{kind.name}#{slot}")
        node = self._new_node(name, kind, slot, stream(self.seed, "peer-vm", name, str(self._seq)))
        node.phase = Phase.BOOTING
        node.launched_at = node.last_event = self.now
        self._power_on(node)
        cloud = self.fleet.cloud
        boot = cloud.create_latency.sample(node.rng) + cloud.boot.sample(node.rng)
        if node.rng.random() >= cloud.boot_failure_rate:
            self.schedule(self.now + boot, self._ready, (node, node.token))
        return node

    def wake(self, node: PNode) -> None:
        """Ask a side node's power controller to switch it on."""
        node.phase = Phase.BOOTING
        node.launched_at = node.last_event = self.now
        self._request(node, True)

    def power_off(self, node: PNode) -> None:
        """Destroy a VM / ask a side node's power controller to switch it off. Running
        containers are evicted first."""
        if node.running or node.planned:
            self.evict(node)
        node.phase = Phase.STOPPING
        node.idle_since = None
        node.cordoned = False
        self._cause(node, "draining / shutting down")
        if node.kind.vm:
            node.token += 1
            delay = self.api + self.fleet.cloud.shutdown.sample(node.rng)
            self.schedule(self.now + delay, self._off, (node, node.token))
        else:
            self._request(node, False)

    def assume_off(self, node: PNode) -> None:
        """The peer takes a side node to be off (SLURM after SuspendTimeout)."""
        if node.phase is Phase.STOPPING:
            node.phase = Phase.OFF
            self.changes += 1
            self.version += 1
            self.request_round()

    def _request(self, node: PNode, on: bool) -> None:
        group = node.kind.group
        assert group is not None
        bmc = group.bmc
        lag = bmc.latency.sample(node.rng)
        errored = node.rng.random() < bmc.error_rate
        applied = node.rng.random() < 0.5 if errored else node.rng.random() >= bmc.drop_rate
        node.token += 1
        self.schedule(self.now + lag, self._answer, (node, node.token, on, applied))

    def _answer(self, arg: tuple[PNode, int, bool, bool]) -> None:
        node, token, on, applied = arg
        if token != node.token:
            return
        group = node.kind.group
        assert group is not None
        if applied and on and not node.powered:
            self._power_on(node)
            self.schedule(self.now + group.boot.sample(node.rng), self._ready, (node, token))
        elif applied and not on and node.powered:
            self.schedule(self.now + group.shutdown.sample(node.rng), self._off, (node, token))
        elif not applied and self.peer.observes_power:
            # the next power poll shows the request did not take: send it again
            poll = to_us(group.bmc.poll_interval)
            self.schedule(self.now + poll, self._resend, (node, token, on))

    def _resend(self, arg: tuple[PNode, int, bool]) -> None:
        node, token, on = arg
        if token == node.token:
            self._request(node, on)

    def _power_on(self, node: PNode, cycle: bool = True) -> None:
        node.powered = True
        node.power_since = self.now
        self.ledger.cycles += cycle
        self._nodes_on += 1
        self._cause(node, "booting / verifying")
        self.ledger.sample(self.now, self._nodes_on, len(self.pending))

    def _ready(self, arg: tuple[PNode, int]) -> None:
        node, token = arg
        if token != node.token or node.phase is not Phase.BOOTING:
            return
        node.phase = Phase.READY
        node.ready_at = node.last_event = self.now
        self.changes += 1
        self.version += 1
        self.ledger.boots.append((self.now - node.launched_at) / _US)
        for c in list(node.planned.values()):
            self.assign(c, node)
        if not node.running:
            node.idle_since = self.now
            self._cause(node, "idle (the peer's rule)")
        self.request_round()

    def _off(self, arg: tuple[PNode, int]) -> None:
        node, token = arg
        if token != node.token or not node.powered:
            return
        if node.running or node.planned:
            self.evict(node)
        self._cause(node, None)
        self._bill(node)
        node.powered = False
        node.power_since = None
        self._nodes_on -= 1
        self.ledger.sample(self.now, self._nodes_on, len(self.pending))
        if node.kind.vm:
            del self.nodes[node.name]
            self._slots[node.kind.name].discard(node.slot)
        elif node.phase is Phase.STOPPING:
            node.phase = Phase.OFF
        self.changes += 1
        self.version += 1
        self.request_round()

    def _bill(self, node: PNode) -> None:
        assert node.power_since is not None
        life = self.now - node.power_since
        billed = billed_us(life, self._period, self._minimum) if node.kind.vm else None
        self.ledger.on_interval(node.power_since, self.now, node.kind.price, billed)

    def _cause(self, node: PNode, cause: str | None) -> None:
        if node.idle_cause is not None and self.now > node.idle_cause_since:
            self.ledger.idle_interval(
                node.idle_cause, node.idle_cause_since, self.now, node.kind.price
            )
        node.idle_cause = cause
        node.idle_cause_since = self.now


def delay_upper(delay: Delay) -> int:
    """The largest value a delay distribution can draw (µs; 4 times its median if unbounded)."""
    if delay.fixed is not None:
        return to_us(delay.fixed)
    if delay.uniform is not None:
        return to_us(delay.uniform.max)
    assert delay.lognormal is not None
    if delay.lognormal.max is not None:
        return to_us(delay.lognormal.max)
    return 4 * to_us(delay.lognormal.median)


def span(seconds: float) -> str:
    """A knob's duration as a row label shows it (90s, 10m)."""
    if seconds >= 60 and seconds % 60 == 0:
        return f"{int(seconds // 60)}m"
    return f"{seconds:g}s"
