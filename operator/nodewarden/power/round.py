"""The power round: each node with events (or whose recheck time or telemetry expiry has
come: `power.agenda`, no scan of the fleet) is stepped
through `policy.machine.step`, and what the step returns is carried out -- the power state
persisted before a request is sent, the records written, the step's effects carried out
(`rules.effects` says what each action means; here: requests, reads, probes, admission,
rechecks) -- then the status writes of the round are flushed.

`Round` is the top collaborator of `PowerController`: it calls `Validation` (periodic
re-validation), `Sensing` (the reads due, a read a step asks for), `PoolFacts` (re-reads of
the queue), `Observations` (a refused state write reloads the stored state), `Recorder` and
`PowerWarmth` (warm-capacity targets at their due times; each node's class in its fleet
reading).
Shadow mode (`PowerPolicy.spec.mode: Shadow`) records a step that would act and does not
carry it out.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

from nodewarden.cooperate import Turns
from nodewarden.fleet.status import PowerStateConflict
from nodewarden.kube.client import KubeError
from nodewarden.metrics import POWER_REQUESTS
from nodewarden.policy.actions import RequestPower
from nodewarden.policy.base import replaced
from nodewarden.policy.eligibility import eligibility, to_status
from nodewarden.policy.events import AdmissionClosed, DeadlineReached, Evaluate, Event
from nodewarden.policy.facts import DesiredReading
from nodewarden.policy.machine import Step, step
from nodewarden.policy.reasons import R
from nodewarden.policy.record import SafetyRecord
from nodewarden.policy.state import NodePowerState, PowerState, TransitionKind
from nodewarden.policy.view import PolicyView
from nodewarden.power import gauges
from nodewarden.power.admitting import held_request
from nodewarden.power.agenda import Timer
from nodewarden.power.consolidating import PowerConsolidation, consolidation_drain
from nodewarden.power.context import PowerContext
from nodewarden.power.control import NodeRef
from nodewarden.power.energy import Energy
from nodewarden.power.inforce import PolicyInForce
from nodewarden.power.nodestatus import board_view
from nodewarden.power.observations import Observations
from nodewarden.power.poolfacts import PoolFacts
from nodewarden.power.recording import Recorder
from nodewarden.power.runtime import NodeRuntime
from nodewarden.power.sensing import Sensing
from nodewarden.power.validation import Validation
from nodewarden.power.warming import PowerWarmth
from nodewarden.rules.effects import (
    Effect,
    Observation,
    Observe,
    Recheck,
    ReEvaluate,
    SendPowerRequest,
    StopAdmission,
    TransitionClosed,
    TransitionOpened,
    effects,
)

log = logging.getLogger(__name__)

WHOLE_ROUND = 256
"""Nodes a round steps before it shares the event loop (`cooperate.Turns`): a start-up
or a fleet-wide change of thousands of nodes is split into turns of about 20 ms."""


class Round:
    """See the module docstring."""

    def __init__(
        self,
        ctx: PowerContext,
        *,
        recorder: Recorder,
        validation: Validation,
        observations: Observations,
        poolfacts: PoolFacts,
        sensing: Sensing,
        energy: Energy,
        warmth: PowerWarmth,
        inforce: PolicyInForce,
        consolidation: PowerConsolidation,
    ) -> None:
        self.ctx = ctx
        self.gauges_stale = True
        """Whether the gauges lag the nodes (`publish_gauges`)."""
        self.consolidation = consolidation
        self.energy = energy
        self.warmth = warmth
        self.inforce = inforce
        self.recorder = recorder
        self.validation = validation
        self.observations = observations
        self.poolfacts = poolfacts
        self.sensing = sensing
        self.steps = 0
        self._next_resync: datetime | None = None
        self._hold_writes: set[str] = set()
        """Nodes whose status write waits for the next round (`PowerController`, step 4)."""
        self._held: set[str] = set()
        """Nodes whose write waited in the last round for a step's recheck (they are not
        held again for one; a start-up hold, `power.firstwrites`, does not count)."""
        self._asked: set[str] = set()
        """Nodes whose last step asked for a fact at once (a live re-read of the queue,
        an immediate recheck): a starting node's first write waits for the step that
        answers it (`_start_up_facts_in`), within `power.first_write_hold`."""

    async def round(self) -> None:
        ctx = self.ctx
        now = ctx.clock()
        for name, at in ctx.board.take_acknowledgements().items():
            rt = ctx.nodes.get(name)
            if rt is not None:
                rt.events.append(AdmissionClosed(at=at, source="dispatcher"))
        if self._next_resync is None or now >= self._next_resync:
            self._next_resync = now + timedelta(seconds=ctx.settings.resync_interval)
            self.validation.resync()
            if ctx.synced.is_set():
                keep = timedelta(seconds=ctx.settings.keep_intents_of_gone_nodes)
                ctx.spawn(ctx.intents.expire_gone(set(ctx.nodes), now, keep))
                ctx.spawn(ctx.intents.expire_manual(now))
        if ctx.synced.is_set():
            for intent in ctx.intents.abandoned(self._transition_intent):
                if consolidation_drain(intent):
                    continue  # no transition's: consolidation resumes it (`intent_seen`)
                ctx.spawn(ctx.intents.abandon(intent, now))
        self.sensing.schedule(now)
        self.warmth.due(now)  # window boundaries, forecast hours, policy changes
        self.consolidation.due(now)  # nodes whose work settled (never a fleet scan)
        agenda = ctx.agenda
        names = agenda.take_dirty()
        names |= agenda.due(Timer.STEP, now, self._current("due_at"))
        expired = {n for n in agenda.due(Timer.EXPIRY, now, self._current("expires_at"))}
        for name in expired - names:
            if self._expired(ctx.nodes[name], now):
                names.add(name)
        stepping = sorted((ctx.nodes[n] for n in names if n in ctx.nodes), key=_arrival)
        # the tally is kept as each step changes a state: the next node reads it
        # a first round over a big fleet must not hold the loop for seconds; a round of a
        # few nodes stays whole (what it decides then never depends on a mid-round read)
        turns = Turns(after=WHOLE_ROUND)
        for rt in stepping:
            await turns.share()
            if ctx.nodes.get(rt.name) is not rt:
                continue  # deleted (or replaced) while others had their turn
            due = rt.due_at is not None and now >= rt.due_at
            if not rt.events and not due and rt.name not in expired:
                continue
            if due:
                rt.due_at = None
            # the fleet counts (the tally), with the node's class and its warm target
            rt.facts = replaced(rt.facts, {"fleet": self.warmth.reading(rt, now)})
            try:
                await self.process(rt, now, due=due)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # one node's bug: mark it, the round goes on
                self._failed(rt, exc)
            else:
                if rt.failure is not None:
                    rt.failure = None
                    self.recorder.contribute_conditions(rt)
            self._expire_after(rt, now)
        self.poolfacts.reread_wanted()
        stepped_holds, self._hold_writes = self._hold_writes, set()
        first = ctx.first_writes
        if first.starting and ctx.synced.is_set() and self.poolfacts.ledger_known:
            first.started()  # the fleet is held and the dispatcher recovered
        held = stepped_holds | first.holding(now, self._start_up_facts_in)
        if self._asked and not first:
            self._asked.clear()  # no starting node waits any more
        self.energy.due(now)
        if agenda.roster_changed:
            self.inforce.roster_changed()
        self.inforce.due(now)  # a node moved, a window boundary, a policy change
        await ctx.status.flush(hold=held)
        if policies := self.energy.policies_due(now):  # a task only when a write is due
            ctx.spawn(self.energy.write_policies(policies, now))
        self._held = stepped_holds  # only a step's hold is never renewed
        if agenda.roster_changed:  # (a step marks the gauges stale itself: `process`)
            agenda.roster_changed = False
            self.gauges_stale = True  # published at the next scrape (`publish_gauges`)
        agenda.compact(len(ctx.nodes), self._timers)

    def publish_gauges(self) -> None:
        """Set the power path's gauges from every node (`gauges.publish`, a pass over the
        fleet), if a round stepped a node or the roster changed since the last time: run
        before each /metrics scrape (`scraped.before_scrape`), so its cost follows the
        scrapes, not the rounds."""
        if self.gauges_stale:
            self.gauges_stale = False
            gauges.publish(self.ctx.nodes.values(), self.ctx.clock())

    def _start_up_facts_in(self, name: str) -> bool:
        """Whether a starting node's first facts are in (`power.firstwrites`): its verdict,
        no answer its last step asked for still to come (a demand re-read, an immediate
        recheck: the step after it is written with it), and its power observed once -- a
        cloud VM's in the cloud list, a side node's from its BMC (read, failing or refused,
        whether the node is valid or not) -- or not observable (an invalid cloud VM, a
        blocked node, a side node without a BMC, whose power comes with an SSH login, a
        cloud VM when no cloud is configured: no cloud list will ever come, and waiting for
        one held its first write -- its `Valid` acknowledgement too -- for the whole hold)."""
        rt = self.ctx.nodes.get(name)
        if rt is None:
            self._asked.discard(name)
            return True
        verdict = rt.verdict
        if verdict is None or name in self._asked:
            return False
        if rt.state.state is PowerState.BLOCKED or rt.facts.power is not None:
            return True
        if rt.has_bmc_side:
            # read even when the node is invalid (an SSH endpoint not admitted, no key: the
            # BMC is read all the same): in once read, or once the read failed (or was
            # refused: `Sensing.poll` marks the node unobservable)
            return name in self.ctx.control.last_error
        if not verdict.valid:
            return True
        if rt.node_type == "CloudVM":
            pool = self.ctx.pool
            return pool is None or not pool.lists_cloud  # no cloud list will come
        return True  # a side node without a BMC: its power comes with an SSH login

    def _current(self, attribute: str) -> Callable[[str], datetime | None]:
        nodes = self.ctx.nodes

        def current(name: str) -> datetime | None:
            rt = nodes.get(name)
            return None if rt is None else getattr(rt, attribute)

        return current

    def _timers(self, timer: Timer) -> Iterator[tuple[str, datetime]]:
        for rt in self.ctx.nodes.values():
            at = getattr(rt, timer.value)
            if at is not None:
                yield rt.name, at

    def _expired(self, rt: NodeRuntime, now: datetime) -> bool:
        """`rt`'s expiry came: stale evidence is stepped now; evidence refreshed since
        (without a step) moves the expiry instead."""
        at = self.ctx.expiry(rt)
        if at is not None and at > now:
            rt.expires_at = at
            return False
        return at is not None

    def _expire_after(self, rt: NodeRuntime, now: datetime) -> None:
        """After a step: the node's next expiry (None when its evidence is already stale
        or missing: the step that found it so asked for what it needs)."""
        at = self.ctx.expiry(rt)
        rt.expires_at = at if at is not None and at > now else None

    def _transition_intent(self, node: str) -> str | bool | None:
        """The intent of `node`'s current transition (None: none; False: not our node)."""
        rt = self.ctx.nodes.get(node)
        return False if rt is None else rt.transition_intent

    # ------------------------------------------------------------------ one node

    def _failed(self, rt: NodeRuntime, exc: Exception) -> None:
        """A step of `rt` raised: log it, mark the node (`Reconciled=False`), go on; the
        node is stepped again at its next event or at the next evaluation."""
        log.error("power step of WorkerNode %s failed", rt.name, exc_info=exc)
        rt.failure = f"{type(exc).__name__}: {exc}"[:1000]
        rt.events.clear()
        rt.settled = False
        rt.due_at = self.ctx.clock() + timedelta(seconds=self.ctx.settings.evaluate_interval)
        self.recorder.contribute_conditions(rt)

    async def process(self, rt: NodeRuntime, now: datetime, due: bool = False) -> None:
        """Step `rt` through every event it holds (a recheck or deadline when none)."""
        try:
            await self._process(rt, now, due)
        finally:
            gauges.date_stale(rt, now)  # a stale episode is dated by the step that saw it
            self.gauges_stale = True

    async def _process(self, rt: NodeRuntime, now: datetime, due: bool) -> None:
        self._asked.discard(rt.name)  # stepped: what it asked for is in (or asked again)
        if rt.spec is None:
            rt.events.clear()
            return
        policy = self.ctx.policy(rt)
        view = policy.view
        self._static_facts(rt, now)
        self._confirmed_demand(rt)
        events: list[Event] = list(rt.events)
        rt.events.clear()
        entered = rt.state.state
        if not events:
            t = rt.state.transition
            # a recheck of a transition is its deadline; an expiry is an evaluation
            events = [DeadlineReached(transition_id=t.id) if t is not None and due else Evaluate()]
        for event in events:
            # the last record written is the previous one: a step that reaches the same
            # decision gets it back re-evaluated (no full record is built)
            result = step(rt.state, rt.facts, event, now, view, previous=rt.record)
            self.steps += 1
            fx = effects(result.actions, now, result.decision)
            if view.shadow and _acts(fx):
                rt.facts = result.facts  # observations count; the decision is not carried out
                await self._shadow(rt, result, event, view, now)
                continue
            headline = (result.decision, result.reasons, result.next.state, result.next.admission)
            opens_or_closes = any(
                isinstance(e, (TransitionOpened, TransitionClosed, SendPowerRequest)) for e in fx
            )
            record: SafetyRecord | None = None
            if headline != rt.headline or opens_or_closes:
                record = result.record
            if record is not None and R.CONSOLIDATION_DRAIN in result.reasons:
                await self.consolidation.drained(rt, record, now)  # its PowerIntent
            before = rt.state
            rt.state, rt.facts = result.next, result.facts
            if not await self._apply(rt, before, result, fx, record, headline, now):
                return
        if rt.state.state is not entered and rt.state.transition is None:
            # a move into a steady state (verify -> ON_IDLE, a closed transition) is
            # followed by an evaluation in it: what that state decides (an idle
            # shutdown, a drain) is not left waiting for the node's next change
            rt.due_at = now if rt.due_at is None else min(rt.due_at, now)

    async def _shadow(
        self, rt: NodeRuntime, result: Step, event: Event, view: PolicyView, now: datetime
    ) -> None:
        """Record what would have happened (PowerIntent phase Shadow), do nothing."""
        key = (result.decision, result.reasons)
        rt.settled = False
        rt.due_at = now + timedelta(seconds=self.ctx.settings.evaluate_interval)
        if key == rt.shadow_key:
            return
        rt.shadow_key = key
        record = step(rt.state, rt.facts, event, now, view).record
        assert record is not None
        await self.recorder.shadow(rt, result, record, now)

    async def _apply(
        self,
        rt: NodeRuntime,
        before: NodePowerState,
        result: Step,
        fx: tuple[Effect, ...],
        record: SafetyRecord | None,
        headline: tuple[Any, ...],
        now: datetime,
    ) -> bool:
        """Carry out one step (`fx`, its effects). Returns False when the node must reload
        its state."""
        ctx = self.ctx
        # cross-process admission: admission closed and the demand re-read through the
        # API server before persist-before-send (`power.admitting`; off: None)
        gate = ctx.admission
        if gate is not None and held_request(fx, rt) and not await gate.may_send(rt, now):
            rt.state = before
            return False
        recorder = self.recorder
        state = rt.state
        if record is not None:
            record = self.energy.annotate(rt, before.state, record, now)
        gauges.observe_step(before, state)
        view = ctx.policy(rt).view
        ctx.board.set(rt.name, board_view(rt, view.valid, view, now))
        ctx.status.contribute(rt.name, recorder.power_status(rt, record, now))
        self._eligibility(rt, before, result, view, now)
        requested = any(isinstance(e, SendPowerRequest) for e in fx)
        rt.settled = not any(isinstance(e, _UNSETTLED) for e in fx)
        if requested:
            ctx.status.contribute(
                rt.name, {"powerState": state.model_dump(mode="json", by_alias=True)}
            )
            rt.persisted = state
            try:
                await ctx.status.persist(rt.name)
            except (PowerStateConflict, KubeError) as exc:
                log.warning(
                    "WorkerNode %s: power state not persisted (%s); no request sent, reloading",
                    rt.name,
                    exc,
                )
                self.observations.reload(rt)
                return False
        for effect in fx:  # the PowerIntents before the record that names them
            match effect:
                case TransitionOpened(transition=opened):
                    await recorder.open(rt, opened, now)
                case TransitionClosed(transition=closed):
                    await recorder.close(rt, closed, record, now)
        if record is not None:
            closed_any = any(isinstance(e, TransitionClosed) for e in fx)
            await recorder.record(rt, record, headline, now, closed_any, requested=requested)
        recorder.reflect_manual(rt, result, record, now)
        for effect in fx:
            self._execute(rt, effect, now)
        if state.state is not before.state:
            self.energy.moved(rt, now)
            self.inforce.moved(rt)
            log.info(
                "WorkerNode %s: %s -> %s (%s %s)",
                rt.name,
                before.state.value,
                state.state.value,
                result.decision.value,
                ",".join(r.value for r in result.reasons),
            )
        return True

    def _eligibility(
        self,
        rt: NodeRuntime,
        before: NodePowerState,
        result: Step,
        view: PolicyView,
        now: datetime,
    ) -> None:
        """`status.eligibility` from this step (`policy.eligibility`, as `explain`). A hold
        that ends by the clock before the step's recheck (the idle threshold before min-on)
        is a due time of its own: the node is stepped then, so what status names as holding
        it is what holds it."""
        if result.next.state is not before.state or result.next.transition != before.transition:
            # the step moved the node: judged as `explain` judges it, from where it is now
            result = step(rt.state, rt.facts, Evaluate(), now, view, with_record=False)
        found = eligibility(result, view)
        self.ctx.status.contribute(rt.name, {"eligibility": to_status(found)})
        until = found.held_until
        if until is not None and until > now and rt.state.transition is None:
            rt.due_at = until if rt.due_at is None else min(rt.due_at, until)

    def _confirmed_demand(self, rt: NodeRuntime) -> None:
        """The dispatcher confirmed its plan unchanged since `rt`'s demand reading: the
        reading holds at that time (`PowerContext.demand_confirmed_at`)."""
        demand = rt.facts.demand
        at = self.ctx.demand_confirmed_at
        if demand is not None and at is not None and at > demand.observed_at:
            rt.facts = rt.facts.model_copy(
                update={"demand": demand.model_copy(update={"observed_at": at})}
            )

    def _static_facts(self, rt: NodeRuntime, now: datetime) -> None:
        """The facts that come from the spec (and the active intent)."""
        spec = rt.spec
        assert spec is not None
        desired = DesiredReading(
            source=f"WorkerNode/{rt.name} spec (generation {rt.generation})",
            observed_at=rt.spec_seen_at,
            power=spec.power,
            idle_behavior=spec.idle_behavior,
        )
        updates: dict[str, Any] = {}
        if rt.facts.desired != desired:
            updates["desired"] = desired
        if rt.facts.node_type != spec.node_type:
            updates["node_type"] = spec.node_type
        if updates:
            rt.facts = rt.facts.model_copy(update=updates)
        self.observations.sync_intent(rt)

    # -- effects --------------------------------------------------------------------------

    def _execute(self, rt: NodeRuntime, effect: Effect, now: datetime) -> None:
        ctx = self.ctx
        ref = rt.ref()
        pool = ctx.pool
        match effect:
            case StopAdmission():
                ctx.board.close(rt.name, now)
                if ctx.acknowledge_admission or pool is None:
                    ctx.board.acknowledge(rt.name, now)
                ctx.wake.set()
            case SendPowerRequest(request=request) if ref is not None:
                ctx.spawn(self._request(rt, ref, request))
            case Observe(what=Observation.DEMAND):
                self.poolfacts.want_reread(rt.name)
                self._ask(rt)
            case Observe(what=Observation.POWER) if ref is not None:
                if rt.has_bmc_side:
                    self.sensing.poll(rt, ref)
                else:
                    ctx.spawn(ctx.control.read_power(ref))
            case Observe(what=Observation.READY_PROBE) if pool is not None:
                pool.request_probe(rt.name)
            case Observe(what=Observation.PROBE) if ref is not None and pool is not None:
                pool.request_probe(rt.name)
            case Observe(what=Observation.CAPABILITY) if ref is not None:
                rt.next_discovery = now
            case Observe(what=Observation.VM_LIST) if ref is not None and pool is not None:
                pool.request_sync()
            case Recheck(at=at, hold_write=hold):
                rt.due_at = at if rt.due_at is None else min(rt.due_at, at)
                if hold:
                    self._ask(rt)
                if hold and rt.name not in self._held:
                    self._hold_writes.add(rt.name)  # the next step's write carries this one's
            case ReEvaluate():
                rt.due_at = now + timedelta(seconds=ctx.settings.evaluate_interval)

    def _ask(self, rt: NodeRuntime) -> None:
        """`rt`'s step asked for a fact at once: a starting node's first write waits for
        the step that answers it (only starting nodes are kept: `_asked`)."""
        if rt.name in self.ctx.first_writes.waiting():
            self._asked.add(rt.name)

    async def _request(self, rt: NodeRuntime, ref: NodeRef, action: RequestPower) -> None:
        outcome = await self.ctx.control.request(
            ref, action.transition_id, action.attempt, action.action
        )
        result = {
            "RequestAccepted": "accepted",
            "RequestRejected": "rejected",
            "RequestErrored": "errored",
        }[outcome.type]
        POWER_REQUESTS.labels(action.action, result, str(action.attempt > 1).lower()).inc()
        log.info(
            "WorkerNode %s: %s #%d %s: %s",
            rt.name,
            action.action,
            action.attempt,
            result,
            outcome.detail,
        )
        rt.events.append(outcome)
        if rt.has_bmc_side:
            rt.next_poll = self.ctx.clock()  # look at the BMC soon
        self.ctx.wake.set()


def _arrival(rt: NodeRuntime) -> int:
    return rt.order


_UNSETTLED = (Observe, ReEvaluate, SendPowerRequest, StopAdmission, TransitionOpened)
"""Effects after which the node waits for something: its next observations are stepped."""


def _acts(fx: tuple[Effect, ...]) -> bool:
    """Would this step act on the node (begin a power transition)?"""
    for e in fx:
        if isinstance(e, TransitionOpened) and e.kind is not TransitionKind.VERIFY:
            return True
        if isinstance(e, (SendPowerRequest, StopAdmission)):
            return True
    return False
