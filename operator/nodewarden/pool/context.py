"""What every collaborator of the worker pool shares: its adapters, settings and workers.

`WorkerPool` (pool/workers.py) makes one `PoolContext` and hands it to each collaborator
(`NodeStore`, `ProbeLoop`, `Admissions`, `Lifecycle`, `CloudSync`); they read and change
the workers through it and call one another one way only (see pool/workers.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Mapping
from datetime import datetime, timedelta
from typing import Any

from nodewarden.cloud.facade import CloudFacade
from nodewarden.cloud.tags import TagKeys
from nodewarden.config import DispatchSettings
from nodewarden.credentials import CredentialResolver
from nodewarden.fleet.policies import PolicyBook
from nodewarden.fleet.ports import NoObserver, WorkerObserver, WorkerSnapshot
from nodewarden.fleet.status import NodeStatusWriter
from nodewarden.kube.client import Kube
from nodewarden.pool.worker import Worker
from nodewarden.ssh.credentials import SshClientKey
from nodewarden.ssh.prober import SshProber


class PoolContext:
    """The pool's adapters and settings, its workers, and its background tasks."""

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
        credentials: CredentialResolver | None,
        status: NodeStatusWriter | None,
        policies: PolicyBook | None,
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
        self.last_sync: datetime | None = None
        self.closing = False
        self.tasks: set[asyncio.Task[None]] = set()
        self.tags = cloud.tag_keys if cloud is not None else TagKeys()

    @property
    def cloud_(self) -> CloudFacade:
        """The cloud (only cloud-VM code paths run, and they run only with a cloud)."""
        assert self.cloud is not None, "a cloud-VM operation without a cloud configured"
        return self.cloud

    @property
    def key(self) -> SshClientKey:
        assert self.client_key is not None, "a cloud VM needs the operator's SSH key"
        return self.client_key

    def background(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def snapshot_of(self, worker: Worker) -> WorkerSnapshot:
        """`worker` frozen as the power rules read it, with the time of the last list."""
        return worker.snapshot(self.last_sync)
