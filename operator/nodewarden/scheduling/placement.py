"""The placement levers (issue 25) and the pure pieces the scheduler places with.

`PlacementRules` is what a PowerPolicy's `spec.placement` asks for, as plain values
(`PlacementRules.of`); `EARLIER` is every lever switched back to the behaviour of
earlier releases. The levers:

- best fit (`best_fit`): a container goes to the fullest ready node that takes it
  (`Ask.takes`: a VM of one of its fitting types, a side node whose share for it costs
  no more; `BestFit`: the nodes in order of fullness, fullest first, then cheaper, then
  name), so work gathers on busy nodes and the emptier ones fall idle. Not onto a VM of
  any type with room: extending a large VM for a small container costs the whole VM's
  price (measured dearer on the bursty week, docs/simulation.md "Placement");
- the queue as a whole (`queue_launch`): new capacity is chosen for the pending queue
  (`scheduling.launch`), not one cheapest node per container;
- GPU capacity last (`gpu_last`): a container that asks for no GPU goes to a node or
  type with GPUs only when nothing without GPUs could ever fit it (`Ask.gpu_anywhere`);
- side nodes priced per resource (`per_resource_price`): a side node's price is set
  against the share of it a container takes (`dominant_share`), and for an off one
  against the pending containers that would fill it;
- the wait budget (`wait_budget`, `no_wait_above`): how much longer than on a new VM a
  container may wait for cheaper capacity (`scheduling.waiting`).

`Ask` is what one container shape asks of the plan (its requirements, its instance-type
choice, the price of its cheapest fitting type), computed once per shape and plan.
Pure: values in, values out.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta

from nodewarden.api.powerpolicy import PlacementPolicy
from nodewarden.scheduling.instancetypes import InstanceTypeChoice, Requirements
from nodewarden.scheduling.slots import Slot, amounts
from nodewarden.scheduling.views import Capacity
from nodewarden.units import parse_duration


@dataclass(frozen=True, slots=True)
class PlacementRules:
    """The placement levers as plain values (module docstring)."""

    best_fit: bool = True
    queue_launch: bool = True
    gpu_last: bool = True
    per_resource_price: bool = True
    wait_budget: timedelta | None = timedelta(minutes=2)
    """None: a container waits for a waking side node however long it takes (earlier
    releases)."""
    no_wait_above: int = 900
    """Containers with a priority above this never wait for cheaper capacity."""

    @classmethod
    def of(cls, spec: PlacementPolicy) -> PlacementRules:
        return cls(
            best_fit=spec.packing == "BestFit",
            queue_launch=spec.launch == "Queue",
            gpu_last=spec.gpu_capacity == "LastResort",
            per_resource_price=spec.side_node_price == "PerResource",
            wait_budget=(
                parse_duration(spec.wait_budget)
                if spec.wait_for_cheaper == "WithinBudget"
                else None
            ),
            no_wait_above=spec.no_wait_above_priority,
        )

    def budget(self, priority: int) -> timedelta | None:
        """How much longer than on a new VM a container of `priority` may wait for
        cheaper capacity (None: without limit)."""
        if self.wait_budget is None:
            return None
        return timedelta(0) if priority > self.no_wait_above else self.wait_budget


EARLIER = PlacementRules(
    best_fit=False,
    queue_launch=False,
    gpu_last=False,
    per_resource_price=False,
    wait_budget=None,
    no_wait_above=1000,
)
"""Every lever switched off: placement as in the releases before issue 25."""


@dataclass(frozen=True, slots=True)
class Ask:
    """What one container shape asks of a plan (computed once per shape)."""

    need: Requirements
    choice: InstanceTypeChoice
    candidates: tuple[str, ...]
    """Type names within the price factor of the cheapest fit (the choice's candidates)."""
    standalone: float | None
    """Price per hour of its cheapest fitting type (whether or not it is available now);
    None when no type fits: only a side node can run it."""
    gpu_anywhere: bool
    """It may go to a node or type with GPUs: it asks for GPUs, or (GPU capacity last)
    nothing without GPUs could ever fit it."""
    price_ceiling: float | None = None
    """`standalone` times the price factor: what its share of a node may cost at most
    (per resource); None: no type fits, any price."""

    def takes(self, slot: Slot, rules: PlacementRules) -> bool:
        """`slot` (a node that is up or coming up) may run this shape; capacity is
        `Slot.fits`. The GPU rule; a VM of one of its fitting types (the types a new node
        for it would be chosen from: within the price factor of its cheapest); a side
        node, priced per resource, whose share for it costs no more than that -- so a
        small container does not keep a large dear node on."""
        if not self.admits(slot, rules):
            return False
        view = slot.view
        if view.instance_type is not None:
            return view.instance_type in self.candidates
        ceiling = self.price_ceiling
        if not rules.per_resource_price or ceiling is None:
            return True
        return view.price * dominant_share(view.capacity, self.need) <= ceiling + 1e-12

    def admits(self, slot: Slot, rules: PlacementRules) -> bool:
        """The GPU rule: whether `slot` may take this shape (capacity is `Slot.fits`). A
        node whose admission is open to GPU work only (`NodeView.gpu_only`) takes a
        CPU-only shape only when nothing without GPUs could ever fit it, whatever the
        levers."""
        if self.need.gpus > 0 or slot.view.capacity.gpus == 0:
            return True
        if slot.view.gpu_only:
            return self.gpu_anywhere
        if rules.gpu_last:
            return self.gpu_anywhere
        return slot.view.instance_type is not None  # earlier: GPU side nodes for GPU work only


def cpu_needs_gpu(
    need: Requirements, types_fit_without_gpu: bool, side: Iterable[Capacity]
) -> bool:
    """Nothing without GPUs could ever fit `need` (no catalogue type without GPUs, no side
    node without GPUs by its whole capacity): only then may CPU-only work use GPUs."""
    if types_fit_without_gpu:
        return False
    return not any(cap.gpus == 0 and holds(cap, need) for cap in side)


def holds(cap: Capacity, need: Requirements) -> bool:
    """A node of capacity `cap`, empty, could run `need`."""
    return (
        need.vcpus <= cap.vcpus
        and need.ram <= cap.ram
        and need.scratch <= cap.scratch
        and need.gpus <= cap.gpus
        and cap.preemptible == need.preemptible
    )


def dominant_share(cap: Capacity, need: Requirements) -> float:
    """The share of a node a container takes: its largest share of any resource the node
    offers (vCPUs, RAM, scratch, GPUs)."""
    offers = (cap.vcpus, cap.ram, cap.scratch, cap.gpus)
    pairs = zip(amounts(need), offers, strict=True)
    shares = [asked / offered for asked, offered in pairs if offered > 0]
    return min(1.0, max(shares, default=1.0))


def share_price(slot: Slot, need: Requirements, rules: PlacementRules) -> float:
    """What running `need` on a side node costs per hour: its dominant share of the node's
    price (per resource), or the whole price (per node, earlier releases)."""
    price = slot.view.price
    return price * dominant_share(slot.view.capacity, need) if rules.per_resource_price else price


def _fullest_first(slot: Slot) -> tuple[float, float, str]:
    return (-slot.fullness(), slot.view.price, slot.view.name)


class BestFit:
    """Nodes in order of fullness when the pool is made (fullest first, then cheaper,
    then name); `first` is the first that fits and takes a shape (`Ask.takes`).

    During one plan capacity only shrinks, so the nodes before a shape's scan mark are
    known not to take it and scans resume there; a node that takes work only grows
    fuller, so the next container of the shape fills it first."""

    __slots__ = ("_from", "slots")

    def __init__(self, slots: Iterable[Slot]) -> None:
        self.slots: list[Slot] = sorted(slots, key=_fullest_first)
        self._from: dict[object, int] = {}

    def add(self, slot: Slot) -> None:
        """A node opened during the plan (scanned after the others)."""
        self.slots.append(slot)

    def first(self, ask: Ask, shape: object, rules: PlacementRules) -> Slot | None:
        slots = self.slots
        start = self._from.get(shape, 0)
        if start >= len(slots):
            return None
        need = ask.need
        for index in range(start, len(slots)):
            slot = slots[index]
            if slot.fits(need) and ask.takes(slot, rules):
                self._from[shape] = index
                return slot
        self._from[shape] = len(slots)
        return None
