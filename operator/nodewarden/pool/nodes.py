"""The pool's WorkerNode objects: which ones are ours, folding watched ones into
workers, the ones it creates, changes and removes, and the status fields it owns.

Sources of truth, never merged: the cloud's instance list, the SSH probe, and the
WorkerNode object (what the user wants: idle behaviour, policy). This module reads the
last; `pool_status` is what the pool writes of the other two (through the one status
writer, only when something a person would see changed).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from nodewarden.api.kinds import WORKER_NODE
from nodewarden.api.workernode import WorkerNodeSpec
from nodewarden.cloud.model import CloudInstance
from nodewarden.kube.client import Conflict, KubeError, NotFound
from nodewarden.ownership import DISPATCHER_LABEL, owner_of
from nodewarden.pool.admissions import Admissions
from nodewarden.pool.context import PoolContext
from nodewarden.pool.probes import ProbeLoop
from nodewarden.pool.times import iso
from nodewarden.pool.worker import PoolState, Worker
from nodewarden.scheduling.instancetypes import InstanceType

log = logging.getLogger(__name__)

NODE_FINALIZER = "nodewarden.io/instance"
MANAGED_BY = {"app.kubernetes.io/managed-by": "nodewarden"}


class NodeStore:
    """The WorkerNode side of the pool (see the module docstring)."""

    def __init__(self, ctx: PoolContext, probes: ProbeLoop, admissions: Admissions) -> None:
        self.ctx = ctx
        self.probes = probes
        self.admissions = admissions
        self.declared: dict[str, Mapping[str, Any]] = {}
        """CloudVM WorkerNodes a person declared that still wait for an instance."""
        self.gone: dict[str, datetime] = {}
        """WorkerNodes this pool removed (name -> when), so late events cannot revive them."""
        self._handed: dict[str, tuple[dict[str, Any], Mapping[str, Any]]] = {}
        """Per node, the fields last handed to the status writer and the server status
        they were compared with (`contribute_statuses`)."""

    def ours(self, body: Mapping[str, Any]) -> bool:
        meta = body.get("metadata", {})
        spec = body.get("spec") or {}
        if spec.get("nodeType") != "CloudVM":
            return False
        label = (meta.get("labels") or {}).get(DISPATCHER_LABEL)
        return label == self.ctx.dispatcher_id

    def side(self, body: Mapping[str, Any]) -> bool:
        """A side node this dispatcher serves: labelled with our id. An unlabelled one is
        claimed first by the power controller (a preconditioned label write,
        `nodewarden.ownership`); until the label is there, nobody serves it."""
        if (body.get("spec") or {}).get("nodeType") != "SideNode":
            return False
        return owner_of(body) == self.ctx.dispatcher_id

    def _observe_side(
        self, name: str, body: Mapping[str, Any], deleted: bool, spec: WorkerNodeSpec | None
    ) -> None:
        worker = self.ctx.workers.get(name)
        if deleted:
            if worker is not None:
                self._drop_side(worker)
            return
        if worker is None:
            worker = Worker(name=name, instance_type=None, created_at=self.ctx.clock(), side=True)
            self.ctx.workers[name] = worker
            worker.take(body, spec)
            self.probes.ensure(worker)
            self.ctx.on_change()
            return
        worker.take(body, spec)

    def _drop_side(self, worker: Worker) -> None:
        worker.move(PoolState.GONE, "no longer a side node of this dispatcher")
        if worker.probe_task is not None:
            worker.probe_task.cancel()
        self.ctx.workers.pop(worker.name, None)
        self.ctx.background(self.ctx.prober.forget(worker.name))
        self.ctx.on_change()

    def observe_node(
        self, body: Mapping[str, Any], deleted: bool = False, spec: WorkerNodeSpec | None = None
    ) -> None:
        """Fold a watched WorkerNode into the pool (`spec`: as the feed parsed it)."""
        meta = body.get("metadata", {})
        name = meta.get("name")
        if not name or (meta.get("namespace") or self.ctx.namespace) != self.ctx.namespace:
            return
        if self.side(body):
            self._observe_side(name, body, deleted, spec)
            return
        known = self.ctx.workers.get(name)
        if known is not None and known.side:  # no longer a side node of ours
            self._drop_side(known)
        if not self.ours(body):
            if not deleted and self.is_declared(body):
                self.declared[name] = body
            else:
                self.declared.pop(name, None)
                self.admissions.release(name)
            return
        worker = self.ctx.workers.get(name)
        if deleted:
            if worker is not None:
                worker.take(None)
            return
        if worker is None and name in self.gone:
            return  # a late watch event of a WorkerNode we already removed: no resurrection
        if worker is None:
            wanted = (body.get("spec") or {}).get("instanceType") or ""
            itype = self.ctx.cloud.instance_type(wanted) if self.ctx.cloud else None
            now = self.ctx.clock()
            worker = Worker(name=name, instance_type=itype, created_at=now, found_at=now)
            status = body.get("status") or {}
            worker.host_key = status.get("sshHostKey")
            self.ctx.workers[name] = worker
        previous_behavior = worker.idle_behavior if worker.body is not None else None
        worker.take(body, spec)
        if previous_behavior is not None and previous_behavior != worker.idle_behavior:
            self.ctx.on_change()
            self.ctx.background(self.probes.retag(worker))

    def take(self, body: Mapping[str, Any]) -> None:
        """A WorkerNode this pool created or changed: through the informer (`fold`), which
        hands it to every consumer; straight in without one, or if the informer already
        held that version while the pool's worker has no body yet."""
        if self.ctx.fold is not None and self.ctx.fold(body):
            return
        worker = self.ctx.workers.get(body["metadata"]["name"])
        if self.ctx.fold is None or (worker is not None and worker.body is None):
            self.observe_node(body)

    @staticmethod
    def is_declared(body: Mapping[str, Any]) -> bool:
        """A CloudVM WorkerNode a person declared (no dispatcher label, no instance yet)."""
        meta = body.get("metadata", {})
        spec = body.get("spec") or {}
        return (
            spec.get("nodeType") == "CloudVM"
            and DISPATCHER_LABEL not in (meta.get("labels") or {})
            and not meta.get("deletionTimestamp")
            and not (body.get("status") or {}).get("instanceId")
        )

    async def redeclare(self, name: str) -> None:
        try:
            latest = await self.ctx.kube.get(WORKER_NODE, self.ctx.namespace, name)
        except KubeError as exc:
            log.info("could not read declared WorkerNode %s again: %s", name, exc)
            return
        if latest is not None and self.is_declared(latest) and name not in self.ctx.workers:
            self.declared.setdefault(name, latest)

    def pool_status(self, worker: Worker, containers: list[str]) -> dict[str, Any]:
        """The WorkerNode status fields the pool owns (docs: fleet/status.py): what it
        observes of the instance and of the runners. Power, readiness, admission and
        conditions belong to the power controller."""
        inst = worker.instance
        out: dict[str, Any] = {
            "runningContainers": len(containers),
            "containers": sorted(containers)[:50],
            "hourlyPrice": worker.price,
            "broken": worker.broken or None,
        }
        if not worker.side:
            out["dispatcherId"] = self.ctx.dispatcher_id
        if inst is not None and self.ctx.cloud is not None:
            out["instanceId"] = inst.id
            out["address"] = inst.address(self.ctx.cloud_.config.use_public_ip)
            out["bootedAt"] = iso(worker.booted_at)
        elif worker.side:
            spec = worker.spec
            out["address"] = spec.ssh.address if spec is not None else None
        if worker.last_container:
            out["lastContainer"] = worker.last_container
        if worker.host_key:
            out["sshHostKey"] = worker.host_key
        if worker.last_attempt is not None:
            out["lastProbe"] = {
                "time": iso(worker.last_attempt),
                "result": worker.probe_result,
                "message": worker.probe_message,
                "lastSuccess": iso(worker.last_success),
                "attemptsSinceSuccess": worker.attempts_since_success,
            }
        return out

    def contribute_statuses(self, containers_by_node: Mapping[str, list[str]]) -> None:
        """Hand the pool's status fields of every node to the one status writer. The
        probe time alone moving is not a change worth a write: `lastProbe` is sent when
        the probe's result or message changed (or with any other change). A node whose
        fields and server status (the same object: the writer replaces it at every watch
        event and write) are those of the last hand-over is skipped."""
        if self.ctx.status is None:
            return
        handed, self._handed = self._handed, {}
        for w in self.ctx.workers.values():
            if w.body is None:
                continue
            fields = self.pool_status(w, containers_by_node.get(w.name, []))
            server = self.ctx.status.server_status(w.name)
            last = handed.get(w.name)
            self._handed[w.name] = (dict(fields), server)
            if last is not None and last[1] is server and last[0] == fields:
                # the same fields against the very status they were compared with: the
                # writer would find nothing new (bench_dispatch, 100 nodes: 29 % of the
                # dispatcher's round went to handing unchanged fields over again)
                continue
            current = server.get("lastProbe") or {}
            probe = fields.get("lastProbe") or {}
            if (
                probe
                and current.get("result") == probe.get("result")
                and current.get("message") == probe.get("message")
            ):
                fields.pop("lastProbe")
                changed = self.ctx.status.contribute(w.name, fields)
                if changed:  # another field changes anyway: the probe time rides along
                    self.ctx.status.contribute(w.name, {"lastProbe": probe})
                continue
            self.ctx.status.contribute(w.name, fields)

    # --- cloud sync ---------------------------------------------------------------------

    def bury(self, name: str) -> None:
        now = self.ctx.clock()
        self.gone[name] = now
        if len(self.gone) > 10000:  # names are random; keep the memory bounded
            for old in sorted(self.gone, key=self.gone.__getitem__)[:5000]:
                del self.gone[old]

    async def remove(self, name: str) -> None:
        self.bury(name)
        body = await self.ctx.kube.get(WORKER_NODE, self.ctx.namespace, name)
        if body is None:
            return
        finalizers = [f for f in body["metadata"].get("finalizers") or [] if f != NODE_FINALIZER]
        with contextlib.suppress(NotFound, Conflict):
            await self.ctx.kube.patch(
                WORKER_NODE, self.ctx.namespace, name, {"metadata": {"finalizers": finalizers}}
            )
        with contextlib.suppress(NotFound):
            await self.ctx.kube.delete(WORKER_NODE, self.ctx.namespace, name)

    def body_for(
        self, name: str, itype: InstanceType | None, inst: CloudInstance | None
    ) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "nodeType": "CloudVM",
            "controlMethod": "Cloud",
            "instanceType": itype.name if itype else (inst.instance_type if inst else "unknown"),
            "idleBehavior": (inst.tags.get(self.ctx.tags.idle_behavior) if inst else None) or "run",
        }
        if self.ctx.default_policy:
            spec["policyRef"] = {"name": self.ctx.default_policy}
        return {
            "metadata": {
                "name": name,
                "labels": {DISPATCHER_LABEL: self.ctx.dispatcher_id, **MANAGED_BY},
                "finalizers": [NODE_FINALIZER],
            },
            "spec": spec,
        }

    # --- create / destroy ---------------------------------------------------------------
