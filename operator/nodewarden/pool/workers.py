"""The worker pool: cloud instances, their WorkerNode objects, probes and lifecycle.

One `Worker` per cloud node. Sources of truth, never merged: the cloud's instance list
(does it exist, in which state), the SSH probe (is it ready, which runners run), and the
WorkerNode object (what the user wants: idle behaviour, policy). The pool

- syncs with the cloud list: adopts instances tagged as ours (creating their WorkerNode),
  claims or destroys instances of a dispatcher that stopped probing them, and deletes the
  WorkerNode of an instance that disappeared;
- creates instances (WorkerNode first, then the cloud call) and destroys them; every
  create, planned or declared, passes `admit` first -- the hard caps and back-off of
  `scheduling.caps` against what exists or is being created right then. A declared
  CloudVM WorkerNode over a cap keeps waiting (its `Launched` condition names the cap,
  through the observer) and gets its instance in the first round the caps allow it;
- probes every instance with a kept-alive SSH connection (booting nodes more often), and
  tags it with the probe time at most every `probe_tag_interval`;
- writes the WorkerNode status only when something a person would see changed.

A worker's own lifecycle is `Worker.state` (a `WorkerState`), changed only by
`Worker.move`, which allows exactly the transitions of `TRANSITIONS`:

    from           to                       when
    Booting        Ready                    a probe finds the node ready
    Booting        ShuttingDown             its destroy is requested (lame, idle, unwanted)
    Booting        Gone                     create failed / instance left the cloud list
    Ready          Booting                  a side node stops answering ready (powered off)
    Ready          ShuttingDown             its destroy is requested
    Ready          Gone                     its instance left the cloud list / node dropped
    ShuttingDown   Gone                     its instance is gone and its WorkerNode removed

A refused move (a probe that finishes after its node was destroyed or removed: the
background tasks of one worker race by design) is logged and leaves the state as it
was; it never raises, so a late task cannot bring down a probe loop or a round. The
state is internal: what users see as a node's state (WorkerNode status, metrics, the
management snapshot) is the power controller's (`policy.state.api_state`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import secrets
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from nodewarden.api.kinds import WORKER_NODE
from nodewarden.api.workernode import WorkerNodeSpec
from nodewarden.cloud.errors import CloudError, TransientCloudError
from nodewarden.cloud.facade import CloudFacade
from nodewarden.cloud.model import CloudInstance, InstanceState
from nodewarden.cloud.tags import TagKeys
from nodewarden.config import DispatchSettings
from nodewarden.credentials import CredentialResolver, Refusal
from nodewarden.fleet.board import NodePowerView
from nodewarden.fleet.policies import PolicyBook
from nodewarden.fleet.ports import NoObserver, WorkerObserver, WorkerSnapshot
from nodewarden.fleet.status import NodeStatusWriter
from nodewarden.kube.client import Conflict, Kube, KubeError, NotFound
from nodewarden.metrics import CREATE_REFUSALS, HELD_NODES, PROBE_SECONDS, UNOWNED_RUNNERS
from nodewarden.ownership import DISPATCHER_LABEL, owner_of
from nodewarden.pool.identity import instance_secret, new_nonce
from nodewarden.scheduling.caps import Admission, Fleet, PolicyLimits, admit_create
from nodewarden.scheduling.instancetypes import InstanceType
from nodewarden.scheduling.views import NodeView
from nodewarden.ssh.credentials import InstanceSecretTrust, KnownHostKeys, SshClientKey, SshTarget
from nodewarden.ssh.errors import SshError
from nodewarden.ssh.facts import LearnedHostKey, ProbeReport, RunnerProcess
from nodewarden.ssh.prober import SshProber

log = logging.getLogger(__name__)

NODE_FINALIZER = "nodewarden.io/instance"
MANAGED_BY = {"app.kubernetes.io/managed-by": "nodewarden"}
STATUS_REFRESH = timedelta(minutes=5)
REFUSED_RECHECK = 60.0
"""Seconds between credential checks of a side node whose SSH login is refused."""

_POWER = {
    InstanceState.PENDING: "PoweringOn",
    InstanceState.RUNNING: "On",
    InstanceState.STOPPING: "PoweringOff",
    InstanceState.STOPPED: "Off",
    InstanceState.TERMINATED: "Off",
    InstanceState.ERROR: "Unknown",
    InstanceState.UNKNOWN: "Unknown",
}


def node_name_for(dispatcher_id: str, instance_type: str) -> str:
    """A fresh DNS-safe WorkerNode name, e.g. 'demo-m5-large-x7k2q9'."""
    slug = re.sub(r"[^a-z0-9-]+", "-", instance_type.lower()).strip("-")[:30] or "vm"
    suffix = "".join(secrets.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(6))
    return f"{dispatcher_id}-{slug}-{suffix}"[:63].strip("-")


class WorkerState(StrEnum):
    """Where a worker is in the pool's lifecycle (transitions: `TRANSITIONS`)."""

    BOOTING = "Booting"
    """Known, not (or no longer) answering ready: its instance is being created or boots,
    or a side node is off."""
    READY = "Ready"
    """The last probe found it ready."""
    SHUTTING_DOWN = "ShuttingDown"
    """Its destroy was requested; it is not probed any more."""
    GONE = "Gone"
    """Removed from the pool (its instance is gone, its create failed, or it was dropped)."""


