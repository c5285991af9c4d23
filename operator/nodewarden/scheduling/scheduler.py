"""The pure container scheduler: which container starts on which node, which nodes to create.

`plan(containers, nodes, catalogue, limits, cloud, now)` takes a snapshot and returns a
`Plan`; it performs no I/O and keeps no state between calls. The dispatcher executes the
plan (lock + start runners, create instances) and calls it again on the next tick.
The input views and the `Plan` are values of `scheduling.views`; a node's free capacity
during one call is a `scheduling.slots.Slot`.

Rules (after the Arvados cloud dispatcher):

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
   a. an idle, ready node of a fitting type (cheapest type first);
   b. a ready node that already runs containers and has room (packing);
   c. a node that is booting (or whose creation is pending) and has room left after the
      containers already waiting for it -- nodes already booting are counted, so demand
      is never double-counted;
   d. a side node that is waking up (its wake already asked for) and has room left;
   e. a side node that is off and can be woken, when it fits and no fitting instance type
      is cheaper per hour (or none fits): the plan asks to wake it (`Plan.wakes`), and
      further containers pack into it before a second node is woken;
   f. a new node of the cheapest fitting type that is not at capacity (a dearer type within
      the price factor when it is), subject to the policy limits (max nodes, per-type max,
      max hourly spend) and the cloud's state (quota / capacity / rate-limit back-off).
   "Fitting type" = every catalogue type that fits and is within the price factor of the
   cheapest fit, so a small container never occupies an expensive GPU node. A side node
   (fixed hardware, no catalogue type) fits when its capacity does, and it is only used
   for GPU-less containers if it has no GPUs itself.
4. A container that no instance type and no side node can ever fit is unsatisfiable (the
   dispatcher fails it with the reason). One that fits but cannot be placed now waits
   with a human-readable reason ("waiting for a new m5.large to boot", "waiting: cloud
   instance quota reached"). Reasons deliberately do not name the node, so a container
   waiting through create -> boot is written once, not once per step.
5. Idle nodes not needed by the plan are reported as surplus, except the `min_warm_nodes`
   cheapest ones, which are reported as kept warm.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

from nodewarden.api.containerdispatch import ContainerResources
from nodewarden.scheduling.instancetypes import (
    Catalogue,
    ChoiceOutcome,
    InstanceType,
    InstanceTypeChoice,
    InstanceTypePolicy,
    Requirements,
    choose_instance_type,
    effective_requirements,
)
from nodewarden.scheduling.slots import Slot, over_capacity, side_node_fits
from nodewarden.scheduling.views import (
    COMING_UP,
    USABLE_NOW,
    Capacity,
    CloudState,
    ContainerView,
    Create,
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


def plan(
    containers: Iterable[ContainerView],
    nodes: Iterable[NodeView],
    catalogue: Catalogue,
    type_policy: InstanceTypePolicy,
    limits: Limits,
    cloud: CloudState,
    now: datetime,
) -> Plan:
    """Plan one scheduling round from a snapshot. Pure and deterministic."""
    del now  # part of the signature so reasons can mention times later; unused today
    result = Plan()
    ordered = sorted(containers, key=_order_key)
    slots: dict[str, Slot] = {}
    by_type_ready: dict[str | None, list[Slot]] = {}
    by_type_coming: dict[str | None, list[Slot]] = {}
    side_ready: list[Slot] = []
    side_waking: list[Slot] = []
    side_off: list[Slot] = []
    node_count = 0
    spend = 0.0
    per_type: dict[str, int] = {}
    for view in sorted(nodes, key=lambda n: (n.price, n.name)):
        slot = Slot(view)
        slots[view.name] = slot
        if view.state not in (NodeState.OFF,) and view.instance_type is not None:
            node_count += 1
            spend += view.price
            per_type[view.instance_type] = per_type.get(view.instance_type, 0) + 1
        if view.instance_type is None and view.wakeable:
            if view.state is NodeState.WAKING:
                side_waking.append(slot)
            elif view.state is NodeState.OFF:
                side_off.append(slot)
            continue
        if not view.admission_open:
            continue
        if view.state in USABLE_NOW and view.ready:
            if view.instance_type is None:
                side_ready.append(slot)
            else:
                by_type_ready.setdefault(view.instance_type, []).append(slot)
        elif view.state in COMING_UP and view.instance_type is not None:
            by_type_coming.setdefault(view.instance_type, []).append(slot)

    choice_cache: dict[Shape, tuple[InstanceTypeChoice, Requirements]] = {}
    blocked_all = cloud.creates_blocked
    blocked_types = dict(cloud.blocked_types)
    for name, cap in limits.per_type_max.items():
        if per_type.get(name, 0) >= cap:
            blocked_types.setdefault(name, f"per-type limit of {cap} {name} nodes reached")
    at_capacity = frozenset(blocked_types)
    new_nodes_left = cloud.max_new_nodes
    pending_creates: dict[str, Create] = {}
    # Incremental first fit: during one plan capacity only shrinks, so the slots before
    # scan_from[(pool, shape)] are known not to fit that shape; scans resume there.
    scan_from: dict[tuple[int, Shape], int] = {}

    def choose(resources: ContainerResources) -> tuple[InstanceTypeChoice, Requirements, Shape]:
        key = _shape(resources)
        hit = choice_cache.get(key)
        if hit is None:
            hit = (
                choose_instance_type(resources, catalogue.types, type_policy, at_capacity),
                effective_requirements(resources, type_policy),
            )
            choice_cache[key] = hit
        return hit[0], hit[1], key

    def first_fit(pool: Sequence[Slot], need: Requirements, shape: Shape) -> Slot | None:
        memo = (id(pool), shape)
        start = scan_from.get(memo, 0)
        for index in range(start, len(pool)):
            if pool[index].fits(need):
                scan_from[memo] = index
                return pool[index]
        scan_from[memo] = len(pool)
        return None

    def first_idle(pool: list[Slot], need: Requirements) -> Slot | None:
        # idle slots of one type are identical: only the first unused one needs checking
        while pool and pool[0].containers:
            pool.pop(0)
        return pool[0] if pool and pool[0].fits(need) else None

    idle_by_type: dict[str | None, list[Slot]] = {
        t: [s for s in pool if s.view.state is NodeState.IDLE] for t, pool in by_type_ready.items()
    }

    judged = False
    for c in ordered:
        if not judged and c.phase is not Phase.RUNNING:
            judged = True  # every Running container is counted: which nodes run too much
            result.over_capacity = over_capacity(slots)
        choice, need, shape = choose(c.resources)
        if c.phase is Phase.RUNNING:
            own = slots.get(c.node or "")
            if own is not None:
                if c.whole_node:
                    own.block()
                else:
                    own.take(need)
            continue
        if c.phase is Phase.LOCKED:
            _locked(c, need, slots.get(c.node or ""), result)
            continue

        if c.priority <= 0:
            result.waits[c.uuid] = "held: priority 0"
            continue
        candidates = [t.name for t in choice.candidates]
        # side nodes are checked even when no catalogue type fits
        # a. idle ready node of a fitting type, cheapest type first
        placed: Slot | None = None
        for type_name in candidates:
            placed = first_idle(idle_by_type.get(type_name, []), need)
            if placed:
                break
        if placed is None:
            placed = next((s for s in side_ready if side_node_fits(s, need)), None)
        # b. packing onto a ready node with room
        if placed is None:
            for type_name in candidates:
                placed = first_fit(by_type_ready.get(type_name, []), need, shape)
                if placed:
                    break
        if placed is not None:
            placed.take(need)
            result.starts.append(Start(c.uuid, placed.view.name))
            if placed.view.instance_type:
                result.chosen_types[c.uuid] = placed.view.instance_type
            continue
        # d. a side node waking up with room; e. an off side node worth waking
        cheapest = None if choice.outcome is ChoiceOutcome.NO_FIT else choice.instance_type
        woken = _wait_for_side_node(c.uuid, need, side_waking, side_off, cheapest, result)
        if woken:
            continue
        if choice.outcome is ChoiceOutcome.NO_FIT:
            # a side node that is busy, off or booting may still take it later
            later = next(
                (
                    s
                    for s in slots.values()
                    if s.view.instance_type is None and side_node_fits(Slot(s.view), need)
                ),
                None,
            )
            if later is not None:
                result.waits[c.uuid] = f"waiting for side node {later.view.name}"
            else:
                result.unsatisfiable[c.uuid] = (
                    f"no instance type or side node fits: {choice.reason}"
                )
            continue
        # c. a node already coming up with room
        for type_name in candidates:
            coming = first_fit(by_type_coming.setdefault(type_name, []), need, shape)
            if coming is not None:
                coming.take(need)
                result.waits[c.uuid] = f"waiting for a new {type_name} to boot"
                result.wait_nodes[c.uuid] = coming.view.name
                result.chosen_types[c.uuid] = type_name
                placed = coming
                break
        if placed is not None:
            continue
        # f. a new node
        if blocked_all:
            result.waits[c.uuid] = f"waiting: {blocked_all}"
            continue
        chosen = choice.instance_type
        if chosen is None:
            reasons = "; ".join(sorted({blocked_types.get(n, "") for n in candidates} - {""}))
            result.waits[c.uuid] = (
                f"waiting: every fitting instance type is unavailable ({reasons})"
            )
            continue
        if limits.max_nodes is not None and node_count >= limits.max_nodes:
            result.waits[c.uuid] = f"waiting: max nodes ({limits.max_nodes}) reached"
            continue
        if (
            limits.max_hourly_spend is not None
            and spend + chosen.price > limits.max_hourly_spend + 1e-9
        ):
            result.waits[c.uuid] = (
                f"waiting: a new {chosen.name} ({chosen.price:g}/h) would exceed the max "
                f"hourly spend ({limits.max_hourly_spend:g}/h; now {spend:g}/h)"
            )
            continue
        type_cap = limits.per_type_max.get(chosen.name)
        if type_cap is not None and per_type.get(chosen.name, 0) >= type_cap:
            result.waits[c.uuid] = (
                f"waiting: per-type limit of {type_cap} {chosen.name} nodes reached"
            )
            continue
        if new_nodes_left is not None and new_nodes_left <= 0:
            result.waits[c.uuid] = f"waiting for a new {chosen.name} (create queue full)"
            result.chosen_types[c.uuid] = chosen.name
            continue
        # plan the create and give the virtual node the container (others may pack into it)
        virtual = Slot(
            NodeView(
                name=f"(new {chosen.name} #{len(result.creates) + 1})",
                state=NodeState.PENDING,
                capacity=Capacity.of(chosen),
                instance_type=chosen.name,
                price=chosen.price,
            )
        )
        virtual.take(need)
        create = Create(chosen.name, (c.uuid,))
        result.creates.append(create)
        pending_creates[virtual.view.name] = create
        by_type_coming.setdefault(chosen.name, []).append(virtual)
        node_count += 1
        spend += chosen.price
        per_type[chosen.name] = per_type.get(chosen.name, 0) + 1
        if new_nodes_left is not None:
            new_nodes_left -= 1
        result.waits[c.uuid] = f"waiting for a new {chosen.name} to boot"
        result.chosen_types[c.uuid] = chosen.name

    # containers that packed into a planned new node: record them on its Create
    if pending_creates:
        extra: dict[str, list[str]] = {}
        for uuid, node in list(result.wait_nodes.items()):
            if node in pending_creates:
                extra.setdefault(node, []).append(uuid)
                del result.wait_nodes[uuid]
                result.waits[uuid] = (
                    f"waiting for a new {pending_creates[node].instance_type} to boot"
                )
        if extra:
            result.creates = [
                Create(cr.instance_type, cr.for_containers + tuple(extra.get(name, ())))
                for name, cr in pending_creates.items()
            ]

    if not judged:
        result.over_capacity = over_capacity(slots)
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


def _locked(c: ContainerView, need: Requirements, own: Slot | None, result: Plan) -> None:
    """A Locked container on its own node (rule 2)."""
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
    if not own.fits(need):
        result.overflow.add(c.uuid)
        result.unlocks[c.uuid] = (
            f"no room on {view.name} for it: the node's capacity is held by the "
            "containers already there"
        )
        return
    own.take(need)
    if usable:
        result.starts.append(Start(c.uuid, view.name, relock=True))
    else:
        result.waits[c.uuid] = f"locked; waiting for {view.name} to boot"


def _not_taking_work(view: NodeView) -> str:
    if view.state in USABLE_NOW and not view.admission_open:
        return f"node {view.name} takes no new work (admission closed)"
    return f"node {view.name} is {view.state}"


def _wait_for_side_node(
    uuid: str,
    need: Requirements,
    waking: list[Slot],
    off: list[Slot],
    cheapest: InstanceType | None,
    result: Plan,
) -> bool:
    """Place `uuid` on a waking side node with room, or ask to wake an off one that fits
    and is not dearer than the cheapest fitting instance type. Returns whether it did."""
    for slot in waking:
        if side_node_fits(slot, need):
            slot.take(need)
            if slot.view.name in result.wakes:  # woken by this plan: count it as its demand
                result.wakes[slot.view.name].append(uuid)
            result.waits[uuid] = f"waiting for side node {slot.view.name} to wake"
            result.wait_nodes[uuid] = slot.view.name
            return True
    for slot in off:
        if not side_node_fits(slot, need):
            continue
        if cheapest is not None and slot.view.price > cheapest.price:
            continue
        slot.take(need)
        waking.append(slot)  # later containers pack into it first
        off.remove(slot)
        result.wakes.setdefault(slot.view.name, []).append(uuid)
        result.waits[uuid] = f"waiting for side node {slot.view.name} to wake"
        result.wait_nodes[uuid] = slot.view.name
        return True
    return False


def qualified_demand(
    node: NodeView,
    containers: Iterable[ContainerView],
    catalogue: Catalogue,
    type_policy: InstanceTypePolicy,
) -> list[str]:
    """The queued containers that this node should serve, by the plan's own fit rules.

    A queued container (priority > 0) qualifies when it fits the node's whole capacity
    and the node is a place the scheduler would choose for it: a side node that is not
    dearer than the cheapest fitting instance type (or no type fits; GPU nodes only for
    GPU work), or a cloud VM of one of the container's fitting types. This is the demand
    a shutdown waits for and a wake is justified by (power gates: "qualified demand").
    """
    out: list[ContainerView] = []
    for c in containers:
        if c.phase is not Phase.QUEUED or c.priority <= 0:
            continue
        need = effective_requirements(c.resources, type_policy)
        slot = Slot(node)
        if node.instance_type is None:
            if not side_node_fits(slot, need):
                continue
            choice = choose_instance_type(c.resources, catalogue.types, type_policy)
            cheapest = choice.instance_type
            if cheapest is not None and node.price > cheapest.price:
                continue
        else:
            if not slot.fits(need):
                continue
            choice = choose_instance_type(c.resources, catalogue.types, type_policy)
            if node.instance_type not in {t.name for t in choice.candidates}:
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
