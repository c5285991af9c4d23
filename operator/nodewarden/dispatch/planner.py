"""Placement: plan from the capacity ledger with the pure scheduler, then carry it out.

Plan (`plan`, `nodewarden.scheduling.scheduler.plan`) from the capacity ledger
(`nodewarden.scheduling.ledger`): a container holds its node from the moment it is
chosen for it (`claims`, before the Locked write) until its runner is seen gone there,
in every phase; a lock from before a restart is placed again only after the node's
runner list was read and the node said its runner never ran. The placement levers are
the default policy's `spec.placement`; the boot times seen (`rules.boots`) go with the
node views; the plan's due time (a wait budget running out) is one of the planner's.

Execute (`execute`): fail unsatisfiable containers, unlock stale locks and overflow,
lock + start runners, create instances (through the pool's `admit` choke point), and
write scheduling statuses that changed. Nothing here blocks the round: writes and
starts run as background tasks, one at a time per container.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import datetime, timedelta

from nodewarden.api.containerdispatch import ContainerResources
from nodewarden.cloud.errors import CloudErrorKind
from nodewarden.dispatch.context import DispatchContext
from nodewarden.dispatch.outcomes import Outcomes
from nodewarden.dispatch.queue import Container
from nodewarden.dispatch.runners import Runners
from nodewarden.dispatch.views import NodeViews
from nodewarden.metrics import CREATES_STOPPED
from nodewarden.pool.times import iso
from nodewarden.rules.consolidation import protected
from nodewarden.scheduling.caps import PolicyLimits, effective_limits
from nodewarden.scheduling.instancetypes import Catalogue, InstanceTypePolicy
from nodewarden.scheduling.ledger import Claim, Placement, account
from nodewarden.scheduling.placement import PlacementRules
from nodewarden.scheduling.scheduler import lock_retry_at, plan
from nodewarden.scheduling.views import CloudState, ContainerView, Phase, Plan

log = logging.getLogger(__name__)


class Planner:
    """Plans each round and carries the plan out (module docstring)."""

    def __init__(
        self, ctx: DispatchContext, outcomes: Outcomes, runners: Runners, views: NodeViews
    ) -> None:
        self.ctx = ctx
        self.outcomes = outcomes
        self.runners = runners
        self.views = views
        self._views: dict[str, tuple[Container, Phase, str | None, ContainerView]] = {}
        """Each container's view in the last plan, with the object, phase and node it was
        made from (reused while they stay: most of a queue is unchanged between plans)."""
        self.due: list[datetime] = []
        """Times named by the last plan and its execution at which the next plan may
        differ though nothing changes meanwhile (`dispatch.replan`)."""

    def _catalogue(self) -> Catalogue:
        if self.ctx.cloud is None:
            return Catalogue()
        return Catalogue(types=tuple(self.ctx.cloud.catalogue))

    def plan(self, now: datetime) -> Plan:
        """Plan from the capacity ledger (`scheduling.ledger.account`): what holds each
        node (claims, Locked and Running containers, cancelled ones whose runner still
        runs, every runner a node lists) and the Queued containers that may be placed."""
        max_flaps = self.ctx.policies.default.spec.dispatch.max_lock_flaps
        self.ctx.held_back = {}
        self.due = []
        last_views, self._views = self._views, {}

        def view_of(
            c: Container, phase: Phase, resources: ContainerResources, node: str | None
        ) -> ContainerView:
            made = last_views.get(c.uuid)
            if made is not None and made[0] is c and made[1] is phase and made[2] == node:
                view = made[3]
                if view.resources is resources:
                    self._views[c.uuid] = made
                    return view
            view = self._view(c, phase, resources, node, now)
            self._views[c.uuid] = (c, phase, node, view)
            return view

        placed: list[Placement] = []
        queued: list[ContainerView] = []
        known: dict[str, Container] = {}
        for c in self.ctx.queue:
            spec = c.spec
            if spec is None:
                continue
            known[c.uuid] = c
            if c.terminal:
                continue
            claim = self.ctx.claims.get(c.uuid)
            node = c.status.node if c.phase in ("Locked", "Running") else None
            if claim is None and node is None:
                if c.cancel_requested or c.uuid in self.ctx.inflight:
                    continue
                retry = lock_retry_at(c.status.lock_flaps, max_flaps, c.status.locked_at, now)
                if retry is not None:
                    self.due.append(retry)
                    self.ctx.held_back[c.uuid] = (
                        f"waiting: unlocked {c.status.lock_flaps} times (policy maxLockFlaps "
                        f"{max_flaps}); next try after {iso(retry)}"
                    )
                    continue
                queued.append(view_of(c, Phase.QUEUED, spec.resources, None))
                continue
            phase = Phase.RUNNING if c.phase == "Running" else Phase.LOCKED
            if node is None:
                phase = Phase.QUEUED
            view = view_of(c, phase, c.status.resources or spec.resources, node)
            if c.cancel_requested and node is not None:
                view = replace(view, frees_at=self._frees_at(c, now))
            placed.append(
                Placement(
                    view,
                    cancelling=c.cancel_requested,
                    claim=claim,
                    checked=c.uuid in self.ctx.locks_checked,
                )
            )
        listings = (
            {w.name: w.runners for w in self.ctx.pool.workers.values() if w.runners is not None}
            if self.ctx.pool is not None
            else {}
        )
        remembered = self.ctx.held_resources

        def resources_of(uuid: str) -> ContainerResources | None:
            c = known.get(uuid)
            if c is not None and c.spec is not None:
                return c.status.resources or c.spec.resources
            return remembered.get(uuid)

        ledger = account(placed, queued, listings, resources_of)
        self.ctx.held_resources = ledger.held
        containers = self.ctx.plan_inputs = ledger.views
        nodes = self.views.nodes(self.ctx.pool.workers.values()) if self.ctx.pool else []
        # the hard caps (scheduling.caps): the operator's ceilings and the default policy's
        # limits; no creates at all while the default policy is missing or invalid
        policy, stopped = self.ctx.policies.create_limits()
        CREATES_STOPPED.set(1 if stopped else 0)
        catalogue = self._catalogue()
        limits = effective_limits(
            policy or PolicyLimits(self.ctx.policies.default_name),
            self.ctx.settings.limits.ceilings(),
            (t.name for t in catalogue.types),
        )
        self.views.boots.watch(nodes, now)
        cloud = replace(self._cloud_state(now), boot_seconds=self.views.boots.types())
        if stopped is not None:
            cloud = replace(cloud, creates_blocked=f"no instance is created: {stopped}")
        result = plan(
            containers,
            nodes,
            catalogue,
            self.ctx.cloud.config.instance_type_policy if self.ctx.cloud else InstanceTypePolicy(),
            limits,
            cloud,
            now,
            PlacementRules.of(self.ctx.policies.default.spec.placement),
        )
        if result.due is not None:
            self.due.append(result.due)  # a wait budget or an expected wake: a due time
        return result

    def _frees_at(self, c: Container, now: datetime) -> datetime:
        """When a cancelled container's node is expected to have seen its runner gone: a
        KILL `term_timeout` after the first TERM, then one probe."""
        settings = self.ctx.settings
        first = c.first_term_at or now
        return first + timedelta(seconds=settings.term_timeout + settings.probe_interval)

    @staticmethod
    def _view(
        c: Container,
        phase: Phase,
        resources: ContainerResources,
        node: str | None,
        now: datetime,
    ) -> ContainerView:
        assert c.spec is not None
        created = c.body.get("metadata", {}).get("creationTimestamp")
        first_seen = c.status.first_seen or (
            datetime.fromisoformat(created.replace("Z", "+00:00")) if created else now
        )
        return ContainerView(
            uuid=c.uuid,
            phase=phase,
            priority=c.spec.priority,
            first_seen=first_seen,
            resources=resources,
            node=node,
            do_not_consolidate=protected(c.body.get("metadata", {}).get("annotations")),
        )

    def _cloud_state(self, now: datetime) -> CloudState:
        if self.ctx.cloud is None or self.ctx.pool is None:
            return CloudState(creates_blocked="no cloud is configured")
        blocked: dict[str, str] = {}
        kinds: set[CloudErrorKind | None] = set()
        for t in self.ctx.cloud.catalogue:
            permission = self.ctx.cloud.may_create(t, now)
            if not permission.allowed:
                blocked[t.name] = permission.reason
                kinds.add(permission.blocked_by)
        all_blocked = None
        if self.ctx.cloud.catalogue and len(blocked) == len(self.ctx.cloud.catalogue):
            if CloudErrorKind.QUOTA in kinds:
                all_blocked = "cloud instance quota reached; creates paused"
            elif CloudErrorKind.RATE_LIMIT in kinds:
                all_blocked = "cloud API rate limit; creates paused"
            elif CloudErrorKind.AUTH in kinds:
                all_blocked = "cloud credentials refused; creates paused"
            else:
                all_blocked = "every instance type is blocked by cloud errors"
        room = self.ctx.settings.max_new_nodes_per_round - self.ctx.pool.pending_creates()
        return CloudState(
            creates_blocked=all_blocked, blocked_types=blocked, max_new_nodes=max(0, room)
        )

    # --- 5. execute -----------------------------------------------------------------------

    async def execute(self, result: Plan, now: datetime) -> None:
        """Carry out a plan. Nothing here blocks the round: writes and starts run as
        background tasks (one at a time per container), creates register their worker at
        once so the next plan counts them."""
        if self.ctx.stop.is_set():
            return  # stopping: what is under way finishes, nothing new begins
        by_uuid = self.ctx.queue.by_uuid()
        # With no cloud, what fits nowhere waits (a side node may be added): its status
        # says so through the waits below -- not a task holding the container in flight,
        # which `outcomes.wait` would take for a start under way and skip, every round.
        unfit: dict[str, str] = {}
        for uuid, why in result.unsatisfiable.items():
            c = by_uuid.get(uuid)
            if c is None or uuid in self.ctx.inflight:
                continue
            if self.ctx.cloud is not None:
                self.ctx.spawn_guarded(
                    uuid, self.outcomes.finish(c, "Failed", "NoInstanceTypeFits", why)
                )
            else:  # (no catalogue to name: say what would fix it)
                unfit[uuid] = (
                    "waiting: no side node fits it and no cloud is configured "
                    "(add a side node WorkerNode that fits, or configure cloud)"
                )
        if not self.ctx.recovered:
            return
        if result.creates or result.waits:
            log.debug(
                "plan: %d starts, %d creates, %d waiting (%s)",
                len(result.starts),
                len(result.creates),
                len(result.waits),
                "; ".join(sorted(set(result.waits.values())))[:300],
            )
        if self.ctx.pool is not None and self.ctx.cloud is not None:
            for create in result.creates:
                itype = self.ctx.cloud.instance_type(create.instance_type)
                if itype is not None:
                    self.ctx.pool.create(itype)
        for uuid, why in result.unlocks.items():
            c = by_uuid.get(uuid)
            if (
                c is None
                or uuid in self.ctx.inflight
                or uuid in self.ctx.claims
                or c.status.locked_by not in (None, self.ctx.dispatcher_id)
            ):
                continue
            reason = "Overflow" if uuid in result.overflow else "Unlocked"
            self.ctx.spawn_guarded(uuid, self.runners.unlock(c, why, reason))
        for start in result.starts:
            c = by_uuid.get(start.uuid)
            if c is None or c.spec is None or start.uuid in self.ctx.inflight:
                continue
            # it holds the node from now on, before its Locked write is sent
            held = c.status.resources if start.relock else None
            self.ctx.claims[start.uuid] = Claim(start.node, held or c.spec.resources)
            self.ctx.spawn_guarded(
                start.uuid, self.runners.start(c, start.node, start.relock, start.gpu_work)
            )
        for uuid, why in [*result.waits.items(), *unfit.items(), *self.ctx.held_back.items()]:
            c = by_uuid.get(uuid)
            if c is None or uuid in self.ctx.inflight or uuid in self.ctx.wait_writes:
                continue
            if not self.outcomes.wait_changes(c, why):
                due = self.outcomes.wait_due(c, why)
                if due is not None:
                    self.due.append(due)
                continue
            self.ctx.wait_writes.add(uuid)
            self.ctx.spawn(self.outcomes.wait_guarded(uuid, c, why))

    def overcommit(self, result: Plan) -> None:
        """A node found running more than it holds (an old leader's overcommit) is
        announced -- the plan gives it no new work until it fits -- and never "fixed" by
        killing: its runners finish on their own."""
        over = result.over_capacity
        for node, what in over.items():
            if self.ctx.overcommitted.get(node) is None:
                log.warning("WorkerNode %s runs more than it holds: %s", node, what)
        for node in set(self.ctx.overcommitted) - set(over):
            log.info("WorkerNode %s fits its capacity again", node)
        self.ctx.overcommitted = dict(over)

    # --- 7. metrics and status ------------------------------------------------------------