TRANSITIONS: Mapping[WorkerState, frozenset[WorkerState]] = {
    WorkerState.BOOTING: frozenset(
        {WorkerState.READY, WorkerState.SHUTTING_DOWN, WorkerState.GONE}
    ),
    WorkerState.READY: frozenset(
        {WorkerState.BOOTING, WorkerState.SHUTTING_DOWN, WorkerState.GONE}
    ),
    WorkerState.SHUTTING_DOWN: frozenset({WorkerState.GONE}),
    WorkerState.GONE: frozenset(),
}
"""The only allowed changes of `Worker.state` (the table of the module docstring)."""


@dataclass
class Worker:
    """One cloud node: its instance, its WorkerNode, what the probes found."""

    name: str
    instance_type: InstanceType | None
    created_at: datetime
    instance: CloudInstance | None = None
    instance_known_at: datetime | None = None
    """When our create call returned the instance (None for adopted instances)."""
    body: Mapping[str, Any] | None = None
    """The WorkerNode's compact body (shared with the informer's store: read-only); set
    through `take`, which parses the spec once per body."""
    state: WorkerState = WorkerState.BOOTING
    """Changed only by `move` (see `TRANSITIONS`)."""
    ready_since: datetime | None = None
    last_success: datetime | None = None
    last_attempt: datetime | None = None
    attempts_since_success: int = 0
    attempts_total: int = 0
    probe_result: str | None = None
    probe_message: str | None = None
    runners: dict[str, int] | None = None
    """Every runner the node listed last (container uuid -> pid), whoever owns it."""
    runners_at: datetime | None = None
    listed_runners: dict[str, RunnerProcess] = field(default_factory=dict)
    """The last listing in full: owner (dispatcher id), object uid and token per uuid."""
    idle_since: datetime | None = None
    draining: bool = False
    broken: bool = False
    destroy_requested_at: datetime | None = None
    destroy_reason: str | None = None
    destroy_error: str | None = None
    host_key: str | None = None
    last_tag_at: datetime | None = None
    creating: bool = False
    last_container: str | None = None
    decision_summary: str | None = None
    decision: str | None = None
    decision_reasons: list[str] = field(default_factory=list)
    decision_at: datetime | None = None
    probe_task: asyncio.Task[None] | None = None
    probe_now: asyncio.Event = field(default_factory=asyncio.Event)
    side: bool = False
    """A side node (fixed hardware, powered by the power controller), not a cloud VM."""
    unowned_runners: tuple[str, ...] = ()
    """Container uuids of the runners listed without an owner (reported, never killed)."""
    target_refusal: str | None = None
    """Why the credential resolver refused this side node's SSH login (None: it did not)."""
    _spec: WorkerNodeSpec | None = None
    side_view: tuple[WorkerNodeSpec | None, NodePowerView | None, NodeView] | None = None
    """The dispatcher's last node view of a side node, with the spec and power view it
    was made from (it is reused until either changes)."""

    def __post_init__(self) -> None:
        if self.body is not None and self._spec is None:  # made with a body: parse its spec
            body, self.body = self.body, None
            self.take(body)

    def take(self, body: Mapping[str, Any] | None, spec: WorkerNodeSpec | None = None) -> None:
        """A new version of the WorkerNode (None: deleted), with its spec as the feed
        parsed it (None: parsed here)."""
        previous = self.body
        self.body = body
        if body is None:
            self._spec = None
            return
        edited = previous is None or previous.get("spec") != body.get("spec")
        if spec is not None:
            self._spec = spec
        elif edited:  # else a status write: the spec (and its parse) stays
            try:
                self._spec = WorkerNodeSpec.model_validate(body.get("spec") or {})
            except ValueError:
                self._spec = None
        if edited and previous is not None:
            self.probe_now.set()  # an edit (an address, a Secret named) is tried at once

    @property
    def spec(self) -> WorkerNodeSpec | None:
        return self._spec

    def move(self, to: WorkerState, why: str) -> bool:
        """Change `state` to `to` if `TRANSITIONS` allows it (staying put is allowed);
        otherwise log the refusal and keep the state. True when the state is `to` now."""
        if to is self.state:
            return True
        if to not in TRANSITIONS[self.state]:
            log.info(
                "WorkerNode %s: refused state change %s -> %s (%s)",
                self.name,
                self.state.value,
                to.value,
                why,
            )
            return False
        self.state = to
        return True

    @property
    def ready(self) -> bool:
        """The last probe found the node ready (and nothing moved it on since)."""
        return self.state is WorkerState.READY

    @property
    def probing(self) -> bool:
        """Probes are wanted: neither shutting down nor gone."""
        return self.state in (WorkerState.BOOTING, WorkerState.READY)

    @property
    def idle_behavior(self) -> str:
        spec = self.spec
        return spec.idle_behavior if spec else "run"

    @property
    def policy_name(self) -> str | None:
        spec = self.spec
        return spec.policy_ref.name if spec and spec.policy_ref else None

    @property
    def deletion_requested(self) -> bool:
        return bool((self.body or {}).get("metadata", {}).get("deletionTimestamp"))

    @property
    def booted_at(self) -> datetime:
        if self.instance is not None and self.instance.created_at is not None:
            return self.instance.created_at
        return self.created_at

    @property
    def price(self) -> float:
        if self.side:
            spec = self.spec
            return spec.cost_per_hour or 0.0 if spec is not None else 0.0
        if self.instance is not None and self.instance.price is not None:
            return self.instance.price
        return self.instance_type.price if self.instance_type else 0.0

    @property
    def reachable(self) -> bool:
        """Something may answer SSH: a cloud instance exists, or a side node's login was
        not refused by the credential resolver."""
        return self.target_refusal is None if self.side else self.instance is not None


