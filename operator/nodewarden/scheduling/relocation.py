"""Could these containers run on other open nodes, and where: the placement query that
consolidation by drain asks (pure).

`relocation(moving, held, nodes, ...)` answers for the containers `moving` (say, those
running on a node that might stop admitting work) where each would go if it were queued
now, on the other ready, open nodes only -- beside everything the capacity ledger holds
there (`held`: its Running and Locked views, `scheduling.ledger`) -- by the scheduler's
own rules and levers: it is `scheduling.scheduler.plan` with the moving containers
queued, the nodes they leave and every node not ready and open left out, and no create
or wake allowed. Nothing is placed or changed: the answer is a value.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from nodewarden.scheduling.instancetypes import Catalogue, InstanceTypePolicy
from nodewarden.scheduling.placement import PlacementRules
from nodewarden.scheduling.scheduler import plan
from nodewarden.scheduling.views import (
    USABLE_NOW,
    CloudState,
    ContainerView,
    Limits,
    NodeView,
    Phase,
)

_NO_NEW_NODES = CloudState(creates_blocked="a placement query creates nothing", max_new_nodes=0)


@dataclass(frozen=True, slots=True)
class Relocation:
    """Where each moving container would go (`targets`: uuid -> node), and those no other
    open node can take now (`unplaced`)."""

    targets: dict[str, str]
    unplaced: tuple[str, ...]

    @property
    def fits(self) -> bool:
        """Every moving container has a place elsewhere."""
        return not self.unplaced


def relocation(
    moving: Sequence[ContainerView],
    held: Iterable[ContainerView],
    nodes: Iterable[NodeView],
    leaving: Collection[str],
    catalogue: Catalogue,
    type_policy: InstanceTypePolicy,
    now: datetime,
    rules: PlacementRules | None = None,
) -> Relocation:
    """Where `moving` would go on the ready, open nodes other than `leaving` (module
    docstring). `held` may include the moving containers and anything on the leaving
    nodes: both are left out of what holds capacity."""
    names = {c.uuid for c in moving}
    open_nodes = [
        n
        for n in nodes
        if n.name not in leaving and n.state in USABLE_NOW and n.ready and n.admission_open
    ]
    kept = {n.name for n in open_nodes}
    # a lock whose runner never ran may be started again: it counts as holding
    holdings = [
        replace(c, runner_absent=False)
        for c in held
        if c.uuid not in names and c.phase is not Phase.QUEUED and c.node in kept
    ]
    queued = [replace(c, phase=Phase.QUEUED, node=None, runner_absent=False) for c in moving]
    result = plan(
        [*holdings, *queued],
        open_nodes,
        catalogue,
        type_policy,
        Limits(),
        _NO_NEW_NODES,
        now,
        rules,
    )
    targets = {s.uuid: s.node for s in result.starts if s.uuid in names}
    return Relocation(targets, tuple(c.uuid for c in moving if c.uuid not in targets))
