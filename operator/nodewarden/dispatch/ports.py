"""The dispatcher's seams: what `Dispatcher` needs of its queue, pool, cloud and prober.

Declared by the consumer (the Arvados scheduler's `interfaces.go` pattern): each
Protocol lists exactly the members `dispatch.dispatcher.Dispatcher` uses, nothing more.
The adapters (`ContainerQueue`, `WorkerPool`, `CloudFacade`, `SshProber`) satisfy them
structurally -- `build_dispatcher` passes them where these types are expected, so
`mypy --strict` checks the fit -- and in-process tests pass in-memory fakes instead
(`tests/dispatch/inproc/fakes.py`), with a fake clock, to drive `Dispatcher.step()`
without a cluster, a cloud or SSH.

Values that cross a seam (`Container`, `Worker`, `CloudInstance`, `SshTarget`,
`RunnerStarted`, `RunnerOutcome`, `CreatePermission`) are the product's own data types.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from nodewarden.api.workernode import WorkerNodeSpec
from nodewarden.cloud.backoff import CreatePermission
from nodewarden.dispatch.queue import Container
from nodewarden.pool.worker import Worker
from nodewarden.scheduling.instancetypes import InstanceType, InstanceTypePolicy
from nodewarden.ssh.credentials import SshTarget
from nodewarden.ssh.facts import ProbeReport, RunnerOutcome, RunnerStarted


class ContainerQueuePort(Protocol):
    """The ContainerDispatch objects as the dispatcher knows them, and their writes."""

    @property
    def by_name(self) -> Mapping[str, Container]:
        """Every known container by object name."""

    def observe(self, body: Mapping[str, Any], deleted: bool = False) -> None:
        """Fold a watched object into the cache (a newer resourceVersion wins)."""

    @property
    def version(self) -> int:
        """Bumped whenever the cache changes (the dispatcher re-plans only then)."""

    def get(self, name: str) -> Container | None: ...

    def by_uuid(self) -> dict[str, Container]:
        """Containers with a valid spec, by container uuid (duplicates left out)."""

    def __iter__(self) -> Iterator[Container]:
        """The containers the dispatcher acts on (objects whose uuid another holds left out)."""

    @property
    def marks_due(self) -> bool:
        """Some object's DuplicateUuid mark needs writing or clearing."""

    async def mark_duplicates(self) -> None:
        """Write the Valid condition of duplicates (and of former duplicates)."""

    async def write(
        self,
        c: Container,
        status: Mapping[str, Any],
        *,
        precondition: bool = False,
        background: bool = False,
        unless: Callable[[], bool] | None = None,
    ) -> bool:
        """Merge-patch the status; False when the object changed (`precondition`) or is gone,
        or when `unless()` is true once the write's turn comes (then nothing is sent)."""

    async def drop_legacy_finalizer(self, c: Container) -> bool:
        """Remove the finalizer of earlier releases; False when the object changed or is gone."""

    def conditions(self, c: Container, valid: bool, reason: str, message: str) -> list[Any]:
        """The status conditions of `c` with its Valid condition set (wire form)."""


class WorkerPoolPort(Protocol):
    """The dispatcher's nodes: cloud VMs and side nodes, their probes and creates."""

    @property
    def workers(self) -> Mapping[str, Worker]:
        """Every node of the pool by WorkerNode name."""

    @property
    def declared(self) -> Mapping[str, Mapping[str, Any]]:
        """CloudVM WorkerNodes a person declared that still wait for an instance."""

    def sync_requested(self) -> bool:
        """Someone asked for a cloud list since the last call (this answer clears it)."""

    def observe_node(
        self, body: Mapping[str, Any], deleted: bool = False, spec: WorkerNodeSpec | None = None
    ) -> None: ...

    async def sync_cloud(self) -> None:
        """List the cloud: adopt instances tagged as ours, drop workers whose instance left."""

    async def adopt_declared(self) -> None:
        """Give each declared CloudVM WorkerNode an instance."""

    async def probe_once(self, worker: Worker) -> ProbeReport | None:
        """Probe `worker` now (readiness and runners), folding the result into it."""

    def ensure_probes(self) -> None:
        """Every node with something to probe has its probe loop running."""

    async def target(self, worker: Worker) -> SshTarget | None:
        """Where and how to reach `worker` over SSH now, or None."""

    def create(self, itype: InstanceType) -> Worker | None:
        """Register a new worker now (the next plan counts it); its instance comes later.
        None: the hard caps (`scheduling.caps`) refused the create."""

    def pending_creates(self) -> int:
        """Workers whose create is still in flight."""

    def contribute_statuses(self, containers_by_node: Mapping[str, list[str]]) -> None:
        """Hand the pool's WorkerNode status fields to the status writer."""

    async def close(self) -> None: ...


class TypePolicySource(Protocol):
    """The part of the cloud's configuration the scheduler reads."""

    @property
    def instance_type_policy(self) -> InstanceTypePolicy: ...


class BackoffSnapshot(Protocol):
    """The cloud back-off as the management status endpoint shows it."""

    def snapshot(self, now: datetime) -> dict[str, object]: ...


class CloudPort(Protocol):
    """The cloud as the scheduler sees it: the catalogue and whether a create may go now."""

    @property
    def catalogue(self) -> Sequence[InstanceType]: ...

    @property
    def config(self) -> TypePolicySource: ...

    @property
    def backoff(self) -> BackoffSnapshot: ...

    def instance_type(self, name: str) -> InstanceType | None: ...

    def may_create(
        self, instance_type: InstanceType, now: datetime | None = None
    ) -> CreatePermission: ...

    async def close(self) -> None: ...


class ProberPort(Protocol):
    """Runners over SSH: start, signal, ask how one ended (fenced: `ssh.fenced`)."""

    async def start_runner(
        self, target: SshTarget, config: Mapping[str, Any], uid: str | None = None
    ) -> RunnerStarted:
        """Start the runner of a container (or find it already running), recording this
        dispatcher as its owner and `uid` (the object's metadata.uid); raises SshError
        (`NotSent` when leadership is not valid, `FenceRejected` for a stale token)."""

    async def kill_runner(self, target: SshTarget, uuid: str, signal: str | int = "TERM") -> None:
        """Signal the runner of `uuid`; raises SshError (as `start_runner`)."""

    async def runner_status(self, target: SshTarget, uuid: str) -> RunnerOutcome:
        """How the runner of `uuid` is or ended; raises SshError."""

    async def aclose(self) -> None: ...