class WorkerPool:
    """The nodes of one dispatcher (cloud VMs and side nodes); see the module docstring."""

    def __init__(
        self,
        *,
        kube: Kube,
        cloud: CloudFacade | None,
        prober: SshProber,
        namespace: str,
        dispatcher_id: str,
        settings: DispatchSettings,
        client_key: SshClientKey | None,
        master: Any,
        takeover_after: Callable[[], timedelta],
        default_policy: str | None,
        clock: Callable[[], datetime],
        on_change: Callable[[], None],
        credentials: CredentialResolver | None = None,
        status: NodeStatusWriter | None = None,
        policies: PolicyBook | None = None,
    ) -> None:
        self.kube = kube
        self.policies = policies
        """The default policy's limits and whether creates are stopped (None: the built-in
        defaults, no policy limits; tests without a book)."""
        self.cloud = cloud
        self.credentials = credentials
        self.status = status
        self.fold: Callable[[Mapping[str, Any]], bool] | None = None
        """Where a WorkerNode this pool wrote goes (the WorkerNode informer)."""
        self.observer: WorkerObserver = NoObserver()
        self.prober = prober
        self.namespace = namespace
        self.dispatcher_id = dispatcher_id
        self.settings = settings
        self.client_key = client_key
        self.master = master
        self.takeover_after = takeover_after
        self.default_policy = default_policy
        self.clock = clock
        self.on_change = on_change
        self.workers: dict[str, Worker] = {}
        self.declared: dict[str, Mapping[str, Any]] = {}
        self.holds: dict[str, Admission] = {}
        """Declared WorkerNodes waiting for an instance -> the refusal that holds them."""
        self.last_sync: datetime | None = None
        self.synced_once = False
        self._closing = False
        self.sync_wanted = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._gone: dict[str, datetime] = {}
        """WorkerNodes this pool removed (name -> when), so late events cannot revive them."""
        self.tags = cloud.tag_keys if cloud is not None else TagKeys()

    @property
    def _cloud(self) -> CloudFacade:
        """The cloud (only cloud-VM code paths run, and they run only with a cloud)."""
        assert self.cloud is not None, "a cloud-VM operation without a cloud configured"
        return self.cloud

    @property
    def _key(self) -> SshClientKey:
        assert self.client_key is not None, "a cloud VM needs the operator's SSH key"
        return self.client_key

    def _background(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- WorkerNode objects ----------------------------------------------------------

    def _ours(self, body: Mapping[str, Any]) -> bool:
        meta = body.get("metadata", {})
        spec = body.get("spec") or {}
        if spec.get("nodeType") != "CloudVM":
            return False
        label = (meta.get("labels") or {}).get(DISPATCHER_LABEL)
        return label == self.dispatcher_id

    def _side(self, body: Mapping[str, Any]) -> bool:
        """A side node this dispatcher serves: labelled with our id. An unlabelled one is
        claimed first by the power controller (a preconditioned label write,
        `nodewarden.ownership`); until the label is there, nobody serves it."""
        if (body.get("spec") or {}).get("nodeType") != "SideNode":
            return False
        return owner_of(body) == self.dispatcher_id

    def _observe_side(
        self, name: str, body: Mapping[str, Any], deleted: bool, spec: WorkerNodeSpec | None
    ) -> None:
        worker = self.workers.get(name)
        if deleted:
            if worker is not None:
                self._drop_side(worker)
            return
        if worker is None:
            worker = Worker(name=name, instance_type=None, created_at=self.clock(), side=True)
            self.workers[name] = worker
            worker.take(body, spec)
            self._ensure_probe(worker)
            self.on_change()
            return
        worker.take(body, spec)

    def _drop_side(self, worker: Worker) -> None:
        worker.move(WorkerState.GONE, "no longer a side node of this dispatcher")
        if worker.probe_task is not None:
            worker.probe_task.cancel()
        self.workers.pop(worker.name, None)
        self._background(self.prober.forget(worker.name))
        self.on_change()

    def observe_node(
        self, body: Mapping[str, Any], deleted: bool = False, spec: WorkerNodeSpec | None = None
    ) -> None:
        """Fold a watched WorkerNode into the pool (`spec`: as the feed parsed it)."""
        meta = body.get("metadata", {})
        name = meta.get("name")
        if not name or (meta.get("namespace") or self.namespace) != self.namespace:
            return
        if self._side(body):
            self._observe_side(name, body, deleted, spec)
            return
        known = self.workers.get(name)
        if known is not None and known.side:  # no longer a side node of ours
            self._drop_side(known)
        if not self._ours(body):
            if not deleted and self._declared(body):
                self.declared[name] = body
            else:
                self.declared.pop(name, None)
                self._release(name)
            return
        worker = self.workers.get(name)
        if deleted:
            if worker is not None:
                worker.take(None)
            return
        if worker is None and name in self._gone:
            return  # a late watch event of a WorkerNode we already removed: no resurrection
        if worker is None:
            wanted = (body.get("spec") or {}).get("instanceType") or ""
            itype = self.cloud.instance_type(wanted) if self.cloud else None
            worker = Worker(name=name, instance_type=itype, created_at=self.clock())
            status = body.get("status") or {}
            worker.host_key = status.get("sshHostKey")
            self.workers[name] = worker
        previous_behavior = worker.idle_behavior if worker.body is not None else None
        worker.take(body, spec)
        if previous_behavior is not None and previous_behavior != worker.idle_behavior:
            self.on_change()
            self._background(self._retag(worker))

    def _take(self, body: Mapping[str, Any]) -> None:
        """A WorkerNode this pool created or changed: through the informer (`fold`), which
        hands it to every consumer; straight in without one, or if the informer already
        held that version while the pool's worker has no body yet."""
        if self.fold is not None and self.fold(body):
            return
        worker = self.workers.get(body["metadata"]["name"])
        if self.fold is None or (worker is not None and worker.body is None):
            self.observe_node(body)

    @staticmethod
    def _declared(body: Mapping[str, Any]) -> bool:
        """A CloudVM WorkerNode a person declared (no dispatcher label, no instance yet)."""
        meta = body.get("metadata", {})
        spec = body.get("spec") or {}
        return (
            spec.get("nodeType") == "CloudVM"
            and DISPATCHER_LABEL not in (meta.get("labels") or {})
            and not meta.get("deletionTimestamp")
            and not (body.get("status") or {}).get("instanceId")
        )

    async def adopt_declared(self) -> None:
        """Give each declared CloudVM WorkerNode an instance: label it ours, then create --
        if the caps allow it now (`admit`); else it stays declared, held with the reason."""
        if self.cloud is None:
            return
        for name, body in list(self.declared.items()):
            itype = self._cloud.instance_type((body.get("spec") or {}).get("instanceType") or "")
            if itype is None:
                del self.declared[name]
                continue  # its Valid condition names the unknown instance type
            admission = self.admit(itype)
            if not admission.allowed:
                self._hold(name, admission)
                continue
            del self.declared[name]
            self._release(name)
            finalizers = list(body["metadata"].get("finalizers") or [])
            if NODE_FINALIZER not in finalizers:
                finalizers.append(NODE_FINALIZER)
            try:
                patched = await self.kube.patch(
                    WORKER_NODE,
                    self.namespace,
                    name,
                    {
                        "metadata": {
                            "labels": {DISPATCHER_LABEL: self.dispatcher_id, **MANAGED_BY},
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
                await self._redeclare(name)
                continue
            worker = Worker(name=name, instance_type=itype, created_at=self.clock(), creating=True)
            self.workers[name] = worker
            self._take(patched)
            log.info("creating a %s instance for declared WorkerNode %s", itype.name, name)
            self._background(self._create_instance(worker, itype))

    async def _redeclare(self, name: str) -> None:
        try:
            latest = await self.kube.get(WORKER_NODE, self.namespace, name)
        except KubeError as exc:
            log.info("could not read declared WorkerNode %s again: %s", name, exc)
            return
        if latest is not None and self._declared(latest) and name not in self.workers:
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
            out["dispatcherId"] = self.dispatcher_id
        if inst is not None and self.cloud is not None:
            out["instanceId"] = inst.id
            out["address"] = inst.address(self._cloud.config.use_public_ip)
            out["bootedAt"] = _iso(worker.booted_at)
        elif worker.side:
            spec = worker.spec
            out["address"] = spec.ssh.address if spec is not None else None
        if worker.last_container:
            out["lastContainer"] = worker.last_container
        if worker.host_key:
            out["sshHostKey"] = worker.host_key
        if worker.last_attempt is not None:
            out["lastProbe"] = {
                "time": _iso(worker.last_attempt),
                "result": worker.probe_result,
                "message": worker.probe_message,
                "lastSuccess": _iso(worker.last_success),
                "attemptsSinceSuccess": worker.attempts_since_success,
            }
        return out

    def contribute_statuses(self, containers_by_node: Mapping[str, list[str]]) -> None:
        """Hand the pool's status fields of every node to the one status writer. The
        probe time alone moving is not a change worth a write: `lastProbe` is sent when
        the probe's result or message changed (or with any other change)."""
        if self.status is None:
            return
        for w in self.workers.values():
            if w.body is None:
                continue
            fields = self.pool_status(w, containers_by_node.get(w.name, []))
            current = self.status.server_status(w.name).get("lastProbe") or {}
            probe = fields.get("lastProbe") or {}
            if (
                probe
                and current.get("result") == probe.get("result")
                and current.get("message") == probe.get("message")
            ):
                fields.pop("lastProbe")
                changed = self.status.contribute(w.name, fields)
                if changed:  # another field changes anyway: the probe time rides along
                    self.status.contribute(w.name, {"lastProbe": probe})
                continue
            self.status.contribute(w.name, fields)

    # --- cloud sync ---------------------------------------------------------------------

    async def sync_cloud(self) -> None:
        """List instances; adopt ours, take over stale foreign ones, drop vanished workers.

        The power controller hears the list (`observer.listed`: the trusted power source
        of every VM) and, before a vanished worker's WorkerNode is removed, that its
        instance is gone (`observer.gone`: destroy confirmed)."""
        if self.cloud is None:
            return
        now = self.clock()
        try:
            managed = await self._cloud.list_managed_instances()
        except CloudError as exc:
            log.warning("cloud list failed: %s", exc)
            return
        listed_at = self.clock()
        self.last_sync = now
        seen: set[str] = set()
        ours: dict[str, CloudInstance] = {}
        adopt: list[tuple[CloudInstance, str]] = []
        for inst in managed:
            if inst.state is InstanceState.TERMINATED:
                continue
            owner = inst.tags.get(self.tags.dispatcher)
            if owner != self.dispatcher_id:
                await self._maybe_take_over(inst, now)
                continue
            name = inst.tags.get(self.tags.node) or f"adopted-{inst.id}".lower()
            seen.add(name)
            if name not in self.workers:
                adopt.append((inst, name))
                continue
            self._listed(self.workers[name], inst, ours)
        # adoptions (a restart: the whole fleet) run side by side, each a GET and a create
        gate = asyncio.Semaphore(16)

        async def adopt_one(inst: CloudInstance, name: str) -> None:
            async with gate:
                worker = await self._adopt(inst, name)
            if worker is not None:
                self._listed(worker, inst, ours)

        await asyncio.gather(*(adopt_one(inst, name) for inst, name in adopt))
        self.observer.listed(ours, listed_at)
        for worker in list(self.workers.values()):
            if worker.side or worker.name in seen or worker.creating:
                continue
            if worker.instance is None and now - worker.created_at < timedelta(seconds=60):
                continue  # created moments ago; the instance may not be listed yet
            if worker.instance_known_at is not None and worker.instance_known_at >= now:
                # its create returned while this list was on its way: not in it, not gone
                continue
            await self.observer.gone(self.snapshot_of(worker), listed_at)
            await self._forget(worker, "instance is gone from the cloud list")
        self.synced_once = True
        self.on_change()

    def _listed(self, worker: Worker, inst: CloudInstance, ours: dict[str, CloudInstance]) -> None:
        worker.instance = inst
        ours[worker.name] = inst
        if worker.instance_type is None and inst.instance_type:
            worker.instance_type = self._cloud.instance_type(inst.instance_type)

    async def _adopt(self, inst: CloudInstance, name: str) -> Worker | None:
        """An instance tagged as ours without a worker: (re)create its WorkerNode."""
        itype = self._cloud.instance_type(inst.instance_type or "")
        worker = Worker(
            name=name,
            instance_type=itype,
            created_at=inst.created_at or self.clock(),
            instance=inst,
        )
        self._gone.pop(name, None)
        self.workers[name] = worker
        body = await self.kube.get(WORKER_NODE, self.namespace, name)
        if body is not None and not self._ours(body):
            # a WorkerNode of another dispatcher for an instance we claimed: take it over
            try:
                body = await self.kube.patch(
                    WORKER_NODE,
                    self.namespace,
                    name,
                    {"metadata": {"labels": {DISPATCHER_LABEL: self.dispatcher_id}}},
                )
            except KubeError as exc:
                log.warning("could not relabel WorkerNode %s: %s", name, exc)
                worker.move(WorkerState.GONE, "its WorkerNode could not be made")
                del self.workers[name]
                return None
        if body is None:
            try:
                body = await self.kube.create(
                    WORKER_NODE, self.namespace, self._node_body(name, itype, inst)
                )
            except KubeError as exc:
                log.warning("could not create WorkerNode for adopted %s: %s", inst.id, exc)
                worker.move(WorkerState.GONE, "its WorkerNode could not be made")
                del self.workers[name]
                return None
            log.info("adopted instance %s as WorkerNode %s", inst.id, name)
        self._take(body)
        worker = self.workers[name]
        worker.instance = inst
        self._ensure_probe(worker)
        return worker

    async def _maybe_take_over(self, inst: CloudInstance, now: datetime) -> None:
        """Claim an instance whose dispatcher has not probed it for `takeover_after`."""
        stamp = _parse_time(inst.tags.get(self.tags.last_probe))
        reference = stamp or inst.created_at
        if reference is None or now - reference < self.takeover_after():
            return
        owner = inst.tags.get(self.tags.dispatcher)
        # keep the node name: the per-instance secret is derived from it
        name = inst.tags.get(self.tags.node) or f"claimed-{inst.id}".lower()
        name = re.sub(r"[^a-z0-9-]", "-", name)[:63].strip("-")
        log.warning(
            "claiming instance %s of dispatcher %s: no probe since %s",
            inst.id,
            owner,
            reference.isoformat(),
        )
        tags = {
            **{k: v for k, v in inst.tags.items() if self.tags.owns(k)},
            self.tags.node: name,
            self.tags.last_probe: _iso(now) or "",
        }
        tags.pop(self.tags.dispatcher, None)
        try:
            await self._cloud.set_tags(inst, tags)
        except CloudError as exc:
            log.warning("claim of %s failed (%s); destroying it instead", inst.id, exc)
            with contextlib.suppress(CloudError):
                await self._cloud.destroy(inst)
            return
        claimed = inst.model_copy(
            update={"tags": {**inst.tags, **tags, self.tags.dispatcher: self.dispatcher_id}}
        )
        await self._adopt(claimed, name)

    async def _forget(self, worker: Worker, why: str) -> None:
        """The instance is gone: delete the WorkerNode (finalizer first)."""
        log.info("WorkerNode %s: %s; removing it", worker.name, why)
        worker.move(WorkerState.GONE, why)
        if worker.probe_task is not None:
            worker.probe_task.cancel()
        await self.prober.forget(worker.name)
        self.workers.pop(worker.name, None)
        await self._remove_node(worker.name)
        self.on_change()

    def _bury(self, name: str) -> None:
        now = self.clock()
        self._gone[name] = now
        if len(self._gone) > 10000:  # names are random; keep the memory bounded
            for old in sorted(self._gone, key=self._gone.__getitem__)[:5000]:
                del self._gone[old]

    async def _remove_node(self, name: str) -> None:
        self._bury(name)
        body = await self.kube.get(WORKER_NODE, self.namespace, name)
        if body is None:
            return
        finalizers = [f for f in body["metadata"].get("finalizers") or [] if f != NODE_FINALIZER]
        with contextlib.suppress(NotFound, Conflict):
            await self.kube.patch(
                WORKER_NODE, self.namespace, name, {"metadata": {"finalizers": finalizers}}
            )
        with contextlib.suppress(NotFound):
            await self.kube.delete(WORKER_NODE, self.namespace, name)

    def _node_body(
        self, name: str, itype: InstanceType | None, inst: CloudInstance | None
    ) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "nodeType": "CloudVM",
            "controlMethod": "Cloud",
            "instanceType": itype.name if itype else (inst.instance_type if inst else "unknown"),
            "idleBehavior": (inst.tags.get(self.tags.idle_behavior) if inst else None) or "run",
        }
        if self.default_policy:
            spec["policyRef"] = {"name": self.default_policy}
        return {
            "metadata": {
                "name": name,
                "labels": {DISPATCHER_LABEL: self.dispatcher_id, **MANAGED_BY},
                "finalizers": [NODE_FINALIZER],
            },
            "spec": spec,
        }

    # --- create / destroy ---------------------------------------------------------------

    def pending_creates(self) -> int:
        return sum(1 for w in self.workers.values() if w.creating)

    def fleet(self) -> Fleet:
        """This pool's cloud instances that exist or are being created (caps count them)."""
        return Fleet.of(
            (w.instance_type.name if w.instance_type else "unknown", w.price)
            for w in self.workers.values()
            if not w.side and w.state is not WorkerState.GONE
        )

    def admit(self, itype: InstanceType) -> Admission:
        """The check every create passes, planned or declared: the operator's ceilings, the
        default policy's limits (none at all while it is missing or invalid) and the
        cloud's back-off, against the fleet as it is now (`scheduling.caps`)."""
        if self.policies is not None:
            policy, stopped = self.policies.create_limits()
        else:
            policy, stopped = PolicyLimits(name="builtin"), None
        permission = self._cloud.may_create(itype, self.clock())
        admission = admit_create(
            itype.name,
            itype.price,
            self.fleet(),
            policy,
            self.settings.limits.ceilings(),
            stopped=stopped,
            backoff=None if permission.allowed else permission.reason,
        )
        if not admission.allowed and admission.cap is not None:
            CREATE_REFUSALS.labels(admission.cap.value).inc()
        return admission

    def _hold(self, name: str, admission: Admission) -> None:
        if self.holds.get(name) == admission:
            return
        if name not in self.holds:
            log.info("declared WorkerNode %s waits for an instance: %s", name, admission.message)
        self.holds[name] = admission
        HELD_NODES.set(len(self.holds))
        self.observer.held(name, admission)

    def _release(self, name: str) -> None:
        if self.holds.pop(name, None) is not None:
            HELD_NODES.set(len(self.holds))
            self.observer.held(name, None)

    def create(self, itype: InstanceType) -> Worker | None:
        """Register a new worker now (so the next plan counts it) and create its WorkerNode
        and then its instance in the background -- if `admit` allows it (None if not)."""
        admission = self.admit(itype)
        if not admission.allowed:
            log.info("create of a %s refused: %s", itype.name, admission.message)
            return None
        name = node_name_for(self.dispatcher_id, itype.name)
        worker = Worker(name=name, instance_type=itype, created_at=self.clock(), creating=True)
        self.workers[name] = worker
        self._background(self._create_node_then_instance(worker, itype))
        return worker

    async def _create_node_then_instance(self, worker: Worker, itype: InstanceType) -> None:
        try:
            body = await self.kube.create(
                WORKER_NODE, self.namespace, self._node_body(worker.name, itype, None)
            )
        except KubeError as exc:
            log.warning("could not create WorkerNode for a new %s: %s", itype.name, exc)
            worker.move(WorkerState.GONE, "its WorkerNode could not be created")
            self.workers.pop(worker.name, None)
            self.on_change()
            return
        self._take(body)
        await self._create_instance(worker, itype)

    async def _create_instance(self, worker: Worker, itype: InstanceType) -> None:
        nonce = new_nonce()
        secret = instance_secret(self.master, worker.name, nonce)
        request, _ = self._cloud.create_request(
            name=worker.name,
            instance_type=itype,
            ssh_public_key=self._key.public_key,
            tags={
                self.tags.node: worker.name,
                self.tags.idle_behavior: worker.idle_behavior,
                self.tags.secret_nonce: nonce,
            },
            login_user=self.settings.ssh_user,
            instance_secret=secret,
        )
        try:
            inst = await self._cloud.create(request)
        except CloudError as exc:
            log.warning(
                "create of %s for WorkerNode %s failed: %s (%s)",
                itype.name,
                worker.name,
                exc.kind.value,
                exc,
            )
            worker.creating = False
            worker.move(WorkerState.GONE, "its instance could not be created")
            self.workers.pop(worker.name, None)
            await self._remove_node(worker.name)
            self.on_change()
            return
        except Exception:  # a bug must not leave a half-made worker
            log.exception("create of %s for %s failed unexpectedly", itype.name, worker.name)
            worker.creating = False
            worker.move(WorkerState.GONE, "its instance could not be created")
            self.workers.pop(worker.name, None)
            await self._remove_node(worker.name)
            self.on_change()
            return
        worker.creating = False
        worker.instance = inst
        worker.instance_known_at = self.clock()
        log.info("created instance %s (%s) for WorkerNode %s", inst.id, itype.name, worker.name)
        if worker.destroy_requested_at is not None:
            # its destroy was asked for while the create was in flight: carry it out now
            await self.destroy(worker, worker.destroy_reason or "destroyed while being created")
            self.on_change()
            return
        self._ensure_probe(worker)
        self.on_change()

    async def destroy(self, worker: Worker, reason: str) -> None:
        """Shut the instance down (idempotent); the WorkerNode goes once it is unlisted."""
        now = self.clock()
        if worker.destroy_requested_at is None:
            worker.destroy_requested_at = now
            worker.destroy_reason = reason
            worker.move(WorkerState.SHUTTING_DOWN, reason)
            log.info("shutting down WorkerNode %s: %s", worker.name, reason)
        if worker.instance is None:
            if not worker.creating:
                await self._forget(worker, "destroyed before its instance existed")
            return
        try:
            await self._cloud.destroy(worker.instance)
            worker.destroy_error = None
        except CloudError as exc:
            worker.destroy_error = str(exc)
            log.warning("destroy of %s failed (will retry): %s", worker.instance.id, exc)
            return
        if worker.probe_task is not None:
            worker.probe_task.cancel()
            worker.probe_task = None
        await self.prober.disconnect(worker.name)

    async def _retag(self, worker: Worker) -> None:
        if worker.instance is None:
            return
        tags = {
            **{k: v for k, v in worker.instance.tags.items() if self.tags.owns(k)},
            self.tags.idle_behavior: worker.idle_behavior,
        }
        tags.pop(self.tags.dispatcher, None)
        with contextlib.suppress(CloudError):
            await self._cloud.set_tags(worker.instance, tags)

    # --- probes -------------------------------------------------------------------------

    async def target(self, worker: Worker) -> SshTarget | None:
        """Where and how to reach `worker` over SSH now, or None. Side nodes: through the
        credential resolver with the node's spec as it is at this moment (admitted
        address, designated key and known_hosts); a refusal is kept in
        `worker.target_refusal` and nothing is dialled."""
        if worker.side:
            return await self._side_target(worker)
        inst = worker.instance
        if inst is None or self.cloud is None or self.client_key is None:
            return None
        host = inst.address(self._cloud.config.use_public_ip)
        if host is None:
            return None
        port = self._cloud.config.ssh_port
        trust: KnownHostKeys | InstanceSecretTrust
        # The key learned on first use in this process stays pinned in the prober, so the
        # same trust object is kept (changing it would reopen the connection); after a
        # restart the key recorded in status.sshHostKey is trusted instead.
        if worker.host_key and self.prober.pinned_host_key(worker.name) is None:
            trust = KnownHostKeys.for_key(host, port, worker.host_key)
        else:
            nonce = inst.tags.get(self.tags.secret_nonce)  # None: made before nonces
            trust = InstanceSecretTrust(instance_secret(self.master, worker.name, nonce))
        return SshTarget(
            node=worker.name,
            host=host,
            client_key=self.client_key,
            trust=trust,
            port=port,
            user=self.settings.ssh_user,
        )

    async def _side_target(self, worker: Worker) -> SshTarget | None:
        spec = worker.spec
        if spec is None or self.credentials is None:
            worker.target_refusal = "no usable spec or no credential resolver"
            return None
        creds = await self.credentials.ssh(worker.name, spec)
        if isinstance(creds, Refusal):
            if worker.target_refusal != creds.message:
                log.info("WorkerNode %s: no SSH: %s", worker.name, creds.message)
            worker.target_refusal = creds.message
            return None
        worker.target_refusal = None
        return creds.target(worker.name)

    def _ensure_probe(self, worker: Worker) -> None:
        if self._closing or not worker.probing:
            return
        if worker.probe_task is None or worker.probe_task.done():
            worker.probe_task = asyncio.ensure_future(self._probe_loop(worker))

    def ensure_probes(self) -> None:
        for worker in self.workers.values():
            if worker.instance is not None or worker.side:
                self._ensure_probe(worker)

    async def destroy_node(self, node: str, reason: str) -> None:
        """Destroy a cloud node's instance for the power controller (raises CloudError
        when the cloud refused; the next attempt retries)."""
        worker = self.workers.get(node)
        if worker is None or worker.side:
            return
        await self.destroy(worker, reason)
        if worker.destroy_error is not None:
            raise TransientCloudError(
                worker.destroy_error, operation="destroy", observed_at=self.clock()
            )

    @property
    def cloud_source(self) -> str:
        """The cloud driver's name ("cloud" without one): the source of a gone VM's Off."""
        return self.cloud.config.driver if self.cloud is not None else "cloud"

    def snapshot(self, name: str) -> WorkerSnapshot | None:
        """WorkerNode `name`'s worker now (the power controller's view), or None."""
        worker = self.workers.get(name)
        return self.snapshot_of(worker) if worker is not None else None

    def snapshot_of(self, worker: Worker) -> WorkerSnapshot:
        """`worker` frozen as the power rules read it (`fleet.ports.WorkerSnapshot`)."""
        instance = worker.instance
        return WorkerSnapshot(
            name=worker.name,
            side=worker.side,
            booted_at=worker.booted_at,
            last_attempt=worker.last_attempt,
            last_success=worker.last_success,
            attempts_since_success=worker.attempts_since_success,
            attempts_total=worker.attempts_total,
            broken=worker.broken,
            deletion_requested=worker.deletion_requested,
            instance_id=instance.id if instance is not None else None,
            instance_stopped=instance is not None and instance.state is InstanceState.STOPPED,
            listed_at=self.last_sync,
        )

    def request_sync(self) -> None:
        """List the cloud at the next round (the power controller wants fresh evidence)."""
        self.sync_wanted = True
        self.on_change()

    async def ssh_target(self, node: str) -> SshTarget | None:
        worker = self.workers.get(node)
        return await self.target(worker) if worker is not None else None

    def request_probe(self, node: str) -> None:
        """Probe `node` now (the power controller asks for fresh readiness / work)."""
        worker = self.workers.get(node)
        if worker is not None:
            self._ensure_probe(worker)
            worker.probe_now.set()

    async def _probe_loop(self, worker: Worker) -> None:
        # A probe asked for at once (`request_probe`) still waits this long after the last
        # one, so a caller that asks after every result cannot make probes spin.
        min_gap = min(self.settings.boot_probe_interval, 1.0)
        while not self._closing and worker.probing:
            wanted = not worker.side or self.observer.should_probe(worker.name)
            if wanted:
                await self.probe_once(worker)
            interval = (
                self.settings.probe_interval if worker.ready else self.settings.boot_probe_interval
            )
            if worker.side and not wanted:
                # Off by its trusted power source: nothing answers SSH; the controller asks
                # (`request_probe`) when it wants readiness, this is only the safety net
                interval = self.settings.probe_interval
            elif worker.side and not worker.reachable:
                # its login is refused: nothing is dialled until the spec changes (`take`
                # asks for a probe then) or a designated Secret may have (this interval)
                interval = max(self.settings.probe_interval, REFUSED_RECHECK)
            worker.probe_now.clear()
            await asyncio.sleep(min(min_gap, interval))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    worker.probe_now.wait(), timeout=max(0.0, interval - min_gap)
                )

    async def probe_once(self, worker: Worker) -> ProbeReport | None:
        target = await self.target(worker)
        if target is None:
            return None
        now = self.clock()
        worker.last_attempt = now
        worker.attempts_total += 1
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        try:
            # side nodes: the power gates need inhibitors and the boot time as well, and
            # those with a BMC the host's product UUID (one machine, one BMC)
            report = await self.prober.probe(
                target,
                inhibitors=worker.side,
                uptime=worker.side,
                host_uuid=worker.side and worker.spec is not None and worker.spec.bmc is not None,
            )
        except SshError as exc:
            PROBE_SECONDS.labels("error").observe(loop.time() - t0)
            worker.attempts_since_success += 1
            worker.probe_result = exc.probe_result
            worker.probe_message = str(exc)[:300]
            log.debug("probe of %s failed: %s", worker.name, exc)
            self.observer.probed(self.snapshot_of(worker), None, exc)
            self.on_change()
            return None
        PROBE_SECONDS.labels("ready" if report.ready.ready else "booting").observe(loop.time() - t0)
        worker.probe_result = "Ready" if report.ready.ready else "Booting"
        worker.probe_message = None if report.ready.ready else report.ready.detail[:300]
        if report.learned_host_key is not None:
            self._learned(worker, report.learned_host_key)
        if report.ready.ready:
            worker.last_success = report.finished_at
            worker.attempts_since_success = 0
            if not worker.ready and worker.move(WorkerState.READY, "a probe found it ready"):
                worker.ready_since = report.finished_at
                log.info("WorkerNode %s is ready", worker.name)
            if report.runners is not None:
                worker.runners = {r.uuid: r.pid for r in report.runners.runners}
                worker.listed_runners = {r.uuid: r for r in report.runners.runners}
                worker.runners_at = report.runners.observed_at
                self._report_unowned(worker, report.runners.unowned)
                if report.runners.broken and not worker.broken:
                    log.warning("the runner on %s reports the node broken; draining", worker.name)
                    worker.broken = True
            if not worker.side:
                # in the background: a tag write yields to pending creates and destroys
                # (cloud rate-limit priorities) and must not hold back the probe's result
                self._background(self._maybe_tag_probe(worker, report.finished_at))
        else:
            worker.attempts_since_success += 1
            if worker.side:  # a side node that powered off boots again
                worker.move(WorkerState.BOOTING, "a probe found it not ready")
        self.observer.probed(self.snapshot_of(worker), report, None)
        self.on_change()
        return report

    def _report_unowned(self, worker: Worker, unowned: tuple[RunnerProcess, ...]) -> None:
        """Runners naming no owner are never killed; they are reported (the log once per
        change here; the WorkerNode's `RunnersOwned` condition by the power controller;
        `nodewarden_unowned_runners`)."""
        uuids = tuple(sorted(r.uuid for r in unowned))
        if uuids != worker.unowned_runners:
            if uuids:
                log.warning(
                    "WorkerNode %s runs %d runner(s) that name no owner (an older operator "
                    "or runner program): they are never killed; %s",
                    worker.name,
                    len(uuids),
                    ", ".join(uuids[:10]),
                )
            worker.unowned_runners = uuids
        UNOWNED_RUNNERS.set(sum(len(w.unowned_runners) for w in self.workers.values()))

    def _learned(self, worker: Worker, learned: LearnedHostKey) -> None:
        worker.host_key = learned.public_key
        log.info(
            "learned SSH host key of %s (%s %s) after it proved its instance secret",
            worker.name,
            learned.algorithm,
            learned.fingerprint,
        )

    async def _maybe_tag_probe(self, worker: Worker, now: datetime) -> None:
        interval = timedelta(seconds=self.settings.probe_tag_interval)
        if worker.instance is None or (
            worker.last_tag_at is not None and now - worker.last_tag_at < interval
        ):
            return
        tags = {
            **{k: v for k, v in worker.instance.tags.items() if self.tags.owns(k)},
            self.tags.last_probe: _iso(now) or "",
            self.tags.idle_behavior: worker.idle_behavior,
        }
        tags.pop(self.tags.dispatcher, None)
        worker.last_tag_at = now  # remembered in memory even if tagging fails
        try:
            await self._cloud.set_tags(worker.instance, tags)
        except CloudError as exc:
            log.info("tagging %s with its probe time failed: %s", worker.instance.id, exc)

    async def close(self) -> None:
        self._closing = True
        tasks = [w.probe_task for w in self.workers.values() if w.probe_task is not None]
        tasks += list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


def _iso(value: datetime | None) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value is not None else None


def _parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
