"""The pure container scheduler: which container starts on which node, which nodes to create.

`plan(containers, nodes, catalogue, type_policy, limits, cloud, now, rules)` takes a
snapshot and returns a `Plan`; it performs no I/O and keeps no state between calls. The
dispatcher executes the plan (lock + start runners, create instances) and calls it again
when something it read changed or a time it named came (`Plan.due`). The input views and
the `Plan` are values of `scheduling.views`; a node's free capacity during one call is a
`scheduling.slots.Slot`; the placement levers are `scheduling.placement.PlacementRules`
(a PowerPolicy's `spec.placement`; `EARLIER` is the behaviour of earlier releases).

Rules (after the Arvados cloud dispatcher, with the levers of issue 25):

1. Order: Running containers first (they keep their node), then Locked, then Queued;
   within each, higher priority first, then earlier first-seen, then uuid.
2. The input is the capacity ledger (`scheduling.ledger`): a Running container, and a
   Locked one not known to be without a runner, holds its node's resources whatever the
   node's capacity (a node found holding more than its capacity is reported in
   `Plan.over_capacity` from what is known to run there, and takes no new work until it
   fits). A Locked container whose runner the node said never ran (`runner_absent`) is
   placed again on its own node like any placement: started there when the node is ready,
   open and has room; unlocked ("no room") when it does not fit; unlocked when its node
   vanished or cannot take work. Nothing else is ever started under an existing lock.
3. A Queued container (priority > 0) is placed, in this order of preference, on
   a. a ready, open node with room -- a VM of one of its fitting types (those a new node
      for it would be chosen from), or a side node whose share for it costs no more
      (`Ask.takes`): best fit, the fullest such node (`BestFit`: in order of fullness
      when the plan begins, then cheaper, then name), so work gathers on busy nodes and
      emptier ones fall idle; earlier releases: an idle node of the cheapest fitting
      type, a ready side node, then a busy node of a fitting type;
   b. (`scheduling.launch`) a side node already waking, with room, whose wake its wait
      budget allows (`scheduling.waiting`), or a ready node whose room comes back soon
      (containers being cancelled there, `ContainerView.frees_at`) within the budget;
   c. (`scheduling.launch`, once every container was seen) for the pending queue as a
      whole: a side node that is off, woken when the pending containers that would fill
      it pay more for VMs (or, priced per resource, when its share is cheaper and the
      whole node within the price factor of the container's type); a VM coming up with
      room (its creation pending or booting -- counted, so demand is never
      double-counted); new VMs, several containers onto one when that is cheaper per
      container-hour -- subject to the policy limits (max nodes, per-type max, max
      hourly spend), the cloud's state (quota / capacity / rate-limit back-off) and the
      price factor. Earlier releases (`PerContainer`): one container at a time, a waking
      side node, an off one no dearer per hour than its cheapest type, a VM coming up,
      its cheapest available type.
   GPU capacity last: a container that asks for no GPU goes to a node or instance type
   with GPUs only when nothing without GPUs could ever fit it (earlier: GPU side nodes
   never take it; GPU types only by price). A side node is priced per resource: the share
   of it a container takes.
4. A container that no instance type and no side node can ever fit is unsatisfiable (the
   dispatcher fails it with the reason). One that fits but cannot be placed now waits
   with a human-readable reason ("waiting for a new m5.large to boot", "waiting: cloud
   instance quota reached", "waiting up to 2m for side node gpu-3: 40 % cheaper").
   Reasons name a node only when the container waits for a side node or for room to
   come back, so a container waiting through create -> boot is written once, not once
   per step.
5. Idle nodes not needed by the plan are reported as surplus, except the `min_warm_nodes`
   cheapest ones, which are reported as kept warm.
6. `Plan.due`: the first moment the plan may change though nothing it read did (a wait
   budget running out, a waking node falling behind): the dispatcher plans again then.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

from nodewarden.api.containerdispatch import ContainerResources
from nodewarden.scheduling.creates import Counted, blocked_types
from nodewarden.scheduling.instancetypes import (
    Catalogue,
    InstanceType,
    InstanceTypePolicy,
    choose_instance_type,
    effective_requirements,
    gpu_last,
    misfit,
)
from nodewarden.scheduling.launch import Launcher
from nodewarden.scheduling.placement import (
    Ask,
    BestFit,
    PlacementRules,
    cpu_needs_gpu,
)
from nodewarden.scheduling.slots import Slot, over_capacity, side_node_fits
from nodewarden.scheduling.views import (
    COMING_UP,
    USABLE_NOW,
    Capacity,
    CloudState,
    ContainerView,
    Limits,
    NodeState,
    NodeView,
    Phase,
    Plan,
    Start,
)


def _order_key(c: ContainerView) -> tuple[int, int, datetime, str]:
    """Running, then Locked, then Queued; by priority, then age (a plan of 5,000 queued
    containers sorts them all: identity tests, no lookup of the enum)."""
    phase = c.phase
    rank = 0 if phase is Phase.RUNNING else 1 if phase is Phase.LOCKED else 2
    return (rank, -c.priority, c.first_seen, c.uuid)


Shape = tuple[object, ...]
"""What a container asks of a node, as a key (`_shape`)."""


def _shape(r: ContainerResources) -> Shape:
    return (r.vcpus, r.ram, r.scratch, r.gpus, r.gpu_model, r.preemptible)


class _Asks:
    """Each container shape's `Ask`, made once per plan."""

    def __init__(
        self,
        catalogue: Catalogue,
        type_policy: InstanceTypePolicy,
        at_capacity: frozenset[str],
        side: Sequence[Capacity],
        rules: PlacementRules,
    ) -> None:
        self.catalogue = catalogue
        self.type_policy = type_policy
        self.at_capacity = at_capacity
        self.side = side
        self.rules = rules
        self.cache: dict[Shape, Ask] = {}

    def of(self, resources: ContainerResources) -> tuple[Ask, Shape]:
        key = _shape(resources)
        hit = self.cache.get(key)
        if hit is None:
            hit = self.cache[key] = self._make(resources)
        return hit, key

    def _make(self, resources: ContainerResources) -> Ask:
        need = effective_requirements(resources, self.type_policy)
        types: Sequence[InstanceType] = self.catalogue.types
        without_gpu = True
        if self.rules.gpu_last and need.gpus == 0:
            # GPU capacity last: GPU types only when no type without GPUs fits
            types, without_gpu = gpu_last(types, need)
        choice = choose_instance_type(resources, types, self.type_policy, self.at_capacity)
        fitting = [t.price for t in types if misfit(t, need) is None]
        standalone = min(fitting) if fitting else None
        return Ask(
            need=need,
            choice=choice,
            candidates=tuple(t.name for t in choice.candidates),
            standalone=standalone,
            gpu_anywhere=need.gpus > 0 or cpu_needs_gpu(need, without_gpu, self.side),
            price_ceiling=(
                None if standalone is None else standalone * self.type_policy.price_factor
            ),
        )


