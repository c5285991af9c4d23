"""The pool against the cloud's instance list.

Each sync lists the instances and diffs the list against the last one
(`pool/listdiff.py`): an instance of another dispatcher is looked at when it is new or
changed and again when its takeover comes due (`takeover_after` after its last-probe
tag): then it is claimed or destroyed; an instance tagged as ours without a worker is
adopted (its WorkerNode created); the WorkerNode of an instance that disappeared is
removed. The power controller hears every list (`observer.listed`: the trusted power
source of every VM, unchanged ones included, stamped with this list's time) and, before
a vanished worker's WorkerNode is removed, that its instance is gone (`observer.gone`:
destroy confirmed).

When to list (`due`, `pool/syncpace.py`): `sync_interval` after the last attempt while
a create or destroy is outstanding, a VM that answered probes stopped answering, a list
failed or a takeover comes due, else `sync_interval_at_rest`; `busy()` (a create or
destroy asked for) switches to the fast pace at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from datetime import datetime, timedelta

from nodewarden.api.kinds import WORKER_NODE
from nodewarden.cloud.errors import CloudError
from nodewarden.cloud.model import CloudInstance, InstanceState
from nodewarden.kube.client import KubeError
from nodewarden.ownership import DISPATCHER_LABEL
from nodewarden.pool.context import PoolContext
from nodewarden.pool.lifecycle import Lifecycle
from nodewarden.pool.listdiff import ListChange, diff_list
from nodewarden.pool.nodes import NodeStore
from nodewarden.pool.probes import ProbeLoop
from nodewarden.pool.syncpace import SyncPace, next_sync_at
from nodewarden.pool.times import iso, parse_time
from nodewarden.pool.worker import PoolState, Worker

log = logging.getLogger(__name__)

SYNC_CHUNK = 2000
"""Listed instances folded in between two yields to the event loop."""


class CloudSync:
    """Lists the cloud and brings the workers in line with it (module docstring)."""

    def __init__(
        self, ctx: PoolContext, nodes: NodeStore, probes: ProbeLoop, lifecycle: Lifecycle
    ) -> None:
        self.ctx = ctx
        self.nodes = nodes
        self.probes = probes
        self.lifecycle = lifecycle
        self.view: dict[str, CloudInstance] = {}
        """The last list by instance id (terminated instances left out)."""
        self.foreign: dict[str, CloudInstance] = {}
        """Instances of other dispatchers in the last list, by id, whose takeover is not
        due yet (looked at again when it is)."""
        self.takeover_due: datetime | None = None
        """The earliest time one of `foreign` may be claimed."""
        self.attempted_at: datetime | None = None
        self.outstanding = True
        """A create or destroy not yet confirmed by a list, or the last list failed."""
        self.last_change: ListChange | None = None

    def busy(self) -> None:
        """A create or destroy was asked for: list at the fast pace from now on."""
        self.outstanding = True

    def next_sync_at(self) -> datetime | None:
        """When the next list is due (None: at once)."""
        pace = SyncPace.of_seconds(
            self.ctx.settings.sync_interval, self.ctx.settings.sync_interval_at_rest
        )
        return next_sync_at(
            self.attempted_at,
            outstanding=self.outstanding,
            takeover_due=self.takeover_due,
            pace=pace,
        )

    def due(self) -> bool:
        at = self.next_sync_at()
        return at is None or self.ctx.clock() >= at

    async def sync(self) -> None:
        """List instances; adopt ours, take over stale foreign ones, drop vanished workers
        (module docstring)."""
        now = self.ctx.clock()
        self.attempted_at = now
        if self.ctx.cloud is None:
            self.outstanding = False
            return
        self.outstanding = False  # a create or destroy asked for from here on sets it again
        try:
            managed = await self.ctx.cloud_.list_managed_instances()
        except CloudError as exc:
            log.warning("cloud list failed: %s", exc)
            self.outstanding = True  # retried at the fast pace
            self.ctx.observer.list_failed(self.ctx.clock())
            return
        listed_at = self.ctx.clock()
        self.ctx.last_sync = now
        change = diff_list(
            self.view, (i for i in managed if i.state is not InstanceState.TERMINATED)
        )
        self.view = change.view
        self.last_change = change
        for inst in change.vanished:
            self.foreign.pop(inst.id, None)
        for inst in change.arrivals:
            if inst.tags.get(self.ctx.tags.dispatcher) == self.ctx.dispatcher_id:
                self.foreign.pop(inst.id, None)
            else:
                self.foreign[inst.id] = inst
        await self._take_over_due(now)
        seen: set[str] = set()
        ours: dict[str, CloudInstance] = {}
        adopt: list[tuple[CloudInstance, str]] = []
        owner_key, node_key, me = (
            self.ctx.tags.dispatcher,
            self.ctx.tags.node,
            self.ctx.dispatcher_id,
        )
        workers = self.ctx.workers
        for n, inst in enumerate(list(change.view.values()), 1):
            if n % SYNC_CHUNK == 0:
                await asyncio.sleep(0)  # ~1.5 ms of work between yields to the loop
            if inst.tags.get(owner_key) != me:
                continue
            name = inst.tags.get(node_key) or f"adopted-{inst.id}".lower()
            seen.add(name)
            worker = workers.get(name)
            if worker is None:
                adopt.append((inst, name))
                continue
            self._listed(worker, inst, ours)
        # adoptions (a restart: the whole fleet) run side by side, each a GET and a create
        gate = asyncio.Semaphore(16)

        async def adopt_one(inst: CloudInstance, name: str) -> None:
            async with gate:
                worker = await self._adopt(inst, name)
            if worker is not None:
                self._listed(worker, inst, ours)

        await asyncio.gather(*(adopt_one(inst, name) for inst, name in adopt))
        self.ctx.observer.listed(ours, listed_at)
        for name in list(workers.keys() - seen):
            worker = workers[name]
            if worker.side or worker.creating:
                continue
            if worker.instance is None and now - worker.created_at < timedelta(seconds=60):
                self.outstanding = True
                continue  # created moments ago; the instance may not be listed yet
            if worker.instance_known_at is not None and worker.instance_known_at >= now:
                # its create returned while this list was on its way: not in it, not gone
                self.outstanding = True
                continue
            await self.ctx.observer.gone(self.ctx.snapshot_of(worker), listed_at)
            await self.lifecycle.forget(worker, "instance is gone from the cloud list")
        if any(_unsettled(w) for w in workers.values()):
            self.outstanding = True
        self.ctx.on_change()

    async def _take_over_due(self, now: datetime) -> None:
        """Claim (or destroy) each foreign instance whose takeover is due; keep the rest
        with the earliest time one comes due."""
        earliest: datetime | None = None
        for iid, inst in list(self.foreign.items()):
            due = self._takeover_at(inst)
            if due is None:
                continue  # no stamp and no launch time: never claimable (as before)
            if due <= now:
                # out of the view too: if it is still another's at the next list (claim
                # and destroy both failed) it arrives again and is looked at again
                del self.foreign[iid]
                self.view.pop(iid, None)
                self.outstanding = True  # the claimed instance is ours at the next list
                await self._take_over(inst, now)
            elif earliest is None or due < earliest:
                earliest = due
        self.takeover_due = earliest

    def _takeover_at(self, inst: CloudInstance) -> datetime | None:
        """When `inst` may be claimed: `takeover_after` after its last probe stamp (or
        its launch), None when it has neither."""
        stamp = parse_time(inst.tags.get(self.ctx.tags.last_probe))
        reference = stamp or inst.created_at
        return reference + self.ctx.takeover_after() if reference is not None else None

    def _listed(self, worker: Worker, inst: CloudInstance, ours: dict[str, CloudInstance]) -> None:
        worker.instance = inst
        ours[worker.name] = inst
        if worker.instance_type is None and inst.instance_type:
            worker.instance_type = self.ctx.cloud_.instance_type(inst.instance_type)

    async def _adopt(self, inst: CloudInstance, name: str) -> Worker | None:
        """An instance tagged as ours without a worker: (re)create its WorkerNode."""
        itype = self.ctx.cloud_.instance_type(inst.instance_type or "")
        now = self.ctx.clock()
        worker = Worker(
            name=name,
            instance_type=itype,
            created_at=inst.created_at or now,
            instance=inst,
            found_at=now,
        )
        self.nodes.gone.pop(name, None)
        self.ctx.workers[name] = worker
        body = await self.ctx.kube.get(WORKER_NODE, self.ctx.namespace, name)
        if body is not None and not self.nodes.ours(body):
            # a WorkerNode of another dispatcher for an instance we claimed: take it over
            try:
                body = await self.ctx.kube.patch(
                    WORKER_NODE,
                    self.ctx.namespace,
                    name,
                    {"metadata": {"labels": {DISPATCHER_LABEL: self.ctx.dispatcher_id}}},
                )
            except KubeError as exc:
                log.warning("could not relabel WorkerNode %s: %s", name, exc)
                worker.move(PoolState.GONE, "its WorkerNode could not be made")
                del self.ctx.workers[name]
                return None
        if body is None:
            try:
                body = await self.ctx.kube.create(
                    WORKER_NODE, self.ctx.namespace, self.nodes.body_for(name, itype, inst)
                )
            except KubeError as exc:
                log.warning("could not create WorkerNode for adopted %s: %s", inst.id, exc)
                worker.move(PoolState.GONE, "its WorkerNode could not be made")
                del self.ctx.workers[name]
                return None
            log.info("adopted instance %s as WorkerNode %s", inst.id, name)
        self.nodes.take(body)
        worker = self.ctx.workers[name]
        worker.instance = inst
        self.probes.ensure(worker)
        return worker

    async def _take_over(self, inst: CloudInstance, now: datetime) -> None:
        """Claim an instance whose dispatcher has not probed it for `takeover_after`."""
        reference = parse_time(inst.tags.get(self.ctx.tags.last_probe)) or inst.created_at
        owner = inst.tags.get(self.ctx.tags.dispatcher)
        # keep the node name: the per-instance secret is derived from it
        name = inst.tags.get(self.ctx.tags.node) or f"claimed-{inst.id}".lower()
        name = re.sub(r"[^a-z0-9-]", "-", name)[:63].strip("-")
        log.warning(
            "claiming instance %s of dispatcher %s: no probe since %s",
            inst.id,
            owner,
            reference.isoformat() if reference else "never",
        )
        tags = {
            **{k: v for k, v in inst.tags.items() if self.ctx.tags.owns(k)},
            self.ctx.tags.node: name,
            self.ctx.tags.last_probe: iso(now) or "",
        }
        tags.pop(self.ctx.tags.dispatcher, None)
        try:
            await self.ctx.cloud_.set_tags(inst, tags)
        except CloudError as exc:
            log.warning("claim of %s failed (%s); destroying it instead", inst.id, exc)
            with contextlib.suppress(CloudError):
                await self.ctx.cloud_.destroy(inst)
            return
        claimed = inst.model_copy(
            update={"tags": {**inst.tags, **tags, self.ctx.tags.dispatcher: self.ctx.dispatcher_id}}
        )
        await self._adopt(claimed, name)


def _unsettled(worker: Worker) -> bool:
    """A VM the next list should confirm soon: its create or destroy is under way, or it
    stopped answering probes (the list tells whether it is stopped or gone)."""
    return not worker.side and (
        worker.creating
        or worker.destroy_requested_at is not None
        or (worker.last_success is not None and worker.attempts_since_success > 0)
    )
