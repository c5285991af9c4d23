"""The power controller's side of consolidation by drain (`rules.consolidation`): which
nodes are candidates, when, within which budget, and the PowerIntent of each decision.

* Candidates are due times and dirty events, never a scan of the fleet: a node whose
  work changed in the dispatcher's ledger (`planned`: a container started or ended on
  it) is due `consolidateAfter` later; a lightly used node whose work did not fit
  elsewhere (or that the budget kept waiting) is due again `recheckAfter` later. `due`
  assesses only the nodes whose time came (the fleet's views are built once for them).
* On: a node `rules.consolidation.assess` says to drain, within its policy's budget
  (`maxConcurrent` nodes draining at once, apart from the transition budget), gets the
  consolidation fact (`NodeFacts.consolidation`, the evidence) and an evaluation: the
  state machine closes its admission and decides DRAIN (CONSOLIDATION_DRAIN); `drained`
  (called by the round on that step) creates a policy-made PowerIntent (action Drain)
  carrying the Safety Record. The node finishes what it runs; once the ledger holds no
  work on it, it leaves the budget (its intent Succeeded) and goes the usual idle way.
  Its admission stays closed until it is off (then the fact is cleared), unless the
  lever is switched off, the node or one of its containers is annotated
  do-not-consolidate, or queued work only it could ever run waits
  (`rules.consolidation.demand_lets_go`: kept closed it would wait until the node's work
  ends, or for ever once the node is idle and that demand keeps it on): the fact is
  cleared, admission reopens, its intent (if still open) is Aborted.
* A restart (or a new leader) resumes what was decided (`_resume`): the node's stored
  state names its Drain intent (`NodePowerState.consolidation`, set with the fact,
  cleared with it), so from its first step the node is back in the budget with the
  consolidation fact (a placeholder until the intent, read on its own watch, brings the
  evidence its record holds; an open intent alone resumes a node whose stored state
  predates the field), its admission -- restored Closed from `status.powerState` --
  stays closed, and the intent is driven to its end like any other: Succeeded once the ledger holds no work on the node (judged only after the
  dispatcher's first plan: before it no node's work is known), Aborted when the drain no
  longer holds (lever, annotation, the node gone). Likewise a Shadow record: a node
  whose latest one names a container the first ledger still holds on it is back in the
  Shadow budget (`shadowing`) and is not recorded again for the same work -- restarts
  do not pile up copies of one would-be drain, which would push the node's other
  records out of the finished intents kept per node.
* Shadow: the same choice within the same budget; the machine is stepped on a copy of
  the facts (nothing kept) and its record is written as a PowerIntent in phase Shadow.
* Off: nothing is assessed.

Calls nothing above it; the controller calls `planned`, `node_changed` and
`intent_seen`, the round `due` and `drained`.
"""

from __future__ import annotations

import heapq
import logging
from dataclasses import replace
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from nodewarden.api.consolidation import Consolidation
from nodewarden.policy.base import replaced
from nodewarden.policy.events import Evaluate
from nodewarden.policy.facts import ConsolidationReading
from nodewarden.policy.machine import step
from nodewarden.policy.reasons import Decision
from nodewarden.policy.record import SafetyRecord
from nodewarden.policy.state import PowerState
from nodewarden.power.context import PowerContext
from nodewarden.power.intents import Intent, policy_intent_name, record_fields, shadow_fields
from nodewarden.power.runtime import NodeRuntime, iso
from nodewarden.rules.consolidation import (
    RECHECKED,
    assess,
    consolidation_reading,
    demand_lets_go,
    only_here,
    protected,
    within_budget,
)
from nodewarden.rules.demand import node_view, side_capacities
from nodewarden.rules.nodeview import SIDE_STATE, admits, is_ready
from nodewarden.scheduling.views import ContainerView, NodeState, NodeView, Phase
from nodewarden.units import parse_duration

log = logging.getLogger(__name__)

DRAIN_REASON = "policy decision: CONSOLIDATION_DRAIN"
"""`spec.reason` of the Drain intents consolidation opens (how a restart finds them)."""
SHADOW_REASON = "consolidation in Shadow: not acted on"
"""`spec.reason` of the records (phase Shadow) of what On would have done."""