def plan(
    containers: Iterable[ContainerView],
    nodes: Iterable[NodeView],
    catalogue: Catalogue,
    type_policy: InstanceTypePolicy,
    limits: Limits,
    cloud: CloudState,
    now: datetime,
    rules: PlacementRules | None = None,
) -> Plan:
    """Plan one scheduling round from a snapshot. Pure and deterministic."""
    rules = rules or PlacementRules()
    result = Plan()
    ordered = sorted(containers, key=_order_key)
    slots: dict[str, Slot] = {}
    ready: list[Slot] = []
    coming: list[Slot] = []
    side_waking: list[Slot] = []
    side_off: list[Slot] = []
    side_all: list[Slot] = []
    fleet = Counted(new_left=cloud.max_new_nodes)
    for view in sorted(nodes, key=lambda n: (n.price, n.name)):
        slot = Slot(view)
        slots[view.name] = slot
        if view.instance_type is None:
            side_all.append(slot)
        elif view.state is not NodeState.OFF:
            fleet.nodes += 1
            fleet.spend += view.price
            fleet.per_type[view.instance_type] = fleet.per_type.get(view.instance_type, 0) + 1
        if view.instance_type is None and view.wakeable:
            if view.state is NodeState.WAKING:
                side_waking.append(slot)
            elif view.state is NodeState.OFF:
                side_off.append(slot)
            continue
        if not view.admission_open:
            continue
        if view.state in USABLE_NOW and view.ready:
            ready.append(slot)
        elif view.state in COMING_UP and view.instance_type is not None:
            coming.append(slot)

    fleet.blocked = blocked_types(cloud, limits, fleet.per_type)
    asks = _Asks(
        catalogue, type_policy, frozenset(fleet.blocked), [s.view.capacity for s in side_all], rules
    )
    launcher = Launcher(
        rules, catalogue, type_policy, limits, cloud, fleet, now, result, ready, coming,
        side_waking, side_off, side_all,
    )  # fmt: skip
    placing: _Ready | None = None
    for c in ordered:
        ask, shape = asks.of(c.resources)
        if c.phase is Phase.RUNNING:
            own = slots.get(c.node or "")
            if own is not None:
                if c.whole_node:
                    own.block()
                else:
                    own.take(ask.need)
                    if c.frees_at is not None:
                        own.freeing(ask.need, c.frees_at)
            continue
        if placing is None:
            # every Running container is counted: which nodes run too much; the order
            # of fullness is taken once the ledger's holdings are in
            result.over_capacity = over_capacity(slots)
            placing = _Ready(ready, rules)
        if c.phase is Phase.LOCKED:
            own = slots.get(c.node or "")
            _locked(c, ask, own, result, rules)
            if c.frees_at is not None and own is not None and not c.runner_absent:
                own.freeing(ask.need, c.frees_at)
            continue
        if c.priority <= 0:
            result.waits[c.uuid] = "held: priority 0"
            continue
        placed = placing.take(ask, shape)  # a. a ready node
        if placed is not None:
            placed.take(ask.need)
            result.starts.append(Start(c.uuid, placed.view.name, gpu_work=ask.gpu_anywhere))
            if placed.view.instance_type:
                result.chosen_types[c.uuid] = placed.view.instance_type
            continue
        launcher.place(c, ask, shape)  # b. capacity coming up, c. new capacity
    if placing is None:
        result.over_capacity = over_capacity(slots)
    launcher.run()

    idle = [
        s
        for s in slots.values()
        if s.containers == 0 and s.view.state is NodeState.IDLE and s.view.instance_type is not None
    ]
    idle.sort(key=lambda s: (s.view.price, s.view.name))
    warm = idle[: max(0, limits.min_warm_nodes)]
    result.kept_warm = [s.view.name for s in warm]
    result.surplus_idle = [s.view.name for s in idle[len(warm) :]]
    return result


