"""The worker pool: cloud instances, their WorkerNode objects, probes and lifecycle.

One `Worker` (pool/worker.py) per node, cloud VM or side node. `WorkerPool` is the
pool's one entry (the composition root builds it; the dispatcher and the power
controller call it) and composes collaborators that share a `PoolContext` and call one
another one way only (each only those listed before it):

    ProbeLoop    pool/probes.py      SSH targets, the probe loop, what a probe changes
    Admissions   pool/admissions.py  the create choke point (`admit`) and held nodes
    NodeStore    pool/nodes.py       WorkerNode objects: folding, writing, status fields
    Lifecycle    pool/lifecycle.py   create and destroy instances, forget vanished ones
    CloudSync    pool/cloudsync.py   the cloud list: adopt, take over, drop

A declared CloudVM WorkerNode over a cap keeps waiting (its `Launched` condition names
the cap, through the observer) and gets its instance in the first round the caps allow.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

from nodewarden.api.workernode import WorkerNodeSpec
from nodewarden.cloud.facade import CloudFacade
from nodewarden.config import DispatchSettings
from nodewarden.credentials import CredentialResolver
from nodewarden.fleet.policies import PolicyBook
from nodewarden.fleet.ports import WorkerObserver, WorkerSnapshot
from nodewarden.fleet.status import NodeStatusWriter
from nodewarden.kube.client import Kube
from nodewarden.metrics import HOURLY_SPEND
from nodewarden.pool.admissions import Admissions
from nodewarden.pool.cloudsync import CloudSync
from nodewarden.pool.context import PoolContext
from nodewarden.pool.lifecycle import Lifecycle
from nodewarden.pool.nodes import NodeStore
from nodewarden.pool.probes import ProbeLoop
from nodewarden.pool.worker import PoolState, Worker
from nodewarden.scheduling.caps import Admission
from nodewarden.scheduling.instancetypes import InstanceType
from nodewarden.scraped import Samples
from nodewarden.ssh.credentials import SshClientKey, SshTarget
from nodewarden.ssh.facts import ProbeReport
from nodewarden.ssh.prober import SshProber


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
        self.ctx = PoolContext(
            kube=kube,
            cloud=cloud,
            prober=prober,
            namespace=namespace,
            dispatcher_id=dispatcher_id,
            settings=settings,
            client_key=client_key,
            master=master,
            takeover_after=takeover_after,
            default_policy=default_policy,
            clock=clock,
            on_change=on_change,
            credentials=credentials,
            status=status,
            policies=policies,
        )
        self.probes = ProbeLoop(self.ctx)
        self.admissions = Admissions(self.ctx)
        self.nodes = NodeStore(self.ctx, self.probes, self.admissions)
        self.lifecycle = Lifecycle(self.ctx, self.nodes, self.probes, self.admissions)
        self.sync = CloudSync(self.ctx, self.nodes, self.probes, self.lifecycle)
        self._sync_wanted = False
        self._list_next = False
        if cloud is not None:
            HOURLY_SPEND.add_source(self.spend_samples)

    def spend_samples(self) -> Samples:
        """`nodewarden_cloud_spend_per_hour` at a scrape: the prices of the cloud
        instances that exist now -- created (our create returned it, or the list showed
        it), booting, ready or shutting down, until the list no longer shows it."""
        cloud = self.ctx.cloud
        if cloud is None:
            return
        spend = sum(
            w.price
            for w in self.ctx.workers.values()
            if not w.side and w.instance is not None and w.state is not PoolState.GONE
        )
        yield (cloud.config.currency,), spend

    # --- wiring (the composition root and the feed set these) ---------------------------

    @property
    def observer(self) -> WorkerObserver:
        """Who hears what the pool observes (the power controller)."""
        return self.ctx.observer

    @observer.setter
    def observer(self, observer: WorkerObserver) -> None:
        self.ctx.observer = observer

    @property
    def on_change(self) -> Callable[[], None]:
        """Called when something the next dispatcher round should see changed."""
        return self.ctx.on_change

    @on_change.setter
    def on_change(self, hook: Callable[[], None]) -> None:
        self.ctx.on_change = hook

    @property
    def fold(self) -> Callable[[Mapping[str, Any]], bool] | None:
        """Where a WorkerNode this pool wrote goes (the WorkerNode informer)."""
        return self.ctx.fold

    @fold.setter
    def fold(self, fold: Callable[[Mapping[str, Any]], bool] | None) -> None:
        self.ctx.fold = fold

    # --- what the dispatcher asks (dispatch.ports.WorkerPoolPort) -----------------------

    @property
    def workers(self) -> Mapping[str, Worker]:
        return self.ctx.workers

    @property
    def declared(self) -> Mapping[str, Mapping[str, Any]]:
        return self.nodes.declared

    def observe_node(
        self, body: Mapping[str, Any], deleted: bool = False, spec: WorkerNodeSpec | None = None
    ) -> None:
        """Fold a watched WorkerNode into the pool (`spec`: as the feed parsed it)."""
        self.nodes.observe_node(body, deleted, spec)

    def sync_requested(self) -> bool:
        """A cloud list is wanted now: someone asked for one since the last call (this
        answer clears it) or the pace says it is due (`CloudSync.due`)."""
        wanted, self._sync_wanted = self._sync_wanted, False
        self._list_next = self._list_next or wanted
        return wanted or self.sync.due()

    async def sync_cloud(self) -> None:
        """List the cloud if one was asked for or is due (the loop also calls this every
        `sync_interval`: at rest that is skipped until `sync_interval_at_rest`)."""
        asked, self._list_next = self._list_next, False
        if asked or self.sync.due():
            await self.sync.sync()

    async def adopt_declared(self) -> None:
        known = len(self.ctx.workers)
        await self.lifecycle.adopt_declared()
        if len(self.ctx.workers) > known:  # it asked for instances
            self.sync.busy()

    async def probe_once(self, worker: Worker) -> ProbeReport | None:
        return await self.probes.probe_once(worker)

    def ensure_probes(self) -> None:
        self.probes.ensure_probes()

    async def target(self, worker: Worker) -> SshTarget | None:
        return await self.probes.target(worker)

    def create(self, itype: InstanceType) -> Worker | None:
        worker = self.lifecycle.create(itype)
        if worker is not None:
            self.sync.busy()
        return worker

    def pending_creates(self) -> int:
        return self.lifecycle.pending_creates()

    def contribute_statuses(self, containers_by_node: Mapping[str, list[str]]) -> None:
        self.nodes.contribute_statuses(containers_by_node)

    async def destroy(self, worker: Worker, reason: str) -> None:
        self.sync.busy()
        await self.lifecycle.destroy(worker, reason)

    # --- what the power controller asks (fleet.ports.PoolPort) --------------------------

    @property
    def cloud_source(self) -> str:
        """The cloud driver's name ("cloud" without one): the source of a gone VM's Off."""
        cloud = self.ctx.cloud
        return cloud.config.driver if cloud is not None else "cloud"

    @property
    def lists_cloud(self) -> bool:
        """Whether a cloud is configured (a cloud list will come)."""
        return self.ctx.cloud is not None

    @property
    def holds(self) -> Mapping[str, Admission]:
        """Declared WorkerNodes waiting for an instance -> the refusal that holds them."""
        return self.admissions.holds

    def snapshot(self, name: str) -> WorkerSnapshot | None:
        """WorkerNode `name`'s worker now (the power controller's view), or None."""
        worker = self.ctx.workers.get(name)
        return self.ctx.snapshot_of(worker) if worker is not None else None

    def snapshot_of(self, worker: Worker) -> WorkerSnapshot:
        """`worker` frozen as the power rules read it (`fleet.ports.WorkerSnapshot`)."""
        return self.ctx.snapshot_of(worker)

    async def destroy_node(self, node: str, reason: str) -> None:
        """Destroy a cloud node's instance for the power controller (raises CloudError
        when the cloud refused; the next attempt retries)."""
        self.sync.busy()
        await self.lifecycle.destroy_node(node, reason)

    def request_sync(self) -> None:
        """List the cloud at the next round (the power controller wants fresh evidence)."""
        self._sync_wanted = True
        self.ctx.on_change()

    async def ssh_target(self, node: str) -> SshTarget | None:
        worker = self.ctx.workers.get(node)
        return await self.probes.target(worker) if worker is not None else None

    def request_probe(self, node: str) -> None:
        """Probe `node` now (the power controller asks for fresh readiness / work)."""
        worker = self.ctx.workers.get(node)
        if worker is not None:
            self.probes.ensure(worker)
            worker.probe_now.set()

    async def close(self) -> None:
        HOURLY_SPEND.remove_source(self.spend_samples)
        await self.probes.close()
