"""Consolidation by drain in the simulator, through the live rule
(`rules.consolidation.assess`, `within_budget`) and the live state machine.

As in the operator (`power.consolidating`): a node whose work changed (a container
started or ended on it) is due `consolidateAfter` later -- a scheduled event, never a
scan per step; a lightly used node whose work did not fit elsewhere, or that the budget
kept waiting, is due again `recheckAfter` later. A node the rule says to drain, within
the policy's budget (`maxConcurrent` draining at once), gets the consolidation fact
(`NodeFacts.consolidation`) and an evaluation: the real machine closes its admission
(DRAIN, CONSOLIDATION_DRAIN); its running containers finish (never evicted) and the
usual idle path applies. It leaves the budget once its work has ended; the fact goes
when the node is off or gone, or when queued work only it could ever run waits
(`rules.consolidation.demand_lets_go`), and its admission reopens.

Only mode On changes what is simulated (Shadow records in the operator and changes
nothing here); `drains` counts the decisions, for the report.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from nodewarden.api.consolidation import Consolidation
from nodewarden.policy.state import PowerState
from nodewarden.rules.consolidation import (
    RECHECKED,
    assess,
    consolidation_reading,
    demand_lets_go,
    within_budget,
)
from nodewarden.scheduling.instancetypes import Catalogue, InstanceTypePolicy
from nodewarden.scheduling.placement import PlacementRules
from nodewarden.scheduling.views import ContainerView, NodeView
from nodewarden.simulate.distributions import to_us
from nodewarden.simulate.nodes import MachineNode


class World(Protocol):
    """What consolidation asks of the simulation (`Simulation` implements it)."""

    now: int
    nodes: dict[str, MachineNode]
    _catalogue: Catalogue
    _type_policy: InstanceTypePolicy

    def at(self, us: int) -> Any: ...
    def _schedule(self, t: int, fn: Callable[[Any], None], arg: Any = None) -> None: ...
    def _evaluate(self, node: MachineNode) -> None: ...


class SimConsolidation:
    """See the module docstring."""

    def __init__(
        self,
        world: World,
        settings: Consolidation,
        views: Callable[[], list[NodeView]],
        held: Callable[[], list[ContainerView]],
        rules: PlacementRules,
        queued: Callable[[MachineNode], int],
        stuck: Callable[[MachineNode], int] | None = None,
    ) -> None:
        self.w = world
        self.settings = settings
        self.active = settings.mode == "On"
        self._views = views
        self._held = held
        self._rules = rules
        self._queued = queued
        self._stuck = stuck
        """Queued containers only the node could ever run (`rules.consolidation.only_here`)."""
        self._after = to_us(settings.consolidate_after)
        self._recheck = to_us(settings.recheck_after)
        self._token: dict[str, int] = {}
        self.draining: set[str] = set()
        self.drains = 0
        """Consolidation drains decided (the report's figure)."""

    def work_changed(self, node: MachineNode) -> None:
        """A container started or ended on `node`: it is due `consolidateAfter` later (a
        node draining whose work ended leaves the budget)."""
        if not self.active:
            return
        if not node.work.running:
            self.draining.discard(node.name)
            return
        self._due_in(node, self._after)

    def _due_in(self, node: MachineNode, delay: int) -> None:
        token = self._token.get(node.name, 0) + 1
        self._token[node.name] = token
        self.w._schedule(self.w.now + delay, self._due, (node, token))

    def touched(self, node: MachineNode) -> None:
        """A step of `node`: off (or leaving), its consolidation fact goes; queued work
        that fits it may let it go (`_demand`)."""
        if node.facts.consolidation is None:
            return
        if node.state.state is PowerState.OFF:
            node.facts = node.facts.model_copy(update={"consolidation": None})
            self.draining.discard(node.name)
            return
        self._demand(node)

    def _demand(self, node: MachineNode) -> None:
        """Queued work only `node` could ever run lets it go (`demand_lets_go`)."""
        if self._stuck is None or demand_lets_go(self._stuck(node)) is None:
            return
        self.draining.discard(node.name)
        node.facts = node.facts.model_copy(update={"consolidation": None})
        self.w._schedule(self.w.now, self._reopen, node)

    def _reopen(self, node: MachineNode) -> None:
        if self.w.nodes.get(node.name) is node:
            self.w._evaluate(node)

    def _due(self, arg: tuple[MachineNode, int]) -> None:
        node, token = arg
        if self._token.get(node.name) != token or self.w.nodes.get(node.name) is not node:
            return
        if node.facts.consolidation is not None or not node.work.running:
            return
        views = self._views()
        view = next((v for v in views if v.name == node.name), None)
        if view is None:
            return
        now = self.w.at(self.w.now)
        answer = assess(
            view,
            False,
            self._held(),
            views,
            self.settings,
            self.w._catalogue,
            self.w._type_policy,
            now,
            self._rules,
            self._queued(node),
        )
        if not answer.drain:
            if answer.code in RECHECKED:
                self._due_in(node, self._recheck)
            return
        if not within_budget(self.draining, self.settings):
            self._due_in(node, self._recheck)
            return
        self.draining.add(node.name)
        self.drains += 1
        reading = consolidation_reading(answer, "simulator: rules.consolidation", now)
        node.facts = node.facts.model_copy(update={"consolidation": reading})
        self.w._evaluate(node)