class _Ready:
    """The ready, open nodes a queued container may start on now: best fit (the fullest
    that fits, `BestFit`), or earlier releases' order (an idle node of the cheapest
    fitting type, a ready side node, then a busy node of a fitting type)."""

    def __init__(self, ready: list[Slot], rules: PlacementRules) -> None:
        self.rules = rules
        self.best = BestFit(ready) if rules.best_fit else None
        self.idle_by_type: dict[str, list[Slot]] = {}
        self.by_type: dict[str, list[Slot]] = {}
        self.side: list[Slot] = []
        self.scan_from: dict[tuple[str, Shape], int] = {}
        if self.best is None:
            for slot in ready:
                t = slot.view.instance_type
                if t is None:
                    self.side.append(slot)
                    continue
                self.by_type.setdefault(t, []).append(slot)
                if slot.view.state is NodeState.IDLE:
                    self.idle_by_type.setdefault(t, []).append(slot)

    def take(self, ask: Ask, shape: Shape) -> Slot | None:
        if self.best is not None:
            return self.best.first(ask, shape, self.rules)
        need = ask.need
        rules = self.rules
        for type_name in ask.candidates:
            pool = self.idle_by_type.get(type_name, [])
            # idle slots of one type are identical: only the first unused one needs checking
            while pool and pool[0].containers:
                pool.pop(0)
            if pool and pool[0].fits(need) and _open_to(pool[0], ask, rules):
                return pool[0]
        side = next((s for s in self.side if side_node_fits(s, need)), None)
        if side is not None:
            return side
        for type_name in ask.candidates:
            pool = self.by_type.get(type_name, [])
            memo = (type_name, shape)
            for index in range(self.scan_from.get(memo, 0), len(pool)):
                if pool[index].fits(need) and _open_to(pool[index], ask, rules):
                    self.scan_from[memo] = index
                    return pool[index]
            self.scan_from[memo] = len(pool)
        return None


def _open_to(slot: Slot, ask: Ask, rules: PlacementRules) -> bool:
    """A node open to GPU work only takes this shape (`Ask.admits`); any other does."""
    return not slot.view.gpu_only or ask.admits(slot, rules)


