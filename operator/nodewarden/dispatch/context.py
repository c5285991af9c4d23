"""What every collaborator of the dispatcher shares: its ports, settings and round state.

`Dispatcher` (dispatch/dispatcher.py) makes one `DispatchContext` and hands it to each
collaborator (`Outcomes`, `Runners`, `Planner`, `Loop`, `NodeList`); they call one
another one way only (see dispatch/dispatcher.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from nodewarden.api.containerdispatch import ContainerResources
from nodewarden.clock import utc_now
from nodewarden.config import DispatchSettings
from nodewarden.dispatch.ports import CloudPort, ContainerQueuePort, ProberPort, WorkerPoolPort
from nodewarden.dispatch.replan import PlanMarks
from nodewarden.fleet.admission import AdmissionReader
from nodewarden.fleet.board import PowerBoard
from nodewarden.fleet.policies import PolicyBook
from nodewarden.scheduling.ledger import Claim
from nodewarden.scheduling.views import ContainerView, Plan

log = logging.getLogger(__name__)


def ignore_plan(containers: list[ContainerView], plan: Plan, now: datetime) -> None:
    return None


@dataclass
class DispatchContext:
    """The dispatcher's ports and settings, and what one round leaves for the next."""

    namespace: str
    dispatcher_id: str
    settings: DispatchSettings
    queue: ContainerQueuePort
    policies: PolicyBook
    pool: WorkerPoolPort | None
    cloud: CloudPort | None
    prober: ProberPort | None
    board: PowerBoard = field(default_factory=PowerBoard)
    """What the power controller says about each node (admission, state, readiness)."""
    planned: Callable[[list[ContainerView], Plan, datetime], None] = ignore_plan
    """Called after every round with the capacity ledger once the plan's starts are chosen
    (`ledger.with_starts`) and the plan (the power controller takes each node's work and
    the demand for side nodes from them)."""
    clock: Callable[[], datetime] = utc_now
    admission: AdmissionReader | None = None
    """Cross-process admission (`dispatch.admitting`): after each lock write, the node's
    admission is read from the API server before the runner starts. None (the default):
    the in-memory board alone, as in one process."""
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    plan_inputs: list[ContainerView] = field(default_factory=list)
    recovered: bool = False
    inflight: set[str] = field(default_factory=set)
    wait_writes: set[str] = field(default_factory=set)
    held_back: dict[str, str] = field(default_factory=dict)
    locks_checked: set[str] = field(default_factory=set)
    """Locked containers whose node said their runner never ran (`_check_lock`): only
    these may be started again under the same lock, and only once -- a start spends the
    answer (`_lock_and_start`), so a later absence is asked about again."""
    running_seen: dict[tuple[str, str, int], datetime] = field(default_factory=dict)
    """(uuid, node, attempts) of each Running container -> when this replica first saw it
    Running (its own clock): a runner list sent later was sent after the runner started
    (the Running write follows the start), so a runner it lacks is gone. Never the
    container's `startedAt`, which another replica's clock may have stamped."""
    claims: dict[str, Claim] = field(default_factory=dict)
    """Containers chosen for a node whose Locked write or runner start is under way: each
    holds its node in the ledger from the moment it is chosen (see `_start`)."""
    held_resources: dict[str, ContainerResources] = field(default_factory=dict)
    """What every container holding capacity held in the last round (a runner whose
    container was deleted meanwhile is counted with it)."""
    overcommitted: dict[str, str] = field(default_factory=dict)
    """Nodes found running more than they hold (announced once, never fixed by killing)."""
    unwanted_terms: dict[tuple[str, str], tuple[datetime, datetime]] = field(default_factory=dict)
    """(node, container uuid) of a runner nobody wants -> (first, last) signal sent."""
    last_plan: Plan | None = None
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    closed: bool = False
    starts: asyncio.Semaphore | None = None
    next_sync: datetime | None = None
    # --- when to plan (dispatch/replan.py) ------------------------------------------------
    plans: int = 0
    """Plans made (`nodewarden_dispatch_plans_total`)."""
    task_ends: int = 0
    """Background tasks of containers (starts, lock checks, writes) that ended: the plan
    reads `inflight`, `claims` and `locks_checked`, which they change."""
    poked: bool = False
    """The pool or the feed poked since the last tick (a probe, a node observed)."""
    marks: PlanMarks | None = None
    """What the last plan was made from."""
    planned_at: datetime | None = None
    due_at: datetime | None = None
    """The first time the last plan named at which it may differ (a lock-flap retry, a
    deferred scheduling-status write)."""
    handed_at: datetime | None = None
    """When `planned` was last called (the plan is handed over again, unchanged, before
    the power controller's demand and work readings from it would go stale)."""
    handed: tuple[list[ContainerView], Plan] | None = None
    unchanged: Callable[[datetime], None] | None = None
    """Told at an idle tick that the last plan still holds (the power controller's
    `plan_unchanged`: O(1), its demand readings hold at that time). Unset: the unchanged
    plan is handed over again before those readings would go stale."""

    # --- events from the feed -------------------------------------------------------------

    def spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def spawn_guarded(self, uuid: str, coro: Any) -> None:
        """Run `coro` in the background with container `uuid` in flight meanwhile (one
        task at a time per container); a round follows when it ends."""
        self.inflight.add(uuid)

        async def run() -> None:
            try:
                await coro
            except Exception:
                log.exception("task for container %s failed", uuid)
            finally:
                self.inflight.discard(uuid)
                self.task_ends += 1
                self.wake.set()

        self.spawn(run())

    def max_attempts(self) -> int:
        return self.policies.default.spec.dispatch.max_attempts

    def containers_by_node(self) -> dict[str, list[str]]:
        """The Locked and Running containers of each node (container uuids)."""
        out: dict[str, list[str]] = {}
        for c in self.queue:
            if c.phase in ("Locked", "Running") and c.status.node:
                out.setdefault(c.status.node, []).append(c.uuid)
        return out
