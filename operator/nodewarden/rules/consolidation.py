"""Consolidation by drain, never by eviction: which node should stop admitting new work,
and the evidence for it.

A node is a candidate when its work has stayed unchanged for `consolidateAfter` (the
shell keeps these due times; never a scan of the fleet). `assess` then answers, for one
node, in order (the first rule that holds is the verdict):

    rule                     holds when                                      verdict
    protected node           the node has the do-not-consolidate annotation  protected
    protected container      one of its containers has it                    protected
    not open                 not ready, open and running work: nothing to do not-candidate
    not lightly used         used share > maxUtilisation                     not-candidate
    demand waiting           queued containers it could take                 demand-waiting
    no room elsewhere        `scheduling.relocation` cannot place all of it  no-room
    not dear                 price per used share < minPriceRatio x where    not-dear
                             its work would go
    (otherwise)              drain: stop admitting, finish what it runs      drain

A `drain` verdict becomes the machine's DRAIN decision with reason code
CONSOLIDATION_DRAIN (`policy.reasons`); the other verdicts are not reason codes.

The used share is the largest share of the node's vCPUs, RAM or GPUs its containers hold;
the price per used share is the node's hourly price divided by it. The nodes its work
could go to are priced the same way after the move (their price over their used share
with the moved work); the dearest of them is the comparison (conservative).

`within_budget` bounds how many nodes of a policy drain for consolidation at once (the
consolidation budget, apart from the transition budget).

`demand_lets_go` ends a drain that no longer holds because queued work only this node
could ever run waits (`only_here`: no instance type fits it, no other side node's
capacity holds it): kept closed, the node would make it wait until its own work ends --
or for ever, once the node is idle and that demand keeps it on. Work that could run
elsewhere (capacity coming up, a cheaper node) does not undo a drain.

Pure: the live power controller (`power.consolidating`) and the simulator
(`simulate.consolidation`) call these same functions.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from nodewarden.api.consolidation import DO_NOT_CONSOLIDATE, Consolidation
from nodewarden.api.containerdispatch import ContainerResources
from nodewarden.policy.facts import ConsolidationReading
from nodewarden.scheduling.instancetypes import (
    Catalogue,
    InstanceTypePolicy,
    effective_requirements,
    misfit,
)
from nodewarden.scheduling.placement import PlacementRules, holds
from nodewarden.scheduling.relocation import relocation
from nodewarden.scheduling.views import USABLE_NOW, Capacity, ContainerView, NodeView, Phase

DRAIN = "drain"
PROTECTED = "protected"
NOT_CANDIDATE = "not-candidate"
NO_ROOM = "no-room"
NOT_DEAR = "not-dear"
DEMAND_WAITING = "demand-waiting"
RECHECKED = (NO_ROOM, NOT_DEAR, DEMAND_WAITING)
"""Verdicts looked at again `recheckAfter` later (the others wait for the node's work
to change)."""


def protected(annotations: Mapping[str, str] | None) -> bool:
    """Whether an object's annotations keep it out of consolidation."""
    if not annotations:
        return False
    return str(annotations.get(DO_NOT_CONSOLIDATE, "")).strip().lower() == "true"


@dataclass(frozen=True, slots=True)
class Assessment:
    """One node's verdict (`code`; `drain`: it should stop admitting) and its evidence."""

    node: str
    code: str
    why: str
    utilisation: float
    hourly_price: float
    price_per_used: float | None
    targets: Mapping[str, str]
    """uuid -> the node it would go to."""
    target_price_per_used: float | None
    containers: int

    @property
    def drain(self) -> bool:
        return self.code == DRAIN


def used_share(
    node: NodeView, containers: Iterable[ContainerView], policy: InstanceTypePolicy
) -> float:
    """The largest share of the node's vCPUs, RAM or GPUs the containers hold (0..1)."""
    cap = node.capacity
    vcpus = ram = gpus = 0
    for c in containers:
        if c.whole_node:
            return 1.0
        need = effective_requirements(c.resources, policy)
        vcpus, ram, gpus = vcpus + need.vcpus, ram + need.ram, gpus + need.gpus
    shares = [
        used / offered
        for used, offered in ((vcpus, cap.vcpus), (ram, cap.ram), (gpus, cap.gpus))
        if offered > 0
    ]
    return min(1.0, max(shares, default=1.0))


def _per_used(price: float, share: float) -> float | None:
    return price / share if share > 0 else None