def consolidation_drain(intent: Intent) -> bool:
    """A policy-made Drain intent that consolidation opened (not a Shadow record)."""
    return intent.source == "Policy" and intent.action == "Drain" and intent.reason == DRAIN_REASON


class PowerConsolidation:
    """See the module docstring."""

    def __init__(self, ctx: PowerContext) -> None:
        self.ctx = ctx
        self.held: list[ContainerView] = []
        """The dispatcher's last ledger."""
        self._work: dict[str, frozenset[tuple[str, bool]]] = {}
        """node -> the (uuid, do-not-consolidate) the last ledger held on it."""
        self._heap: list[tuple[datetime, str]] = []
        self._due: dict[str, datetime] = {}
        self.draining: dict[str, set[str]] = {}
        """policy -> nodes draining for consolidation (On) whose work has not ended."""
        self.shadowing: dict[str, set[str]] = {}
        """policy -> nodes a Shadow lever would have drained, their work not ended."""
        self.closed: dict[str, str] = {}
        """node -> its policy: nodes holding the consolidation fact (admission closed)."""
        self.intents: dict[str, str] = {}
        """node -> the name of its Drain intent (On) while it drains."""
        self.assessed = 0
        """Nodes assessed so far (the at-rest test counts them)."""
        self._annotated: dict[str, bool] = {}
        """node -> whether its WorkerNode carries the do-not-consolidate annotation."""
        self._to_resume: dict[str, str] = {}
        """node -> an open consolidation Drain intent seen before its node (`resumed`)."""
        self._tids: dict[str, str] = {}
        """node -> the transition id of the Drain intent `drained` is to create."""
        self._shadowed: dict[str, tuple[datetime, frozenset[str]]] = {}
        """node -> its latest Shadow record seen before the first ledger: when, and the
        containers it would have moved (resumed in `shadowing` at the first ledger)."""
        self._ledger = False
        """The dispatcher's ledger came at least once: a node's work is known (until then
        a resumed drain is never taken for over)."""

    @property
    def next_due(self) -> datetime | None:
        while self._heap and self._due.get(self._heap[0][1]) != self._heap[0][0]:
            heapq.heappop(self._heap)  # stale entry
        return self._heap[0][0] if self._heap else None

    def _push(self, name: str, at: datetime) -> None:
        current = self._due.get(name)
        if current is not None and current <= at:
            return
        self._due[name] = at
        heapq.heappush(self._heap, (at, name))

    def _settings(self, rt: NodeRuntime) -> Consolidation:
        return self.ctx.policy(rt).spec.consolidation

    # -- the dispatcher's ledger: dirty nodes ------------------------------------------

    def planned(self, containers: list[ContainerView], now: datetime) -> None:
        """The dispatcher's ledger: a node whose work changed is due `consolidateAfter`
        later; a draining node whose work ended leaves the budget."""
        self.held = containers
        first, self._ledger = not self._ledger, True
        work: dict[str, set[tuple[str, bool]]] = {}
        for c in containers:
            if c.node is not None and c.phase is not Phase.QUEUED:
                # an annotation put on or taken off a container makes its node dirty too
                work.setdefault(c.node, set()).add((c.uuid, c.do_not_consolidate))
        # a node the controller does not hold yet is left out: it is dirty when it comes
        nodes = self.ctx.nodes
        after = {name: frozenset(uuids) for name, uuids in work.items() if name in nodes}
        before, self._work = self._work, after
        if first:
            self._resume_shadows()
        for name in before.keys() | after.keys():
            if before.get(name) == after.get(name):
                continue
            rt = self.ctx.nodes.get(name)
            if rt is None or rt.spec is None:
                continue
            settings = self._settings(rt)
            if settings.mode == "Off":
                continue
            if name in after:
                self._push(name, now + parse_duration(settings.consolidate_after))
        self._release(now)

    def node_changed(self, name: str, now: datetime) -> None:
        """A WorkerNode event: when its do-not-consolidate annotation changed, a node with
        work is due again, and one drained for consolidation is let go if it is
        annotated now (other events -- status echoes among them -- change nothing)."""
        self._resume(name, now)
        rt = self.ctx.nodes.get(name)
        if rt is None or rt.spec is None:
            return
        annotated = protected(rt.meta.get("annotations"))
        if self._annotated.get(name, False) == annotated:
            return
        self._annotated[name] = annotated
        if not self._work.get(name):
            return
        settings = self._settings(rt)
        if settings.mode != "Off":
            self._push(name, now + parse_duration(settings.consolidate_after))
        if name in self.closed and self._protected(rt):
            self._release(now)

    # -- a restart: the open Drain intents resumed ----------------------------------------

    def intent_seen(self, name: str, now: datetime) -> None:
        """A PowerIntent event: an open consolidation Drain intent this controller does not
        hold (a restart, a new leader) is resumed (module docstring), at once when its
        node is known, else when the node comes; a node resumed from its stored state
        gets the evidence of its intent once read; a Shadow record seen before the first
        ledger is noted for `_resume_shadows`."""
        intent = self.ctx.intents.intents.get(name)
        if intent is None:
            return
        if not self._ledger and _shadow_record(intent):
            seen = self._shadowed.get(intent.node)
            if seen is None or seen[0] < intent.created:
                self._shadowed[intent.node] = (intent.created, _moved(intent))
            return
        if not consolidation_drain(intent):
            return
        node = intent.node
        rt = self.ctx.nodes.get(node)
        if self.intents.get(node) == name:
            # held: resumed from the node's stored state before its intent was read
            if rt is not None and intent.settled:
                self._intent_ended(rt, intent)
            elif rt is not None and _placeholder(rt.facts.consolidation):
                rt.facts = replaced(rt.facts, {"consolidation": _stored_reading(intent, now)})
            return
        if intent.settled:
            return
        self._to_resume[node] = name
        self._resume(node, now)

    def intent_deleted(self, name: str) -> None:
        """A consolidation Drain intent deleted (a person cancelling the drain): its node
        is let go -- the fact cleared, admission reopens after the usual verification.
        O(nodes held), a handful."""
        node = next((n for n, held in self.intents.items() if held == name), None)
        if node is None:
            return
        log.info("WorkerNode %s: its consolidation drain %s was deleted; let go", node, name)
        self.intents.pop(node, None)
        self._clear(node, self.ctx.nodes.get(node))

    def _intent_ended(self, rt: NodeRuntime, intent: Intent) -> None:
        """A held Drain intent read back finished (by this process before a restart):
        Succeeded -- its work had ended, the node stays closed until off; any other end
        -- it was let go: admission reopens."""
        self.intents.pop(rt.name, None)
        for names in self.draining.values():
            names.discard(rt.name)
        if intent.phase != "Succeeded":
            self._clear(rt.name, rt)

    def _resume(self, node: str, now: datetime) -> None:
        """Resume node `node`'s consolidation drain: from an open Drain intent read
        (`intent_seen`), or from its stored state (`NodePowerState.consolidation`, read
        with the WorkerNode: closed before any step, the intent's evidence when read)."""
        rt = self.ctx.nodes.get(node)
        if rt is None or rt.spec is None:
            return
        name = self._to_resume.pop(node, None)
        if name is None and node not in self.closed:
            name = rt.state.consolidation
        if name is None:
            return
        intent = self.ctx.intents.intents.get(name)
        held = self.intents.get(node)
        if held == name:
            return
        if held is not None:
            if intent is not None and not intent.settled:
                # a second open drain of one node (two leaders' overlap): the held one goes on
                self.ctx.spawn(self._close(name, now, "Superseded", f"superseded by {held}"))
            return
        policy = self.ctx.policy(rt).name
        self.intents[node] = name
        self.closed[node] = policy
        self.draining.setdefault(policy, set()).add(node)
        log.info("WorkerNode %s: consolidation drain %s resumed", node, name)
        if rt.state.consolidation != name:
            rt.state = replaced(rt.state, {"consolidation": name})
        if rt.facts.consolidation is None:
            reading = (
                _stored_reading(intent, now)
                if intent is not None
                else _placeholder_reading(name, now)
            )
            rt.facts = replaced(rt.facts, {"consolidation": reading})
            rt.events.append(Evaluate())
            self.ctx.wake.set()
        if intent is not None and intent.settled:
            self._intent_ended(rt, intent)
        self._release(now)  # the lever or an annotation may no longer hold it

    def _resume_shadows(self) -> None:
        """The first ledger: a node whose latest Shadow record names a container it still
        holds is back in its policy's Shadow budget (as if this process had recorded it)."""
        for node, (_, moved) in self._shadowed.items():
            rt = self.ctx.nodes.get(node)
            if rt is None or rt.spec is None or self._settings(rt).mode != "Shadow":
                continue
            if moved & {uuid for uuid, _ in self._work.get(node, frozenset())}:
                self.shadowing.setdefault(self.ctx.policy(rt).name, set()).add(node)
        self._shadowed.clear()

    def _release(self, now: datetime) -> None:
        """Nodes whose consolidation drain is over: their work ended (out of the budget,
        the intent Succeeded; known only once the ledger came), they went off (the fact
        cleared) or away, or the lever or an annotation lets them go (the fact cleared,
        admission reopens, the intent Aborted) -- judged once the fleet and its policies
        are in (a restart's first events must not let a resumed drain go)."""
        for group in (self.draining, self.shadowing):
            if not self._ledger:
                break
            for names in group.values():
                for name in [n for n in names if not self._work.get(n)]:
                    names.discard(name)
                    if group is self.draining:
                        self.ctx.spawn(self._finish(name, now, "Succeeded", "drained"))
        if not self.ctx.synced.is_set():
            return  # a start: the fleet and its policies are not all in yet
        for name in list(self.closed):
            rt = self.ctx.nodes.get(name)
            if rt is None:
                self._clear(name, None)
                self.ctx.spawn(self._finish(name, now, "Aborted", "its WorkerNode is gone"))
                continue
            off = rt.state.state is PowerState.OFF
            mode = self._settings(rt).mode
            why = None
            if mode != "On":
                why = f"consolidation.mode is {mode} now"
            elif self._protected(rt):
                why = "the node or one of its containers is annotated do-not-consolidate"
            elif not off:
                why = self._demand_waits(rt)
            if off:
                self._clear(name, rt)
                self.ctx.spawn(self._finish(name, now, "Succeeded", "the node is off"))
            elif why is not None:
                self._clear(name, rt)
                self.ctx.spawn(self._finish(name, now, "Aborted", why))

    def _demand_waits(self, rt: NodeRuntime) -> str | None:
        """Why queued work lets closed node `rt` go (None: it does not): some of the
        queued containers that fit it (its demand reading) only it could ever run
        (`rules.consolidation.only_here`). O(the node's demand), only while it has some;
        the other nodes' capacities are read only then."""
        demand = rt.facts.demand
        if demand is None or demand.queued <= 0 or not demand.containers:
            return None
        ids = set(demand.containers)
        waiting = [c.resources for c in self.held if c.uuid in ids and c.phase is Phase.QUEUED]
        if not waiting:
            return None
        others = (o.spec for o in self.ctx.nodes.values() if o.name != rt.name)
        stuck = only_here(
            waiting, side_capacities(others), self.ctx.catalogue, self.ctx.type_policy
        )
        return demand_lets_go(stuck)

    def _clear(self, name: str, rt: NodeRuntime | None) -> None:
        self._tids.pop(name, None)
        if rt is not None and rt.state.consolidation is not None:
            rt.state = replaced(rt.state, {"consolidation": None})
        policy = self.closed.pop(name, None)
        if policy is not None:
            self.draining.get(policy, set()).discard(name)
        if rt is not None and rt.facts.consolidation is not None:
            rt.facts = replaced(rt.facts, {"consolidation": None})
            rt.events.append(Evaluate())
            self.ctx.wake.set()

    def in_use(self) -> dict[str, int]:
        """Per policy: the nodes its consolidation budget holds now (draining under On,
        would-be draining under Shadow), policies holding none left out."""
        counts: dict[str, int] = {}
        for group in (self.draining, self.shadowing):
            for policy, names in group.items():
                if names:
                    counts[policy] = counts.get(policy, 0) + len(names)
        return counts

    def _protected(self, rt: NodeRuntime) -> bool:
        if protected(rt.meta.get("annotations")):
            return True
        return any(kept for _, kept in self._work.get(rt.name, frozenset()))

    # -- due times ---------------------------------------------------------------------

    def due(self, now: datetime) -> None:
        """Assess the nodes whose due time came (module docstring)."""
        names: list[str] = []
        while (at := self.next_due) is not None and at <= now:
            _, name = heapq.heappop(self._heap)
            self._due.pop(name, None)
            names.append(name)
        if not names:
            return
        self._release(now)
        views: list[NodeView] | None = None
        by_name: dict[str, NodeView] = {}
        for name in names:
            rt = self.ctx.nodes.get(name)
            if rt is None or rt.spec is None or name in self.closed:
                continue
            settings = self._settings(rt)
            if settings.mode == "Off":
                continue
            if views is None:
                views = self._views()
                by_name = {v.name: v for v in views}
            view = by_name.get(name)
            if view is None:
                continue
            self.assessed += 1
            policy = self.ctx.policy(rt).name
            answer = assess(
                view,
                protected(rt.meta.get("annotations")),
                self.held,
                views,
                settings,
                self.ctx.catalogue,
                self.ctx.type_policy,
                now,
                self.ctx.placement(),
                rt.facts.demand.queued if rt.facts.demand is not None else 0,
            )
            recheck = now + parse_duration(settings.recheck_after)
            if not answer.drain:
                if answer.code in RECHECKED:
                    self._push(name, recheck)
                continue
            group = self.draining if settings.mode == "On" else self.shadowing
            members = group.setdefault(policy, set())
            if name in members:
                continue
            if not within_budget(members, settings):
                self._push(name, recheck)  # the budget is full: look again later
                continue
            members.add(name)
            budget = f"{len(members)} of maxConcurrent {settings.max_concurrent} ({settings.mode})"
            reading = consolidation_reading(
                answer, "rules.consolidation (dispatcher ledger, node prices)", now, budget
            )
            if settings.mode == "On":
                tid = f"consolidate-{now:%Y%m%d-%H%M%S}"
                self.closed[name] = policy
                # held from now (its intent is created on the step that closes admission)
                # and kept in the stored state: a restart keeps the node closed
                self.intents[name] = policy_intent_name(name, tid)
                self._tids[name] = tid
                rt.state = replaced(rt.state, {"consolidation": self.intents[name]})
                rt.facts = replaced(rt.facts, {"consolidation": reading})
                rt.events.append(Evaluate())
                self.ctx.wake.set()
            else:
                self.ctx.spawn(self._shadow(rt, reading, now))

    def _views(self) -> list[NodeView]:
        """Every node as the scheduler sees it, from the power controller's state (built
        only when a node is due)."""
        out: list[NodeView] = []
        for rt in self.ctx.nodes.values():
            base = node_view(rt.name, rt.spec, self.ctx.catalogue)
            if base is None:
                continue
            power = rt.state.state
            out.append(
                replace(
                    base,
                    state=SIDE_STATE.get(power, NodeState.UNKNOWN),
                    admission_open=admits(rt.state.admission),
                    ready=is_ready(power, rt.facts.ready),
                )
            )
        return out

    # -- records -----------------------------------------------------------------------

    async def drained(self, rt: NodeRuntime, record: SafetyRecord, now: datetime) -> None:
        """The step that closed the node's admission for consolidation (decision DRAIN,
        CONSOLIDATION_DRAIN): a policy-made PowerIntent (Drain) with its Safety Record."""
        tid = self._tids.pop(rt.name, None)
        if tid is None or rt.name not in self.intents:
            return  # created already, resumed, or let go meanwhile
        intents = self.ctx.intents
        intent = await intents.create_policy_intent(rt.name, tid, "Drain", DRAIN_REASON, now)
        fields = record_fields(record)
        fields.update(
            phase="InProgress",
            startedAt=iso(now),
            message="consolidation: admission closed; it finishes what it runs, then the "
            "usual idle path applies",
        )
        await intents.write(intent, fields)

    async def _finish(self, name: str, now: datetime, phase: str, why: str) -> None:
        """Close node `name`'s Drain intent (if it still has one open)."""
        intent_name = self.intents.pop(name, None)
        if intent_name is None:
            return
        if phase != "Succeeded":
            message = f"consolidation let go: {why}; admission reopens"
        elif why == "drained":
            message = "consolidation: its work ended; the usual idle path applies"
        else:
            message = f"consolidation: {why}; the drain is over"
        await self._close(intent_name, now, phase, message)

    async def _close(self, intent_name: str, now: datetime, phase: str, message: str) -> None:
        intent = self.ctx.intents.intents.get(intent_name)
        if intent is None or intent.settled:
            return
        intent.asked_phase = phase
        fields: dict[str, Any] = {"phase": phase, "finishedAt": iso(now), "message": message}
        await self.ctx.intents.write(intent, fields)

    async def _shadow(self, rt: NodeRuntime, reading: ConsolidationReading, now: datetime) -> None:
        """What On would have done: the machine stepped on a copy of the facts (nothing
        kept), its record in a PowerIntent in phase Shadow."""
        facts = replaced(rt.facts, {"consolidation": reading})
        result = step(rt.state, facts, Evaluate(), now, self.ctx.policy(rt).view)
        record = result.record
        if record is None or result.decision is not Decision.DRAIN:
            return
        intents = self.ctx.intents
        tid = f"shadow-consolidate-{now:%Y%m%d-%H%M%S}"
        intent = await intents.create_policy_intent(rt.name, tid, "Drain", SHADOW_REASON, now)
        message = "consolidation in Shadow: decided and recorded, not acted on"
        await intents.write(intent, shadow_fields(record, message, now))


