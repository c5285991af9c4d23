"""The dispatcher's loop: recovery at start-up, then one round after another.

Start-up (`start`): containers, WorkerNodes and policies are already here (the feed
hands every object over before `start` is called); list the cloud and adopt every
instance tagged with our dispatcher id (creating missing WorkerNodes); probe every node
once. Until that first probe round is done nothing is started, requeued or shut down,
so a restarted dispatcher adopts running containers instead of running them twice.

Each round (`step`, every `tick_interval` or sooner when an event arrives):

1. sync with the cloud list when due (`sync_interval`);
2. reconcile runners with containers, node by node, from the latest probe (`Runners`);
3. cancel what was cancelled, and drop the finalizer of earlier releases from terminal
   containers (`Outcomes`);
4. plan from the capacity ledger and 5. execute the plan (`Planner`), then create the
   cloud VMs warm capacity wants (`DispatchWarmth`) -- only when
   `replan.plan_wanted` says so: something the plan reads changed, starts or writes are
   under way, a time the last plan named came, or `replan_backstop` passed; an idle tick
   plans nothing, writes nothing, and hands the pool's status fields over only after a
   poke;
6. hand the pool's WorkerNode status fields to the status writer, announce overcommitted
   nodes, update the metrics, and give the power controller the ledger and the plan
   (`planned`). At an idle tick the power controller is told the last plan holds
   (`unchanged`, O(1): its demand readings hold at that time); a receiver without that
   hook is handed the unchanged plan again every `replan.handover_interval`, so the
   readings it takes from it stay fresh.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import datetime, timedelta

from nodewarden.api.containerdispatch import TERMINAL_PHASES
from nodewarden.dispatch.context import DispatchContext
from nodewarden.dispatch.outcomes import Outcomes
from nodewarden.dispatch.planner import Planner
from nodewarden.dispatch.replan import (
    NodeMarks,
    PlanMarks,
    earliest,
    handover_interval,
    plan_wanted,
)
from nodewarden.dispatch.runners import Runners
from nodewarden.dispatch.warming import DispatchWarmth
from nodewarden.drain import drain
from nodewarden.metrics import CONTAINERS, DISPATCH_PLANS, OVERCOMMITTED_NODES
from nodewarden.scheduling.ledger import with_starts

log = logging.getLogger(__name__)

MAX_PAUSE = 2.0
"""Longest pause a slow round adds before the next one (see `Dispatcher.run`)."""


class Loop:
    """Recovers, then runs rounds until stopped (module docstring)."""

    def __init__(
        self,
        ctx: DispatchContext,
        outcomes: Outcomes,
        runners: Runners,
        planner: Planner,
        warmth: DispatchWarmth,
    ) -> None:
        self.ctx = ctx
        self.outcomes = outcomes
        self.runners = runners
        self.planner = planner
        self.warmth = warmth
        self.node_marks = NodeMarks()

    async def start(self) -> None:
        """Rebuild state from the feed (containers, WorkerNodes and policies are already
        here) and the cloud, then probe every node once."""
        self.ctx.starts = asyncio.Semaphore(self.ctx.settings.max_concurrent_starts)
        if self.ctx.pool is not None:
            await self.ctx.pool.sync_cloud()
            await self._first_probe_round()
        self.ctx.recovered = True
        log.info(
            "dispatcher recovered",
            extra={
                "containers": len(self.ctx.queue.by_name),
                "nodes": len(self.ctx.pool.workers) if self.ctx.pool else 0,
            },
        )

    async def _first_probe_round(self, limit: float = 60.0) -> None:
        assert self.ctx.pool is not None
        workers = [w for w in self.ctx.pool.workers.values() if w.instance is not None]
        if not workers:
            return
        jobs = [asyncio.ensure_future(self.ctx.pool.probe_once(w)) for w in workers]
        _, pending = await asyncio.wait(jobs, timeout=limit)
        for job in pending:
            job.cancel()
        self.ctx.pool.ensure_probes()

    async def run(self) -> None:
        """Run rounds until `stop()`. A round costs time in proportion to the fleet and
        the queue; after a round that took T seconds the next waits at least T (at most
        `MAX_PAUSE`), so the rounds do not hold the event loop the feed, the power
        controller and the lease share."""
        loop = asyncio.get_running_loop()
        while not self.ctx.stop.is_set():
            self.ctx.wake.clear()
            started = loop.time()
            try:
                await self.step()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("dispatcher round failed; retrying next tick")
            took = min(loop.time() - started, MAX_PAUSE)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self.ctx.wake.wait(), timeout=max(self.ctx.settings.tick_interval, took)
                )
            # coalesce bursts of watch events into one round
            await asyncio.sleep(max(min(0.2, self.ctx.settings.tick_interval), took))

    def halt(self) -> None:
        """Start no more rounds (the one under way ends normally; see `stop`)."""
        self.ctx.stop.set()
        self.ctx.wake.set()

    async def stop(self, grace: float = 0.0) -> None:
        """Halt, let the writes and runner starts under way finish for up to `grace`
        seconds (`nodewarden.drain`), cancel the rest, close the adapters."""
        self.halt()
        if self.ctx.closed:
            return
        self.ctx.closed = True
        drained = await drain(self.ctx.tasks, grace)
        if drained.finished or drained.cancelled:
            log.info(
                "dispatcher stopped: %d tasks under way finished, %d cancelled",
                drained.finished,
                drained.cancelled,
            )
        if self.ctx.pool is not None:
            await self.ctx.pool.close()
        if self.ctx.prober is not None:
            await self.ctx.prober.aclose()
        if self.ctx.cloud is not None:
            await self.ctx.cloud.close()

    async def step(self) -> None:
        ctx = self.ctx
        now = ctx.clock()
        self._acknowledge_closed(now)
        pool = ctx.pool
        if pool is not None and (
            pool.sync_requested() or ctx.next_sync is None or now >= ctx.next_sync
        ):
            ctx.next_sync = now + timedelta(seconds=ctx.settings.sync_interval)
            await pool.sync_cloud()
        if ctx.pool is not None:
            if ctx.recovered and ctx.pool.declared:
                await ctx.pool.adopt_declared()
            ctx.pool.ensure_probes()
            self.runners.reconcile()
        await self.outcomes.cancellations(now)
        if ctx.queue.marks_due:  # objects whose uuid another holds (queue docstring)
            ctx.spawn(ctx.queue.mark_duplicates())
        poked, ctx.poked = ctx.poked, False
        marks = self._marks(now)
        trigger = plan_wanted(
            marks,
            ctx.marks,
            now,
            planned_at=ctx.planned_at,
            due_at=ctx.due_at,
            backstop=timedelta(seconds=ctx.settings.replan_backstop),
            outstanding=bool(ctx.inflight or ctx.claims or ctx.wait_writes),
        )
        if trigger is None:  # an idle tick (dispatch/replan.py)
            if poked and ctx.pool is not None:
                ctx.pool.contribute_statuses(ctx.containers_by_node())
            if ctx.unchanged is not None:
                ctx.unchanged(now)  # the last plan holds now (O(1) for the receiver)
            else:
                self._hand_over_again(now)
            return
        ctx.plans += 1
        DISPATCH_PLANS.labels(trigger.value).inc()
        result = self.planner.plan(now)
        ctx.last_plan = result
        await self.planner.execute(result, now)
        self.warmth.create(result)  # cloud VMs ahead of demand (dispatch.warming)
        # the marks from before the plan: whatever moved since is planned at the next
        # tick (a round that failed is not recorded, so it is planned again)
        ctx.marks, ctx.planned_at = marks, now
        ctx.due_at = earliest(self.planner.due)
        if ctx.pool is not None:
            ctx.pool.contribute_statuses(ctx.containers_by_node())
        self.planner.overcommit(result)
        self.metrics()
        chosen = {uuid: claim.node for uuid, claim in ctx.claims.items()}
        ledger = with_starts(ctx.plan_inputs, chosen)
        ctx.handed, ctx.handed_at = (ledger, result), now
        ctx.planned(ledger, result, now)

    def _marks(self, now: datetime) -> PlanMarks:
        """What a plan now would read, as counters and identities (`PlanMarks`)."""
        ctx = self.ctx
        cloud = ctx.cloud
        return PlanMarks(
            queue=ctx.queue.version,
            nodes=self.node_marks.observe(ctx.pool.workers) if ctx.pool is not None else 0,
            board=ctx.board.version,
            tasks=ctx.task_ends,
            cloud=tuple(cloud.may_create(t, now) for t in cloud.catalogue) if cloud else (),
            policy=ctx.policies.default,
            settings=ctx.settings,
            recovered=ctx.recovered,
        )

    def _hand_over_again(self, now: datetime) -> None:
        """An unchanged plan is handed to the power controller again before the demand and
        work readings it took from the last hand-over go stale (`handover_interval`)."""
        ctx = self.ctx
        if ctx.handed is None or ctx.handed_at is None:
            return
        ages = [
            p.view.telemetry_max_age
            for p in (*ctx.policies.policies.values(), ctx.policies.builtin)
        ]
        every = handover_interval(ages, timedelta(seconds=ctx.settings.replan_backstop))
        if now - ctx.handed_at < every:
            return
        ctx.handed_at = now
        ctx.planned(*ctx.handed, now)

    def _acknowledge_closed(self, now: datetime) -> None:
        """Admission the power controller closed is confirmed once no container is chosen
        for the node with its lock or start under way: from this round on the plan places
        nothing there."""
        closing = self.ctx.board.closing
        if not closing:
            return
        claimed = {claim.node for claim in self.ctx.claims.values()}
        for node in list(closing):
            if node not in claimed:
                self.ctx.board.acknowledge(node, now)

    # --- helpers --------------------------------------------------------------------------

    def metrics(self) -> None:
        phases: dict[str, int] = {p: 0 for p in ("Queued", "Locked", "Running", *TERMINAL_PHASES)}
        for c in self.ctx.queue:
            phases[c.phase or "Queued"] = phases.get(c.phase or "Queued", 0) + 1
        for phase, count in phases.items():
            CONTAINERS.labels(phase).set(count)
        OVERCOMMITTED_NODES.set(len(self.ctx.overcommitted))
        # the hourly spend is read from the worker pool at each scrape (its own source)
