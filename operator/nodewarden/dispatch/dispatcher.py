"""The dispatcher: turns queued containers into running ones on cloud VMs and side nodes.

`Dispatcher` is the dispatcher's one entry (the composition root builds it; the feed,
the service and the handlers call it). It composes collaborators that share a
`DispatchContext` and call one another one way only (each only those listed before it):

    Outcomes   dispatch/outcomes.py   container status writes: ends, requeues, cancels, waits
    Runners    dispatch/runners.py    runners vs containers, runner starts, runner-gone evidence
    NodeViews  dispatch/views.py      the scheduler's view of each node (the power board's)
    Planner    dispatch/planner.py    plan from the capacity ledger, then carry it out
    Loop       dispatch/loop.py       recovery at start-up and the rounds (the steps of a round)
    NodeList   dispatch/nodelist.py   the management API's node and container list
    DispatchWarmth dispatch/warming.py cloud VMs ahead of demand (warm capacity)

What the pool owns (a worker's runners, its last container, when to probe it again) the
dispatcher never writes: it tells the worker what happened (`pool.worker.Worker`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from nodewarden.api.workernode import WorkerNodeSpec
from nodewarden.clock import utc_now
from nodewarden.config import DispatchSettings
from nodewarden.dispatch.context import DispatchContext, ignore_plan
from nodewarden.dispatch.loop import Loop
from nodewarden.dispatch.nodelist import NodeList
from nodewarden.dispatch.outcomes import Outcomes
from nodewarden.dispatch.planner import Planner
from nodewarden.dispatch.ports import CloudPort, ContainerQueuePort, ProberPort, WorkerPoolPort
from nodewarden.dispatch.runners import Runners
from nodewarden.dispatch.views import NodeViews
from nodewarden.dispatch.warming import DispatchWarmth
from nodewarden.fleet.admission import AdmissionReader
from nodewarden.fleet.board import PowerBoard
from nodewarden.fleet.policies import PolicyBook
from nodewarden.scheduling.views import ContainerView, Plan


class Dispatcher:
    """The dispatcher of one install (see the module docstring)."""

    def __init__(
        self,
        *,
        namespace: str,
        dispatcher_id: str,
        settings: DispatchSettings,
        queue: ContainerQueuePort,
        policies: PolicyBook,
        pool: WorkerPoolPort | None,
        cloud: CloudPort | None,
        prober: ProberPort | None,
        board: PowerBoard | None = None,
        planned: Callable[[list[ContainerView], Plan, datetime], None] = ignore_plan,
        clock: Callable[[], datetime] = utc_now,
        admission: AdmissionReader | None = None,
    ) -> None:
        self.ctx = DispatchContext(
            namespace=namespace,
            dispatcher_id=dispatcher_id,
            settings=settings,
            queue=queue,
            policies=policies,
            pool=pool,
            cloud=cloud,
            prober=prober,
            board=board if board is not None else PowerBoard(),
            planned=planned,
            clock=clock,
            admission=admission,
        )
        self.outcomes = Outcomes(self.ctx)
        self.runners = Runners(self.ctx, self.outcomes)
        self.views = NodeViews(self.ctx.board)
        self.planner = Planner(self.ctx, self.outcomes, self.runners, self.views)
        self.warmth = DispatchWarmth(self.ctx, self.views)
        self.loop = Loop(self.ctx, self.outcomes, self.runners, self.planner, self.warmth)
        self.nodelist = NodeList(self.ctx)

    # --- the parts the composition root and the service use ---------------------------

    @property
    def queue(self) -> ContainerQueuePort:
        return self.ctx.queue

    @property
    def pool(self) -> WorkerPoolPort | None:
        return self.ctx.pool

    @property
    def cloud(self) -> CloudPort | None:
        return self.ctx.cloud

    @property
    def prober(self) -> ProberPort | None:
        return self.ctx.prober

    @property
    def settings(self) -> DispatchSettings:
        return self.ctx.settings

    @settings.setter
    def settings(self, settings: DispatchSettings) -> None:
        self.ctx.settings = settings

    @property
    def planned(self) -> Callable[[list[ContainerView], Plan, datetime], None]:
        """Called after every round with the capacity ledger once the plan's starts are
        chosen (`ledger.with_starts`) and the plan (the power controller takes each
        node's work and the demand for side nodes from them)."""
        return self.ctx.planned

    @planned.setter
    def planned(self, planned: Callable[[list[ContainerView], Plan, datetime], None]) -> None:
        self.ctx.planned = planned

    @property
    def unchanged(self) -> Callable[[datetime], None] | None:
        """Told at an idle tick that the last plan still holds (`DispatchContext.unchanged`)."""
        return self.ctx.unchanged

    @unchanged.setter
    def unchanged(self, unchanged: Callable[[datetime], None] | None) -> None:
        self.ctx.unchanged = unchanged

    @property
    def overcommitted(self) -> Mapping[str, str]:
        """Nodes found running more than they hold (announced once, never fixed by killing)."""
        return self.ctx.overcommitted

    @property
    def recovered(self) -> bool:
        """The first probe round after start-up is done."""
        return self.ctx.recovered

    # --- events from the feed -----------------------------------------------------------

    def observe_container(self, body: Mapping[str, Any], deleted: bool = False) -> None:
        self.ctx.queue.observe(body, deleted)
        self.ctx.wake.set()

    def observe_node(
        self, body: Mapping[str, Any], deleted: bool = False, spec: WorkerNodeSpec | None = None
    ) -> None:
        if self.ctx.pool is not None:
            self.ctx.pool.observe_node(body, deleted, spec)
        self.ctx.poked = True
        self.ctx.wake.set()

    def observe_policy(self, body: Mapping[str, Any], deleted: bool = False) -> None:
        self.ctx.policies.observe(body, deleted)
        self.ctx.wake.set()

    def poke(self) -> None:
        """Something may have changed (a probe folded, a policy observed): the next tick
        looks, and plans only if what the plan reads moved (`dispatch.replan`)."""
        self.ctx.poked = True
        self.ctx.wake.set()

    # --- life cycle (dispatch/loop.py) --------------------------------------------------

    async def start(self) -> None:
        await self.loop.start()

    async def run(self) -> None:
        await self.loop.run()

    async def step(self) -> None:
        await self.loop.step()

    def halt(self) -> None:
        self.loop.halt()

    async def stop(self, grace: float = 0.0) -> None:
        await self.loop.stop(grace)

    def snapshot(self) -> dict[str, Any]:
        """Live view for the management status endpoint (not stored anywhere)."""
        return self.nodelist.snapshot()
