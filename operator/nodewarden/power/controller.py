"""The power controller: every power decision for every WorkerNode, through one path.

Side nodes and cloud VMs alike: facts in (probes, BMC, cloud list, queue, spec, intents),
`policy.machine.step` decides, the actions it returns are carried out by adapters
(`power.control`), and every decision leaves a Safety Record -- in the transition's
PowerIntent, summarised on the WorkerNode, and as an Event when the decision changes.

The loop (`run`), each round:

1. take the dispatcher's admission acknowledgements (AdmissionClosed events);
2. step every node that has events or whose recheck time or telemetry expiry has come
   (`power.agenda`: a dirty set and heaps of due times, never a scan of the fleet):
   a step that is the same decision as before costs no record and no write;
3. for a step whose actions include a power request, persist the new power state
   (resourceVersion precondition) *before* sending it: a replica that resumes from
   status never sends a request the state machine did not ask for;
4. write the WorkerNode statuses that changed (one patch each) and the metrics; a node
   that asked to be stepped again at once (a recheck due now, e.g. the wake evaluation
   that follows an observed Off) writes one round later, both steps in one patch (never
   held two rounds in a row);
5. sleep until an event arrives or the agenda's next due time.

An observation that only confirms what a node at rest holds (the same probe, the same BMC
power, the same cloud state; `rules.freshness.only_time_moved`) refreshes its facts and
its expiry without a step.

Observations arrive as they happen: probe results (`probed`), the cloud list (`listed`,
`gone`), BMC reads and request outcomes (adapter tasks), the dispatcher's plan (demand),
PowerIntent and PowerPolicy events. The controller also owns the WorkerNode `Valid`,
`Ready` and `PowerSource` conditions.

Shadow mode (`PowerPolicy.spec.mode: Shadow`): every decision is made and recorded; a
step that would begin a power transition is recorded as a PowerIntent in phase Shadow
with its Safety Record and an Event, and is not applied: nothing is requested, admission
is not closed. Observing (BMC reads, probes) continues.

`PowerController` is the thin owner: it builds the shared `PowerContext` and its
collaborators, which call one another one way only (top to bottom) --

- `round.Round`               -- the round and each step's actions (steps 1-4);
- `sensing.Sensing`           -- the BMC reads and capability discoveries it schedules;
- `poolfacts.PoolFacts`       -- the pool's observations and the dispatcher's plan;
- `observations.Observations` -- WorkerNodes, PowerIntents, PowerPolicies;
- `validation.Validation`     -- the `Valid` condition and the BMC claims;
- `energy.Energy`             -- power readings, energy figures, a policy's sums;
- `recording.Recorder`        -- records, intents' phases, Events, conditions;
- `warming.PowerWarmth`       -- warm-capacity targets (windows, forecast) and classes;
- `consolidating.PowerConsolidation` -- consolidation by drain: due nodes, budget, Drain intents;

and keeps the public surface: the feed's inputs, the pool's `WorkerObserver`, the
dispatcher's `planned`, the validation index, `explain`, `run`/`halt`/`stop`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

from nodewarden.api.kinds import WORKER_NODE
from nodewarden.api.workernode import WorkerNodeSpec
from nodewarden.cloud.model import CloudInstance
from nodewarden.credentials import CredentialResolver
from nodewarden.drain import drain
from nodewarden.fleet.board import PowerBoard
from nodewarden.fleet.policies import PolicyBook
from nodewarden.fleet.ports import PoolPort, WorkerSnapshot
from nodewarden.fleet.status import NodeStatusWriter
from nodewarden.kube.client import Kube
from nodewarden.kube.requesters import RequesterAdmission
from nodewarden.power.admitting import ApiShutdown, ShutdownGate
from nodewarden.power.agenda import Timer
from nodewarden.power.consolidating import PowerConsolidation
from nodewarden.power.context import PowerContext
from nodewarden.power.control import PowerControl
from nodewarden.power.energy import Energy
from nodewarden.power.explain import explain_node
from nodewarden.power.inforce import PolicyInForce
from nodewarden.power.intents import IntentBook, ManualRetention
from nodewarden.power.observations import Observations
from nodewarden.power.poolfacts import PoolFacts
from nodewarden.power.recording import Recorder
from nodewarden.power.round import Round
from nodewarden.power.runtime import ControllerSettings, NodeRuntime
from nodewarden.power.sensing import Sensing
from nodewarden.power.validation import Validation
from nodewarden.power.warming import PowerWarmth
from nodewarden.scheduling.caps import Admission
from nodewarden.scheduling.instancetypes import Catalogue, InstanceTypePolicy
from nodewarden.scheduling.views import ContainerView, Plan
from nodewarden.scraped import before_scrape, no_longer_before_scrape
from nodewarden.ssh.errors import SshError
from nodewarden.ssh.facts import ProbeReport

log = logging.getLogger(__name__)

MAX_PAUSE = 1.0
"""Longest pause between two rounds (see `run`)."""


class PowerController:
    """See the module docstring."""

    def __init__(
        self,
        *,
        kube: Kube,
        namespace: str,
        dispatcher_id: str,
        default_policy: str,
        credentials: CredentialResolver,
        policies: PolicyBook,
        pool: PoolPort | None,
        board: PowerBoard,
        status: NodeStatusWriter,
        control: PowerControl,
        settings: ControllerSettings,
        clock: Callable[[], datetime],
        catalogue: Catalogue | None = None,
        type_policy: InstanceTypePolicy | None = None,
        acknowledge_admission: bool = False,
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.dispatcher_id = dispatcher_id
        self.default_policy = default_policy
        self.credentials = credentials
        self.policies = policies
        self.pool = pool
        self.board = board
        self.status = status
        self.control = control
        self.settings = settings
        self.clock = clock
        self.catalogue = catalogue or Catalogue()
        self.type_policy = type_policy or InstanceTypePolicy()
        self.acknowledge_admission = acknowledge_admission
        """No dispatcher places work: closing admission is acknowledged at once."""
        self.intents = IntentBook(
            kube,
            namespace,
            dispatcher_id,
            settings.keep_finished_intents,
            ManualRetention(
                settings.delete_finished_manual_intents,
                timedelta(seconds=settings.finished_manual_intent_retention),
            ),
        )
        ctx = PowerContext(
            kube=kube,
            namespace=namespace,
            dispatcher_id=dispatcher_id,
            default_policy=default_policy,
            credentials=credentials,
            policies=policies,
            pool=pool,
            board=board,
            status=status,
            control=control,
            settings=settings,
            clock=clock,
            catalogue=self.catalogue,
            type_policy=self.type_policy,
            intents=self.intents,
            acknowledge_admission=acknowledge_admission,
        )
        ctx.first_writes.hold = settings.first_write_hold
        if settings.cross_process_admission:
            ctx.admission = ShutdownGate(
                ApiShutdown(kube, namespace, self._took),
                timedelta(seconds=settings.evaluate_interval),
            )
        self._ctx = ctx
        self.nodes: dict[str, NodeRuntime] = ctx.nodes
        self.wake = ctx.wake
        self._stop = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = ctx.tasks
        self._closed = False
        self.started = False
        recorder = Recorder(ctx)
        self.energy = Energy(ctx)
        validation = Validation(ctx, recorder)
        self._observations = Observations(ctx, validation, self.energy)
        self._poolfacts = PoolFacts(ctx, self._observations, recorder)
        sensing = Sensing(ctx, self._observations, recorder, self.energy)
        self._sensing = sensing
        self.warmth = PowerWarmth(ctx)
        self.consolidation = PowerConsolidation(ctx)
        self.inforce = PolicyInForce(ctx, self.warmth, self.consolidation)
        self._round = Round(
            ctx,
            recorder=recorder,
            validation=validation,
            observations=self._observations,
            poolfacts=self._poolfacts,
            sensing=sensing,
            energy=self.energy,
            warmth=self.warmth,
            inforce=self.inforce,
            consolidation=self.consolidation,
        )
        before_scrape(self._round.publish_gauges)

    @property
    def fold(self) -> Callable[[Mapping[str, Any]], bool] | None:
        """Where a WorkerNode this controller labelled goes (the WorkerNode informer)."""
        return self._observations.fold

    @fold.setter
    def fold(self, fold: Callable[[Mapping[str, Any]], bool] | None) -> None:
        self._observations.fold = fold

    def _took(self, name: str, body: Mapping[str, Any]) -> None:
        """A WorkerNode the shutdown gate (`power.admitting`) read or wrote: to the status
        writer's view of it, through the informer when there is one (as its own writes)."""
        fold = self.status.fold
        if fold is not None:
            fold(body)
        else:
            self.status.observe(name, body)

    @property
    def steps(self) -> int:
        """Steps taken so far (`policy.machine.step` calls)."""
        return self._round.steps

    # ------------------------------------------------------------------ inputs

    def observe_node(
        self, body: Mapping[str, Any], deleted: bool = False, spec: WorkerNodeSpec | None = None
    ) -> None:
        """A WorkerNode from the feed (its informer's compact body, shared: read-only), with
        its spec as the feed parsed it (None: parsed here)."""
        self._observations.observe_node(body, deleted, spec)
        name = (body.get("metadata") or {}).get("name")
        if name and not deleted:
            self.consolidation.node_changed(name, self._ctx.clock())

    def observe_intent(self, body: Mapping[str, Any], deleted: bool = False) -> None:
        """A PowerIntent event (manual or policy-made)."""
        self._observations.observe_intent(body, deleted)
        name = (body.get("metadata") or {}).get("name")
        if name and deleted:
            self.consolidation.intent_deleted(name)  # a person cancelled a drain
        elif name:
            self.consolidation.intent_seen(name, self._ctx.clock())  # a drain to resume

    def observe_policy(self, body: Mapping[str, Any], deleted: bool = False) -> None:
        """A PowerPolicy event: every node under it re-evaluates with the new version."""
        self.warmth.observe_policy(body, deleted)  # the histogram its status holds
        self.inforce.seen(body, deleted)  # its status.inForce (a new leader compares)
        self._observations.observe_policy(body, deleted)

    def requester_admission(self, admission: RequesterAdmission) -> None:
        """The last check of the requester admission policy (`kube.requesters`)."""
        self._observations.requester_admission(admission)

    def planned(self, containers: list[ContainerView], plan: Plan, now: datetime) -> None:
        """The dispatcher's round: its capacity ledger (each node's work) and queued
        demand for every node, by the plan's fit rules."""
        self._poolfacts.planned(containers, plan, now)
        self.warmth.planned(containers, now)  # the forecast's arrivals
        self.consolidation.planned(containers, now)  # nodes whose work changed

    def await_ledger(self) -> None:
        """A dispatcher places work here and has not planned yet (it recovers): until its
        first plan, no node's work is known (a node with no runner listed may hold a start
        in flight), so no node is judged idle (`PoolFacts.await_ledger`)."""
        self._poolfacts.await_ledger()

    def plan_unchanged(self, now: datetime) -> None:
        """The dispatcher did not plan: nothing its plan reads changed, so every node's
        demand reading still holds at `now` (no node is stepped for it)."""
        self._poolfacts.plan_unchanged(now)

    @property
    def quiet(self) -> int:
        """Observations that only confirmed a node at rest (folded in without a step)."""
        return self._poolfacts.quiet + self._sensing.quiet

    # -- what validation asks (handlers.validation.NodeIndex) ---------------------------

    def node_names(self) -> set[str]:
        return set(self.nodes)

    def policy_users(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for rt in self.nodes.values():
            name = rt.policy_name
            if name is not None:
                out[name] = out.get(name, 0) + 1
        return out

    async def start(self) -> None:
        """Called once the feed's WorkerNode informer has its first LIST (every node is
        here through `observe_node`), so fleet counts (disruption budget, min warm) see
        the whole fleet from the first round."""
        self._ctx.synced.set()
        log.info("power controller started", extra={"nodes": len(self.nodes)})

    def explain(self, name: str) -> dict[str, Any] | None:
        """The live explain document of WorkerNode `name` (None: not known here)."""
        rt = self.nodes.get(name)
        if rt is None:
            return None
        return explain_node(rt, self._ctx.policy(rt).view, self.clock())

    async def synced(self) -> None:
        """Return once the controller holds the whole fleet (after `start`)."""
        await self._ctx.synced.wait()

    async def node_exists(self, name: str) -> bool:
        """Whether WorkerNode `name` exists: known here, or (a node created a moment ago
        whose event has not arrived yet) found by a live GET."""
        await self._ctx.synced.wait()
        if name in self.nodes:
            return True
        return await self.kube.get(WORKER_NODE, self.namespace, name) is not None

    # -- the worker pool's observations (WorkerObserver) -------------------------------

    def probed(
        self, worker: WorkerSnapshot, report: ProbeReport | None, error: SshError | None
    ) -> None:
        self._poolfacts.probed(worker, report, error)

    def listed(self, instances: Mapping[str, CloudInstance], at: datetime) -> None:
        self._poolfacts.listed(instances, at)

    def list_failed(self, at: datetime) -> None:
        self._poolfacts.list_failed(at)

    async def gone(self, worker: WorkerSnapshot, at: datetime) -> None:
        """The instance left the cloud list: its Off is observed now, before the WorkerNode
        goes, so the transition's record is closed with the confirmation."""
        rt = self._poolfacts.gone(worker, at)
        if rt is None:
            return
        await self._round.process(rt, self.clock())
        await self.status.flush()

    def held(self, name: str, refusal: Admission | None) -> None:
        """The pool holds (or no longer holds) declared WorkerNode `name` for a cap."""
        self._poolfacts.held(name, refusal)

    def should_probe(self, name: str) -> bool:
        """Probe a side node unless its trusted power source says it is Off."""
        return self._poolfacts.should_probe(name)

    # ------------------------------------------------------------------ loop

    async def run(self) -> None:
        """Rounds until `stop()`; see the module docstring."""
        self.started = True
        loop = asyncio.get_running_loop()
        while not self._stop.is_set():
            self.wake.clear()
            started = loop.time()
            try:
                await self.round()
            except asyncio.CancelledError:
                if self._stop.is_set() or _cancelling():
                    raise
                # an awaited future was cancelled under us, not this task: a bug to report
                log.exception("power controller round was cancelled from inside; retrying")
            except Exception:
                log.exception("power controller round failed; retrying in a second")
                await asyncio.sleep(1.0)  # not in a tight loop while, say, the API is away
            # after a round that took T, the next waits T (at most a second), so a stream
            # of observations cannot hold the event loop
            await asyncio.sleep(min(loop.time() - started, MAX_PAUSE))
            timeout = self._sleep_for(self.clock())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), timeout=timeout)

    def halt(self) -> None:
        """Start no more rounds (the one under way ends normally; see `stop`)."""
        self._stop.set()
        self.wake.set()

    async def stop(self, grace: float = 0.0) -> None:
        """Halt, let the power requests, intent and status writes under way finish for up
        to `grace` seconds (`nodewarden.drain`) and write what they contributed, cancel the
        rest, close the power adapters."""
        self.halt()
        if self._closed:
            return
        self._closed = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        drained = await drain(self._tasks, grace)
        left = deadline - loop.time()
        if left > 0:
            try:
                await asyncio.wait_for(self.status.flush(), timeout=left)
            except TimeoutError:
                log.warning("power controller stopped before its last status writes ended")
        if drained.finished or drained.cancelled:
            log.info(
                "power controller stopped: %d tasks under way finished, %d cancelled",
                drained.finished,
                drained.cancelled,
            )
        self.energy.close()
        no_longer_before_scrape(self._round.publish_gauges)  # a stopped fleet shows nothing
        await self.control.close()

    async def round(self) -> None:
        """One round (steps 1-4 of the module docstring)."""
        await self._round.round()

    async def _process(self, rt: NodeRuntime, now: datetime, due: bool = False) -> None:
        """Step one node now (`Round.process`; `benchmarks/bench_intents.py` times it)."""
        await self._round.process(rt, now, due=due)

    def _sleep_for(self, now: datetime) -> float:
        """Seconds until the agenda's next due time (none: a few seconds; events: none)."""
        agenda = self._ctx.agenda
        if agenda.dirty:
            return 0.0
        soonest = 5.0
        nodes = self.nodes
        for timer in Timer:
            attribute = timer.value

            def current(name: str, attribute: str = attribute) -> datetime | None:
                rt = nodes.get(name)
                return None if rt is None else getattr(rt, attribute)

            at = agenda.soonest(timer, current)
            if at is not None:
                soonest = min(soonest, (at - now).total_seconds())
        released = self._ctx.first_writes.soonest()
        if released is not None:
            soonest = min(soonest, (released - now).total_seconds())
        consolidate = self.consolidation.next_due  # a node whose work settled
        if consolidate is not None:
            soonest = min(soonest, (consolidate - now).total_seconds())
        warm = self.warmth.next_due  # a window boundary or forecast hour
        if warm is not None:
            soonest = min(soonest, (warm - now).total_seconds())
        shown = self.inforce.next_due  # a policy in force's due time or held-back write
        if shown is not None:
            soonest = min(soonest, (shown - now).total_seconds())
        return max(0.05, soonest)


def _cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