def assess(
    node: NodeView,
    node_protected: bool,
    held: Sequence[ContainerView],
    nodes: Sequence[NodeView],
    settings: Consolidation,
    catalogue: Catalogue,
    type_policy: InstanceTypePolicy,
    now: datetime,
    rules: PlacementRules | None = None,
    queued: int = 0,
) -> Assessment:
    """The verdict on `node` (module docstring). `held`: the capacity ledger's containers
    (every node's), `nodes`: every node's view, `queued`: the queued containers that
    qualify for the node (its room is wanted now: no drain)."""
    mine = [c for c in held if c.node == node.name and c.phase is not Phase.QUEUED]
    share = used_share(node, mine, type_policy) if mine else 0.0
    price = node.price
    here = _per_used(price, share)

    def verdict(
        code: str,
        why: str,
        targets: Mapping[str, str] | None = None,
        there: float | None = None,
    ) -> Assessment:
        return Assessment(
            node.name,
            code,
            why,
            round(share, 4),
            price,
            here,
            dict(targets or {}),
            there,
            len(mine),
        )

    if node_protected:
        return verdict(PROTECTED, f"the node has {DO_NOT_CONSOLIDATE}")
    kept = [c.uuid for c in mine if c.do_not_consolidate]
    if kept:
        return verdict(PROTECTED, f"container {kept[0]} has {DO_NOT_CONSOLIDATE}")
    if not (node.state in USABLE_NOW and node.ready and node.admission_open) or not mine:
        return verdict(NOT_CANDIDATE, "not open and running work (the idle path applies)")
    if share > settings.max_utilisation:
        return verdict(
            NOT_CANDIDATE, f"used share {share:.2f} > maxUtilisation {settings.max_utilisation}"
        )
    if queued > 0:
        return verdict(DEMAND_WAITING, f"{queued} queued container(s) could run on it")
    answer = relocation(mine, held, nodes, {node.name}, catalogue, type_policy, now, rules)
    if not answer.fits:
        return verdict(NO_ROOM, f"no other open node can take {', '.join(answer.unplaced[:3])}")
    there = _dearest_target(answer.targets, mine, held, nodes, type_policy)
    if here is None or price <= 0:
        return verdict(NOT_DEAR, "the node costs nothing per hour", answer.targets, there)
    if there is not None and here < settings.min_price_ratio * there:
        return verdict(
            NOT_DEAR,
            f"{here:.4g}/h per used share is under {settings.min_price_ratio} x {there:.4g}/h "
            "where its work would go",
            answer.targets,
            there,
        )
    where = ", ".join(sorted(set(answer.targets.values())))
    return verdict(
        DRAIN,
        f"used {share:.0%} at {price:g}/h ({here:.4g}/h per used share); its "
        f"{len(mine)} container(s) fit on {where}",
        answer.targets,
        there,
    )


def _dearest_target(
    targets: Mapping[str, str],
    moving: Sequence[ContainerView],
    held: Sequence[ContainerView],
    nodes: Sequence[NodeView],
    type_policy: InstanceTypePolicy,
) -> float | None:
    """The highest price per used share among the nodes the work would go to, each with
    its own work and what would move there (None: no target has a price)."""
    by_name = {n.name: n for n in nodes}
    moved = {c.uuid: c for c in moving}
    worst: float | None = None
    for target in set(targets.values()):
        view = by_name.get(target)
        if view is None:
            continue
        there = [c for c in held if c.node == target and c.phase is not Phase.QUEUED]
        there += [moved[u] for u, t in targets.items() if t == target]
        value = _per_used(view.price, used_share(view, there, type_policy))
        if value is not None and (worst is None or value > worst):
            worst = value
    return worst


def consolidation_reading(
    answer: Assessment, source: str, at: datetime, budget: str = ""
) -> ConsolidationReading:
    """The machine's consolidation fact (the Safety Record's evidence) of a verdict."""
    return ConsolidationReading(
        source=source,
        observed_at=at,
        utilisation=answer.utilisation,
        hourly_price=answer.hourly_price,
        price_per_used=answer.price_per_used,
        target_price_per_used=answer.target_price_per_used,
        targets=dict(list(answer.targets.items())[:32]),
        why=answer.why[:1024],
        budget=budget[:256],
    )


def within_budget(draining: Collection[str], settings: Consolidation) -> bool:
    """Whether one more node of a policy may begin a consolidation drain: the nodes
    draining for consolidation (their work not yet ended) are fewer than the budget."""
    return len(draining) < settings.max_concurrent


def only_here(
    waiting: Iterable[ContainerResources],
    elsewhere: Iterable[Capacity],
    catalogue: Catalogue,
    type_policy: InstanceTypePolicy,
) -> int:
    """How many of `waiting` (queued containers that fit the node) nothing else could
    ever run: no instance type of the catalogue fits them and no other side node's
    whole capacity (`elsewhere`) holds them."""
    caps = tuple(elsewhere)
    count = 0
    for resources in waiting:
        need = effective_requirements(resources, type_policy)
        if any(misfit(t, need) is None for t in catalogue.types):
            continue
        if not any(holds(cap, need) for cap in caps):
            count += 1
    return count


def demand_lets_go(stuck: int) -> str | None:
    """Why queued work lets a node closed for consolidation go (None: the drain holds):
    `stuck` queued containers only it could ever run (`only_here`) wait -- closed, it
    would keep them waiting until its own work ends, or for ever once it is idle and
    that demand keeps it on (module docstring)."""
    if stuck <= 0:
        return None
    return f"{stuck} queued container(s) only this node can run wait"