def _locked(
    c: ContainerView, ask: Ask, own: Slot | None, result: Plan, rules: PlacementRules
) -> None:
    """A Locked container on its own node (rule 2); one to start again (`runner_absent`)
    starts only where a new placement could (a node open to GPU work only takes no
    CPU-only container that fits elsewhere: `Ask.admits`)."""
    need = ask.need
    if own is None:
        result.unlocks[c.uuid] = f"node {c.node} is gone"
        return
    view = own.view
    usable = view.state in USABLE_NOW and view.ready and view.admission_open
    coming = view.state in COMING_UP
    if not c.runner_absent:
        own.take(need)  # its runner may run (or is starting): it holds the node
        if coming:
            result.waits[c.uuid] = f"locked; waiting for {view.name} to boot"
        elif not usable:
            result.unlocks[c.uuid] = _not_taking_work(view)
        return
    if not (usable or (coming and view.admission_open)):
        result.unlocks[c.uuid] = _not_taking_work(view)
        return
    if view.gpu_only and not ask.admits(own, rules):
        result.unlocks[c.uuid] = (
            f"node {view.name} takes only GPU work now (admission GPUOnly: its GPUs are idle)"
        )
        return
    if not own.fits(need):
        result.overflow.add(c.uuid)
        result.unlocks[c.uuid] = (
            f"no room on {view.name} for it: the node's capacity is held by the "
            "containers already there"
        )
        return
    own.take(need)
    if usable:
        result.starts.append(Start(c.uuid, view.name, relock=True, gpu_work=ask.gpu_anywhere))
    else:
        result.waits[c.uuid] = f"locked; waiting for {view.name} to boot"


def _not_taking_work(view: NodeView) -> str:
    if view.state in USABLE_NOW and not view.admission_open:
        return f"node {view.name} takes no new work (admission closed)"
    return f"node {view.name} is {view.state}"


def qualified_demand(
    node: NodeView,
    containers: Iterable[ContainerView],
    catalogue: Catalogue,
    type_policy: InstanceTypePolicy,
    rules: PlacementRules | None = None,
    side: Sequence[Capacity] = (),
) -> list[str]:
    """The queued containers that this node should serve, by the plan's own fit rules.

    A queued container (priority > 0) qualifies when it fits the node's whole capacity,
    the node takes it (`Ask.takes`: the GPU rule -- `side`, the capacities of the fleet's
    side nodes, for "nothing without GPUs fits" -- and, priced per resource, its share of
    the node's price within the price factor of its cheapest type) and the node is a
    place the scheduler would choose for it: a side node (priced per node, earlier
    releases: one not dearer per hour than the cheapest fitting instance type, or no type
    fits), or a cloud VM -- of any type under best fit, of one of its fitting types within
    the price factor under the earlier rule. This is the demand a shutdown waits
    for and a wake is justified by (power gates: "qualified demand").
    """
    rules = rules or PlacementRules()
    asks = _Asks(catalogue, type_policy, frozenset(), side, rules)
    out: list[ContainerView] = []
    for c in containers:
        if c.phase is not Phase.QUEUED or c.priority <= 0:
            continue
        ask, _ = asks.of(c.resources)
        slot = Slot(node)
        if not (slot.fits(ask.need) and ask.takes(slot, rules)):
            continue
        if node.instance_type is None:
            cheapest = ask.choice.instance_type
            if not rules.per_resource_price and cheapest and node.price > cheapest.price:
                continue  # per node (earlier releases): no dearer than its cheapest type
        elif not rules.best_fit and node.instance_type not in ask.candidates:
            continue
        out.append(c)
    return [c.uuid for c in sorted(out, key=_order_key)]


def lock_retry_at(
    lock_flaps: int, max_lock_flaps: int, last_locked: datetime | None, now: datetime
) -> datetime | None:
    """When a container that was unlocked too often may be locked again (None = now).

    After `max_lock_flaps` Locked -> Queued round trips a container is left unlocked for
    30 s, doubling with every further flap (capped at 10 min), so a node that keeps
    vanishing or a lock that keeps conflicting cannot make the queue flap.
    """
    if lock_flaps < max_lock_flaps or last_locked is None:
        return None
    backoff = min(600.0, 30.0 * 2 ** (lock_flaps - max_lock_flaps))
    # `lockedAt` may come from another replica's clock: one from the future counts as now
    retry = min(last_locked, now) + timedelta(seconds=backoff)
    return retry if retry > now else None
