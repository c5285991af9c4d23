"""Capacity that is not ready yet: VMs coming up, side nodes waking, new VMs and side
nodes to wake (pure; one `Launcher` per plan).

The scheduler hands over, in queue order, every Queued container no ready node takes
(`place`). A side node already waking, with room, takes it first when its wake fits the
container's wait budget (`scheduling.waiting`; earliest expected first under best fit),
then a ready node whose room comes back soon (containers being cancelled there:
`ContainerView.frees_at`) before the budget ends.
Then, for the queue as a whole (`PlacementRules.queue_launch`, Karpenter's launch),
once every container was seen (`run`), each in queue order goes to

1. a side node this plan wakes, with room, within its budget;
2. a side node that is off, woken now (`_wake_for_queue`) when it is worth it: the
   container has no alternative; or, priced per resource, its share of the node is
   cheaper than its own type and the whole node costs no more than the price factor
   allows even if nothing else comes (a GPU server for one GPU job); or the pending
   containers that would fill it -- shape by shape in queue order, only those whose
   budget allows its wake -- would pay more for their own types than it costs (a burst
   onto one large server). Tried before a VM coming up: the containers woken for it wait
   for it on the next plans too, and VMs nobody waits for any more fall idle;
3. a VM coming up (pending, booting, or created by this plan) with room: counted, so
   demand is never double-counted (best fit, or earlier: the first of a fitting type);
4. a new VM: of each instance type that fits it and that the limits and the cloud
   allow, filled with the pending containers that fit beside it, the one with the lowest
   price per container-hour -- its price over what the containers on it would pay each on
   its own cheapest type (`Ask.standalone`; equal run times assumed: none is known), at
   most the price factor (a dearer type when cheaper ones are at capacity, as before). On
   a tie the option with fewer containers wins (a node per container runs no longer than
   its container).

One container at a time (`PerContainer`, earlier releases): a waking side node, an off
one that fits and is not dearer than its cheapest type (per node; per resource: its share
of the node's price), a VM coming up, else its cheapest available type -- placed at
once; later containers fill what is left.

A container none of these can take waits with the reason (limits, cloud back-off, no
type), or is unsatisfiable when no instance type or side node could ever run it. The
plan's due time (`Plan.due`) is the earliest moment a judgement of the wait budget can
change with nothing else changing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from nodewarden.scheduling.creates import Counted, limit_reason, new_view, no_node_reason
from nodewarden.scheduling.instancetypes import (
    Catalogue,
    ChoiceOutcome,
    InstanceType,
    InstanceTypePolicy,
    misfit,
    preference_key,
)
from nodewarden.scheduling.placement import Ask, BestFit, PlacementRules, share_price
from nodewarden.scheduling.slots import Slot
from nodewarden.scheduling.views import (
    CloudState,
    ContainerView,
    Create,
    Limits,
    NodeState,
    NodeView,
    Plan,
)
from nodewarden.scheduling.waiting import (
    Patience,
    expected_ready,
    freeing_status,
    patience,
    percent_cheaper,
    side_status,
)

Shape = tuple[object, ...]


@dataclass(slots=True)
class _Pending:
    c: ContainerView
    ask: Ask
    shape: Shape
    wait: Patience | None = None
    done: bool = False


@dataclass(slots=True)
class _Option:
    ratio: float
    members: list[_Pending]
    slot: Slot
    itype: InstanceType | None  # None: a side node to wake
    ready: datetime | None = None  # a side node: when it is expected ready

    def key(self) -> tuple[float, int, int, float, float, str]:
        """Cheapest per container-hour; fewer containers; a VM; sooner ready; name."""
        return (
            round(self.ratio, 9),
            len(self.members),
            0 if self.itype is not None else 1,
            self.ready.timestamp() if self.ready is not None else 0.0,
            self.slot.view.price,
            self.slot.view.name,
        )


class Launcher:
    """New VMs and wakes for one plan (module docstring)."""

    def __init__(
        self,
        rules: PlacementRules,
        catalogue: Catalogue,
        type_policy: InstanceTypePolicy,
        limits: Limits,
        cloud: CloudState,
        fleet: Counted,
        now: datetime,
        result: Plan,
        ready: list[Slot],
        coming: list[Slot],
        side_waking: list[Slot],
        side_off: list[Slot],
        side_all: list[Slot],
    ) -> None:
        self.rules = rules
        self.catalogue = catalogue
        self.type_policy = type_policy
        self.limits = limits
        self.cloud = cloud
        self.fleet = fleet
        self.now = now
        self.result = result
        self.waking = side_waking  # those this plan wakes are appended
        self.ready = ready
        self.freeing: list[Slot] | None = None
        self.off = side_off
        self.side_all = side_all
        self.due: list[datetime] = []
        self.pending: list[_Pending] = []
        self.groups: dict[Shape, list[_Pending]] = {}
        self.arriving = BestFit(coming)  # new VMs are added
        self.coming_by_type: dict[str, list[Slot]] = {}
        for slot in coming:
            self.coming_by_type.setdefault(slot.view.instance_type or "", []).append(slot)
        self.scan_from: dict[tuple[str, Shape], int] = {}
        self.members: dict[str, list[str]] = {}  # new VM -> containers for it
        self.off_set = set(side_off)
        self._kinds: dict[tuple[object, ...], tuple[datetime | None, list[Slot]]] | None = None
        self.too_dear: set[tuple[object, ...]] = set()
        """Kinds of side node (capacity, price, boot time, expected ready) that the
        pending queue did not pay for in this plan."""
        self.types: dict[str, InstanceType] = {}

    def place(self, c: ContainerView, ask: Ask, shape: Shape) -> None:
        """A container no ready node takes: capacity coming up, or new capacity (at once,
        one container at a time; for the queue as a whole, in `run`)."""
        p = _Pending(c, ask, shape)
        if not self.rules.queue_launch:
            self._one(p)
            return
        if self._join_waking(p) or self._join_freeing(p):
            return
        self.pending.append(p)
        self.groups.setdefault(shape, []).append(p)

    def _wait(self, p: _Pending) -> Patience:
        if p.wait is None:
            p.wait = patience(p.c, p.ask, self.rules, self.cloud, self.now)
        return p.wait

    def run(self) -> None:
        """New capacity for the queue as a whole, head first (module docstring); the
        creates and the due time into the plan."""
        # without side nodes in play, a shape that found no room and no new node finds none
        # later in the plan either (room only shrinks, the limits only tighten)
        exhausted: set[Shape] | None = set() if not (self.off or self.waking) else None
        for p in self.pending:
            if p.done:
                continue
            if exhausted is not None and p.shape in exhausted:
                self._nothing(p)
                continue
            if (
                self._join_waking(p)
                or self._wake_for_queue(p)
                or self._join_coming(p)
                or self._open_vm_best(p)
            ):
                continue
            if exhausted is not None:
                exhausted.add(p.shape)
            self._nothing(p)
        self.result.creates = [
            Create(self.types[name].name, tuple(uuids)) for name, uuids in self.members.items()
        ]
        self.result.due = min((t for t in self.due if t > self.now), default=None)

    def _one(self, p: _Pending) -> None:
        """Earlier releases: a waking side node, an off one worth waking, a VM coming up
        (or created this plan), a new VM of the cheapest available type -- at once."""
        if self._join_waking(p) or self._wake_one(p):
            return
        if p.ask.choice.outcome is ChoiceOutcome.NO_FIT:
            self._no_type(p)
            return
        if not (self._join_coming(p) or self._create_one(p)):
            self._why_no_node(p)

    def _nothing(self, p: _Pending) -> None:
        if p.ask.choice.outcome is ChoiceOutcome.NO_FIT:
            self._no_type(p)
        else:
            self._why_no_node(p)

    # -- capacity coming up ---------------------------------------------------------------

    def _join_waking(self, p: _Pending) -> bool:
        """A side node waking (or woken by this plan) with room whose wake the container's
        wait budget allows; earliest expected first under best fit."""
        if not self.waking:
            return False
        ask = p.ask
        fits = [s for s in self.waking if s.fits(ask.need) and ask.takes(s, self.rules)]
        if not fits:
            return False
        if self.rules.best_fit:
            fits.sort(key=lambda s: _earliest(expected_ready(s.view, self.now)[0], s.view.name))
        wait = self._wait(p)
        for slot in fits:
            self._due(p, slot.view)
            ready, _ = expected_ready(slot.view, self.now)
            if wait.allows(ready, off=slot.view.state is NodeState.OFF):
                self._to_side(slot, [p])
                return True
        return False

    def _join_freeing(self, p: _Pending) -> bool:
        """A ready node whose room comes back soon (containers being cancelled there)
        before the container's wait budget ends (the budget's lever on: earlier releases
        never waited for it); waited for until then, and judged again then."""
        if self.rules.wait_budget is None:
            return False
        if self.freeing is None:
            self.freeing = [s for s in self.ready if s.soon is not None]
        if not self.freeing:
            return False
        ask = p.ask
        for slot in self.freeing:
            at = slot.soon_at
            if at is None or at <= self.now:
                continue  # overdue: not waited for
            if not (slot.fits_soon(ask.need) and ask.takes(slot, self.rules)):
                continue
            wait = self._wait(p)
            if not wait.allows(at):
                continue
            slot.take(ask.need)  # below zero until it is back: nothing else starts there
            p.done = True
            self.result.waits[p.c.uuid] = freeing_status(slot.view.name, wait)
            self.result.wait_nodes[p.c.uuid] = slot.view.name
            self.due.append(at)
            return True
        return False

    def _join_coming(self, p: _Pending) -> bool:
        """A VM coming up (or created by this plan) with room: best fit; earlier, the
        first of a fitting type, in the order of the container's candidate types."""
        if self.rules.best_fit:
            slot = self.arriving.first(p.ask, p.shape, self.rules)
        else:
            slot = self._first_of_candidates(p)
        if slot is None:
            return False
        slot.take(p.ask.need)
        if slot.view.name in self.members:
            self._to_vm(slot, [p])
        else:
            uuid = p.c.uuid
            p.done = True
            name = slot.view.instance_type or ""
            self.result.waits[uuid] = f"waiting for a new {name} to boot"
            self.result.wait_nodes[uuid] = slot.view.name
            self.result.chosen_types[uuid] = name
        return True

    def _first_of_candidates(self, p: _Pending) -> Slot | None:
        need = p.ask.need
        for type_name in p.ask.candidates:
            pool = self.coming_by_type.get(type_name, [])
            memo = (type_name, p.shape)
            for index in range(self.scan_from.get(memo, 0), len(pool)):
                if pool[index].fits(need):
                    self.scan_from[memo] = index
                    return pool[index]
            self.scan_from[memo] = len(pool)
        return None

    # -- the queue as a whole -------------------------------------------------------------

    def _wake_for_queue(self, p: _Pending) -> bool:
        """Wake the side node (off) that costs least per container-hour for `p` and the
        pending containers that would fill it, when it is worth it: `p` has no
        alternative; or, priced per resource, its share of the node is cheaper than its
        own type and the whole node costs no more than the price factor allows even if
        nothing else comes (a GPU server for one GPU job); or the pending containers on it
        would pay more for their own types than it costs (a burst onto one large server).
        Priced per node (earlier releases): only a node no dearer per hour than `p`'s
        type. Tried before a VM coming up takes `p`: the containers woken for it wait for
        it on the next plans too (waking nodes come first), the VMs nobody waits for any
        more fall idle."""
        if not self.off:
            return False
        ask = p.ask
        factor = self.type_policy.price_factor
        alternative = ask.choice.instance_type is not None and self.cloud.creates_blocked is None
        own = ask.choice.instance_type.price if ask.choice.instance_type is not None else None
        options: list[_Option] = []
        for kind, ready, alike in self._off_kinds():
            side = next((s for s in alike if s in self.off_set and s.fits(ask.need)), None)
            if side is None or not ask.admits(side, self.rules):
                continue
            view = side.view
            if not self.rules.per_resource_price:
                alone = own is None or view.price <= own
                if not alone:
                    continue
            else:
                alone = (
                    own is not None
                    and share_price(side, ask.need, self.rules) <= own
                    and view.price <= own * factor + 1e-9
                )
            if alternative and not alone and kind in self.too_dear:
                continue
            if not self._wait(p).allows(ready, off=True):
                self._due(p, view)
                continue
            option = self._fill(p, Slot(view), None, ready)
            option.ready = ready
            if not alternative or alone or option.ratio <= 1 + 1e-9:
                options.append(option)
            else:
                # the pending containers after `p` are fewer still: not worth it this plan
                self.too_dear.add(kind)
        if not options:
            return False
        best = min(options, key=_Option.key)
        side = next(s for s in self.off if s.view.name == best.slot.view.name)
        for member in best.members:
            side.take(member.ask.need)
        self._open_side(side, best.members)
        return True

    def _off_kinds(self) -> list[tuple[tuple[object, ...], datetime | None, list[Slot]]]:
        """The side nodes still off, by kind (capacity, price, boot time seen, expected
        ready): nodes of one kind are alike, so each head looks at a kind once."""
        if self._kinds is None:
            self._kinds = {}
            for slot in self.off:
                view = slot.view
                ready, _ = expected_ready(view, self.now)
                key: tuple[object, ...] = (view.capacity, view.price, view.boot_seconds, ready)
                self._kinds.setdefault(key, (ready, []))[1].append(slot)
        out: list[tuple[tuple[object, ...], datetime | None, list[Slot]]] = []
        for kind, (expected, slots) in self._kinds.items():
            while slots and slots[0] not in self.off_set:
                slots.pop(0)
            if slots:
                out.append((kind, expected, slots))
        return out

    def _open_vm_best(self, p: _Pending) -> bool:
        """Create the instance type that costs least per container-hour for `p` and the
        pending containers that fit beside it (within the price factor)."""
        ask = p.ask
        if ask.choice.outcome is ChoiceOutcome.NO_FIT or self.cloud.creates_blocked is not None:
            return False
        options: list[_Option] = []
        for itype in sorted(self.catalogue.types, key=preference_key):
            if misfit(itype, ask.need) is not None or self._limit(itype) is not None:
                continue
            slot = Slot(new_view(itype, len(self.members) + 1))
            if not ask.admits(slot, self.rules):
                continue
            option = self._fill(p, slot, itype, None)
            if option.ratio <= self.type_policy.price_factor + 1e-9:
                options.append(option)
        if not options:
            return False
        best = min(options, key=_Option.key)
        assert best.itype is not None
        self._open_vm(best.slot, best.itype, best.members)
        return True

    def _fill(
        self,
        head: _Pending,
        slot: Slot,
        itype: InstanceType | None,
        ready: datetime | None,
    ) -> _Option:
        """`slot` filled with the head and the pending containers that fit beside it,
        shape by shape in queue order (a side node expected `ready`: those whose wait
        budget allows it); its price over what they would pay alone."""
        price = slot.view.price
        members = [head]
        slot.take(head.ask.need)
        value = self._value(head, price)
        for shape in [head.shape, *(s for s in self.groups if s != head.shape)]:
            group = self.groups[shape]
            ask = group[0].ask
            if not ask.admits(slot, self.rules):
                continue
            room = slot.count(ask.need)
            for q in group:
                if room <= 0:
                    break
                if (
                    q.done
                    or q is head
                    or (ready is not None and not self._wait(q).allows(ready, True))
                ):
                    continue
                slot.take(ask.need)
                members.append(q)
                value += self._value(q, price)
                room -= 1
        ratio = price / value if value > 0 else (0.0 if price <= 0 else float("inf"))
        return _Option(ratio, members, slot, itype)

    @staticmethod
    def _value(p: _Pending, price: float) -> float:
        """What a container would pay per hour on its own cheapest type (one that no type
        fits pays for the side node it needs)."""
        return p.ask.standalone if p.ask.standalone is not None else price

    # -- one container at a time (earlier releases) ---------------------------------------

    def _wake_one(self, p: _Pending) -> bool:
        cheapest = p.ask.choice.instance_type
        for slot in self.off:
            if not (slot.fits(p.ask.need) and p.ask.admits(slot, self.rules)):
                continue
            if cheapest is not None and share_price(slot, p.ask.need, self.rules) > cheapest.price:
                continue
            ready, _ = expected_ready(slot.view, self.now)
            if not self._wait(p).allows(ready, off=True):
                self._due(p, slot.view)
                continue
            slot.take(p.ask.need)
            self._open_side(slot, [p])
            return True
        return False

    def _create_one(self, p: _Pending) -> bool:
        chosen = p.ask.choice.instance_type
        if self.cloud.creates_blocked is not None or chosen is None or self._limit(chosen):
            return False
        slot = Slot(new_view(chosen, len(self.members) + 1))
        slot.take(p.ask.need)
        self._open_vm(slot, chosen, [p])
        return True

    # -- opening and joining --------------------------------------------------------------

    def _open_vm(self, slot: Slot, itype: InstanceType, members: list[_Pending]) -> None:
        name = slot.view.name
        self.types[name] = itype
        self.members[name] = []
        self.arriving.add(slot)
        self.coming_by_type.setdefault(itype.name, []).append(slot)
        self.fleet.created(itype)
        self._to_vm(slot, members)

    def _to_vm(self, slot: Slot, members: list[_Pending]) -> None:
        itype = self.types[slot.view.name]
        for member in members:
            member.done = True
            uuid = member.c.uuid
            self.members[slot.view.name].append(uuid)
            self.result.waits[uuid] = f"waiting for a new {itype.name} to boot"
            self.result.chosen_types[uuid] = itype.name

    def _open_side(self, slot: Slot, members: list[_Pending]) -> None:
        self.off.remove(slot)
        self.off_set.discard(slot)
        self.waking.append(slot)  # later containers pack into it first
        self.result.wakes[slot.view.name] = []
        self._to_side(slot, members, taken=True)

    def _to_side(self, slot: Slot, members: list[_Pending], taken: bool = False) -> None:
        name = slot.view.name
        for member in members:
            if not taken:
                slot.take(member.ask.need)
            member.done = True
            uuid = member.c.uuid
            wait = self._wait(member)
            cheaper = percent_cheaper(
                share_price(slot, member.ask.need, self.rules), member.ask.standalone
            )
            if name in self.result.wakes:  # woken by this plan: count it as its demand
                self.result.wakes[name].append(uuid)
            self.result.waits[uuid] = side_status(name, wait, cheaper)
            self.result.wait_nodes[uuid] = name
            self._due(member, slot.view)

    def _due(self, p: _Pending, view: NodeView) -> None:
        due = self._wait(p).due(view, self.now)
        if due is not None:
            self.due.append(due)

    # -- why nothing was opened -----------------------------------------------------------

    def _limit(self, itype: InstanceType) -> str | None:
        return limit_reason(itype, self.limits, self.fleet)

    def _why_no_node(self, p: _Pending) -> None:
        why, chosen = no_node_reason(p.ask, self.limits, self.cloud, self.fleet)
        self.result.waits[p.c.uuid] = why
        if chosen is not None:
            self.result.chosen_types[p.c.uuid] = chosen

    def _no_type(self, p: _Pending) -> None:
        """No instance type fits: a side node that is busy, off or booting may still take
        it later; else nothing ever can."""
        ask = p.ask
        later = next(
            (s for s in self.side_all if Slot(s.view).fits(ask.need) and ask.admits(s, self.rules)),
            None,
        )
        if later is not None:
            self.result.waits[p.c.uuid] = f"waiting for side node {later.view.name}"
        else:
            self.result.unsatisfiable[p.c.uuid] = (
                f"no instance type or side node fits: {ask.choice.reason}"
            )


def _earliest(ready: datetime | None, name: str) -> tuple[bool, datetime | None, str]:
    """Sort key: expected ready first, earliest first (a hung wake last)."""
    return (ready is None, ready, name)
