"""Creating and destroying the pool's cloud instances.

A create registers its worker at once (so the next plan counts it), then makes the
WorkerNode and then the instance in the background; every create, planned or declared,
passes `Admissions.admit` first. A destroy shuts the instance down (idempotent); the
WorkerNode goes once the instance is unlisted (`forget`, called by the cloud sync).
"""

from __future__ import annotations

import logging

from nodewarden.api.kinds import WORKER_NODE
from nodewarden.cloud.errors import CloudError, TransientCloudError
from nodewarden.kube.client import KubeError
from nodewarden.ownership import DISPATCHER_LABEL
from nodewarden.pool.admissions import Admissions
from nodewarden.pool.context import PoolContext
from nodewarden.pool.identity import instance_secret, new_nonce
from nodewarden.pool.nodes import MANAGED_BY, NODE_FINALIZER, NodeStore
from nodewarden.pool.probes import ProbeLoop
from nodewarden.pool.worker import PoolState, Worker, node_name_for
from nodewarden.scheduling.instancetypes import InstanceType

log = logging.getLogger(__name__)


class Lifecycle:
    """Creates and destroys instances (and removes the WorkerNode of a vanished one)."""

    def __init__(
        self, ctx: PoolContext, nodes: NodeStore, probes: ProbeLoop, admissions: Admissions
    ) -> None:
        self.ctx = ctx
        self.nodes = nodes
        self.probes = probes
        self.admissions = admissions

    async def adopt_declared(self) -> None:
        """Give each declared CloudVM WorkerNode an instance: label it ours, then create --
        if the caps allow it now (`admit`); else it stays declared, held with the reason."""
        if self.ctx.cloud is None:
            return
        for name, body in list(self.nodes.declared.items()):
            itype = self.ctx.cloud_.instance_type(
                (body.get("spec") or {}).get("instanceType") or ""
            )
            if itype is None:
                del self.nodes.declared[name]
                continue  # its Valid condition names the unknown instance type
            admission = self.admissions.admit(itype)
            if not admission.allowed:
                self.admissions.hold(name, admission)
                continue
            del self.nodes.declared[name]
            self.admissions.release(name)
            finalizers = list(body["metadata"].get("finalizers") or [])
            if NODE_FINALIZER not in finalizers:
                finalizers.append(NODE_FINALIZER)
            try:
                patched = await self.ctx.kube.patch(
                    WORKER_NODE,
                    self.ctx.namespace,
                    name,
                    {
                        "metadata": {
                            "labels": {DISPATCHER_LABEL: self.ctx.dispatcher_id, **MANAGED_BY},
                            "finalizers": finalizers,
                            "resourceVersion": body["metadata"].get("resourceVersion"),
                        }
                    },
                )
            except KubeError as exc:
                # typically a conflict (its status was written meanwhile): read it again
                # and try in the next round -- dropped, it would wait for a watch event
                # that may never come, with no instance and no condition
                log.info("could not take declared WorkerNode %s: %s", name, exc)
                await self.nodes.redeclare(name)
                continue
            worker = Worker(
                name=name, instance_type=itype, created_at=self.ctx.clock(), creating=True
            )
            self.ctx.workers[name] = worker
            self.nodes.take(patched)
            log.info("creating a %s instance for declared WorkerNode %s", itype.name, name)
            self.ctx.background(self._create_instance(worker, itype))

    def pending_creates(self) -> int:
        return sum(1 for w in self.ctx.workers.values() if w.creating)

    def create(self, itype: InstanceType) -> Worker | None:
        """Register a new worker now (so the next plan counts it) and create its WorkerNode
        and then its instance in the background -- if `admit` allows it (None if not)."""
        admission = self.admissions.admit(itype)
        if not admission.allowed:
            log.info("create of a %s refused: %s", itype.name, admission.message)
            return None
        name = node_name_for(self.ctx.dispatcher_id, itype.name)
        worker = Worker(name=name, instance_type=itype, created_at=self.ctx.clock(), creating=True)
        self.ctx.workers[name] = worker
        self.ctx.background(self._create_node_then_instance(worker, itype))
        return worker

    async def _create_node_then_instance(self, worker: Worker, itype: InstanceType) -> None:
        try:
            body = await self.ctx.kube.create(
                WORKER_NODE, self.ctx.namespace, self.nodes.body_for(worker.name, itype, None)
            )
        except KubeError as exc:
            log.warning("could not create WorkerNode for a new %s: %s", itype.name, exc)
            worker.move(PoolState.GONE, "its WorkerNode could not be created")
            self.ctx.workers.pop(worker.name, None)
            self.ctx.on_change()
            return
        self.nodes.take(body)
        await self._create_instance(worker, itype)

    async def _create_instance(self, worker: Worker, itype: InstanceType) -> None:
        nonce = new_nonce()
        secret = instance_secret(self.ctx.master, worker.name, nonce)
        request, _ = self.ctx.cloud_.create_request(
            name=worker.name,
            instance_type=itype,
            ssh_public_key=self.ctx.key.public_key,
            tags={
                self.ctx.tags.node: worker.name,
                self.ctx.tags.idle_behavior: worker.idle_behavior,
                self.ctx.tags.secret_nonce: nonce,
            },
            login_user=self.ctx.settings.ssh_user,
            instance_secret=secret,
        )
        try:
            inst = await self.ctx.cloud_.create(request)
        except CloudError as exc:
            log.warning(
                "create of %s for WorkerNode %s failed: %s (%s)",
                itype.name,
                worker.name,
                exc.kind.value,
                exc,
            )
            worker.creating = False
            worker.move(PoolState.GONE, "its instance could not be created")
            self.ctx.workers.pop(worker.name, None)
            await self.nodes.remove(worker.name)
            self.ctx.on_change()
            return
        except Exception:  # a bug must not leave a half-made worker
            log.exception("create of %s for %s failed unexpectedly", itype.name, worker.name)
            worker.creating = False
            worker.move(PoolState.GONE, "its instance could not be created")
            self.ctx.workers.pop(worker.name, None)
            await self.nodes.remove(worker.name)
            self.ctx.on_change()
            return
        worker.creating = False
        worker.instance = inst
        worker.instance_known_at = self.ctx.clock()
        log.info("created instance %s (%s) for WorkerNode %s", inst.id, itype.name, worker.name)
        if worker.destroy_requested_at is not None:
            # its destroy was asked for while the create was in flight: carry it out now
            await self.destroy(worker, worker.destroy_reason or "destroyed while being created")
            self.ctx.on_change()
            return
        self.probes.ensure(worker)
        self.ctx.on_change()

    async def destroy(self, worker: Worker, reason: str) -> None:
        """Shut the instance down (idempotent); the WorkerNode goes once it is unlisted."""
        now = self.ctx.clock()
        if worker.destroy_requested_at is None:
            worker.destroy_requested_at = now
            worker.destroy_reason = reason
            worker.move(PoolState.SHUTTING_DOWN, reason)
            log.info("shutting down WorkerNode %s: %s", worker.name, reason)
        if worker.instance is None:
            if not worker.creating:
                await self.forget(worker, "destroyed before its instance existed")
            return
        try:
            await self.ctx.cloud_.destroy(worker.instance)
            worker.destroy_error = None
        except CloudError as exc:
            worker.destroy_error = str(exc)
            log.warning("destroy of %s failed (will retry): %s", worker.instance.id, exc)
            return
        if worker.probe_task is not None:
            worker.probe_task.cancel()
            worker.probe_task = None
        await self.ctx.prober.disconnect(worker.name)

    async def forget(self, worker: Worker, why: str) -> None:
        """The instance is gone: delete the WorkerNode (finalizer first)."""
        log.info("WorkerNode %s: %s; removing it", worker.name, why)
        worker.move(PoolState.GONE, why)
        if worker.probe_task is not None:
            worker.probe_task.cancel()
        await self.ctx.prober.forget(worker.name)
        self.ctx.workers.pop(worker.name, None)
        await self.nodes.remove(worker.name)
        self.ctx.on_change()

    async def destroy_node(self, node: str, reason: str) -> None:
        """Destroy a cloud node's instance for the power controller (raises CloudError
        when the cloud refused; the next attempt retries)."""
        worker = self.ctx.workers.get(node)
        if worker is None or worker.side:
            return
        await self.destroy(worker, reason)
        if worker.destroy_error is not None:
            raise TransientCloudError(
                worker.destroy_error, operation="destroy", observed_at=self.ctx.clock()
            )
