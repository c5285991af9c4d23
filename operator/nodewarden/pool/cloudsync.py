"""The pool against the cloud's instance list.

Each sync lists the instances; it adopts those tagged as ours (creating their
WorkerNode), claims or destroys instances of a dispatcher that stopped probing them
(`takeover_after`), and removes the WorkerNode of an instance that disappeared. The
power controller hears the list (`observer.listed`: the trusted power source of every
VM) and, before a vanished worker's WorkerNode is removed, that its instance is gone
(`observer.gone`: destroy confirmed).
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
from nodewarden.pool.nodes import NodeStore
from nodewarden.pool.probes import ProbeLoop
from nodewarden.pool.times import iso, parse_time
from nodewarden.pool.worker import PoolState, Worker

log = logging.getLogger(__name__)


class CloudSync:
    """Lists the cloud and brings the workers in line with it (module docstring)."""

    def __init__(
        self, ctx: PoolContext, nodes: NodeStore, probes: ProbeLoop, lifecycle: Lifecycle
    ) -> None:
        self.ctx = ctx
        self.nodes = nodes
        self.probes = probes
        self.lifecycle = lifecycle

    async def sync(self) -> None:
        """List instances; adopt ours, take over stale foreign ones, drop vanished workers.

        The power controller hears the list (`observer.listed`: the trusted power source
        of every VM) and, before a vanished worker's WorkerNode is removed, that its
        instance is gone (`observer.gone`: destroy confirmed)."""
        if self.ctx.cloud is None:
            return
        now = self.ctx.clock()
        try:
            managed = await self.ctx.cloud_.list_managed_instances()
        except CloudError as exc:
            log.warning("cloud list failed: %s", exc)
            return
        listed_at = self.ctx.clock()
        self.ctx.last_sync = now
        seen: set[str] = set()
        ours: dict[str, CloudInstance] = {}
        adopt: list[tuple[CloudInstance, str]] = []
        for inst in managed:
            if inst.state is InstanceState.TERMINATED:
                continue
            owner = inst.tags.get(self.ctx.tags.dispatcher)
            if owner != self.ctx.dispatcher_id:
                await self._maybe_take_over(inst, now)
                continue
            name = inst.tags.get(self.ctx.tags.node) or f"adopted-{inst.id}".lower()
            seen.add(name)
            if name not in self.ctx.workers:
                adopt.append((inst, name))
                continue
            self._listed(self.ctx.workers[name], inst, ours)
        # adoptions (a restart: the whole fleet) run side by side, each a GET and a create
        gate = asyncio.Semaphore(16)

        async def adopt_one(inst: CloudInstance, name: str) -> None:
            async with gate:
                worker = await self._adopt(inst, name)
            if worker is not None:
                self._listed(worker, inst, ours)

        await asyncio.gather(*(adopt_one(inst, name) for inst, name in adopt))
        self.ctx.observer.listed(ours, listed_at)
        for worker in list(self.ctx.workers.values()):
            if worker.side or worker.name in seen or worker.creating:
                continue
            if worker.instance is None and now - worker.created_at < timedelta(seconds=60):
                continue  # created moments ago; the instance may not be listed yet
            if worker.instance_known_at is not None and worker.instance_known_at >= now:
                # its create returned while this list was on its way: not in it, not gone
                continue
            await self.ctx.observer.gone(self.ctx.snapshot_of(worker), listed_at)
            await self.lifecycle.forget(worker, "instance is gone from the cloud list")
        self.ctx.on_change()

    def _listed(self, worker: Worker, inst: CloudInstance, ours: dict[str, CloudInstance]) -> None:
        worker.instance = inst
        ours[worker.name] = inst
        if worker.instance_type is None and inst.instance_type:
            worker.instance_type = self.ctx.cloud_.instance_type(inst.instance_type)

    async def _adopt(self, inst: CloudInstance, name: str) -> Worker | None:
        """An instance tagged as ours without a worker: (re)create its WorkerNode."""
        itype = self.ctx.cloud_.instance_type(inst.instance_type or "")
        worker = Worker(
            name=name,
            instance_type=itype,
            created_at=inst.created_at or self.ctx.clock(),
            instance=inst,
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

    async def _maybe_take_over(self, inst: CloudInstance, now: datetime) -> None:
        """Claim an instance whose dispatcher has not probed it for `takeover_after`."""
        stamp = parse_time(inst.tags.get(self.ctx.tags.last_probe))
        reference = stamp or inst.created_at
        if reference is None or now - reference < self.ctx.takeover_after():
            return
        owner = inst.tags.get(self.ctx.tags.dispatcher)
        # keep the node name: the per-instance secret is derived from it
        name = inst.tags.get(self.ctx.tags.node) or f"claimed-{inst.id}".lower()
        name = re.sub(r"[^a-z0-9-]", "-", name)[:63].strip("-")
        log.warning(
            "claiming instance %s of dispatcher %s: no probe since %s",
            inst.id,
            owner,
            reference.isoformat(),
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