def _shadow_record(intent: Intent) -> bool:
    return intent.source == "Policy" and intent.action == "Drain" and intent.reason == SHADOW_REASON


def _moved(intent: Intent) -> frozenset[str]:
    """The containers a consolidation record would have moved (its evidence's targets)."""
    record = intent.written.get("safetyRecord")
    stored = record.get("consolidation") if isinstance(record, dict) else None
    targets = stored.get("targets") if isinstance(stored, dict) else None
    return frozenset(targets) if isinstance(targets, dict) else frozenset()


_PLACEHOLDER = (
    "WorkerNode status.powerState.consolidation (restarted; its PowerIntent not read yet)"
)


def _placeholder_reading(intent_name: str, now: datetime) -> ConsolidationReading:
    """The consolidation fact of a node resumed from its stored state alone."""
    return ConsolidationReading(
        source=_PLACEHOLDER,
        observed_at=now,
        utilisation=0.0,
        hourly_price=0.0,
        why=f"resumed after a restart: PowerIntent {intent_name}"[:1024],
    )


def _placeholder(reading: ConsolidationReading | None) -> bool:
    return reading is not None and reading.source == _PLACEHOLDER


def _stored_reading(intent: Intent, now: datetime) -> ConsolidationReading:
    """The consolidation evidence a resumed Drain intent's Safety Record holds (a reading
    naming the intent when the record is missing or unreadable)."""
    record = intent.written.get("safetyRecord")
    stored = record.get("consolidation") if isinstance(record, dict) else None
    if isinstance(stored, dict):
        try:
            return ConsolidationReading.model_validate(stored)
        except ValidationError:
            pass
    return ConsolidationReading(
        source=f"PowerIntent/{intent.name} (resumed; its record unreadable)",
        observed_at=intent.started_at or intent.created,
        utilisation=0.0,
        hourly_price=0.0,
        why="resumed after a restart",
    )
