"""The cloud list decoded in a worker process; only what changed comes back.

Measured (benchmarks/bench_cloud_list.py, 8,000 instances, 3.9 MB of JSON): decoding on
the event loop stalls it ~150 ms; in a thread the thread holds the GIL for most of
that (a 54 ms stall at worst, the loop getting the GIL back at each switch interval);
in a worker process returning the whole list the unpickling of 8,000 views costs the
operator as much (43 ms stall, on the executor's result thread). In a worker process
that sends back only the instances new or changed since the last list, an unchanged
fleet costs the operator a few ms of CPU and ~1 ms of stall. So: a process, not an
incremental parser (the JSON is one C call; the Python-level work is building the
views, which an incremental parser would still do on the loop).

`ProcessListLayer` is the innermost layer's list: it keeps the last view (instance id
-> `CloudInstance`), applies the changes the process reports, and stamps every
instance with the time the process read the list (a few thousand `model_copy` calls,
yielding to the loop every `RESTAMP_CHUNK`), so callers still get the whole list with
fresh `observed_at` (the power controller's confirmation of every VM). The process
keeps its own last view and a generation number; a reply the operator did not apply
(cancelled, lost) makes the next one a full list. create / set_tags / destroy go to the
thread-pool layer as before.

The worker process builds its own driver from `driver_maker` (picklable: the cloud
config and credentials, which cross to the process through its pipe and are never
logged). When the process cannot be used (it fails to start or breaks), a warning is
logged once and the list runs in the thread from then on. Until the process has started
(a spawn imports the driver: 1-3 s on a loaded machine), lists go through the thread too:
the dispatcher's start-up recovery waits for the first list, so the first container's
start does not wait for the spawn (`bench_dispatch.py`: about 2 s of its first Running).
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from libcloud.compute.base import NodeDriver

from nodewarden.clock import utc_now
from nodewarden.cloud.errors import CloudError
from nodewarden.cloud.libcloudset import LibcloudInstanceSet
from nodewarden.cloud.model import CloudInstance, CreateRequest

log = logging.getLogger(__name__)

RESTAMP_CHUNK = 200
"""Instances re-stamped between two yields to the event loop."""


@dataclass(frozen=True)
class ListChanges:
    """One list as the worker process reports it."""

    generation: int
    read_at: datetime
    """When the list was read, on the worker process's clock (see `sent_at`)."""
    sent_at: datetime
    """When the reply left the worker process: the operator re-bases `read_at` on its own
    clock by the difference (a test's fake clock included)."""
    full: bool
    """`changed` is the whole list (the first, or the operator missed a reply)."""
    changed: list[CloudInstance] = field(default_factory=list)
    vanished: list[str] = field(default_factory=list)


class _Lister:
    """The worker process's side: its driver, its last view and generation."""

    def __init__(self, instances: LibcloudInstanceSet) -> None:
        self.instances = instances
        self.view: dict[str, CloudInstance] = {}
        self.generation = 0

    def changes(self, have: int) -> ListChanges:
        listed = self.instances.list_blocking()
        read_at = utc_now()
        view = {i.id: i for i in listed}
        full = have != self.generation
        if full:
            changed = listed
            vanished: list[str] = []
        else:
            changed = [i for i in listed if (b := self.view.get(i.id)) is None or not b.same_as(i)]
            vanished = [iid for iid in self.view if iid not in view]
        self.view = view
        self.generation += 1
        return ListChanges(self.generation, read_at, utc_now(), full, changed, vanished)


_LISTER: _Lister | None = None


def _start(driver_maker: Callable[[], NodeDriver], options: Mapping[str, Any]) -> None:
    global _LISTER
    _LISTER = _Lister(LibcloudInstanceSet(driver_maker, max_threads=1, **options))


def _list_changes(have: int) -> ListChanges:
    assert _LISTER is not None, "the worker process was not started"
    return _LISTER.changes(have)


def _ready() -> bool:
    return _LISTER is not None


class ProcessListLayer:
    """`InstanceSet` listing through a worker process (module docstring)."""

    def __init__(
        self,
        inner: LibcloudInstanceSet,
        driver_maker: Callable[[], NodeDriver],
        options: Mapping[str, Any],
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self.inner = inner
        self._clock = clock
        self.source = inner.source
        self._view: dict[str, CloudInstance] = {}
        self._generation = -1  # the first reply is a full list
        self.last_reply: tuple[bool, int, int] | None = None
        """(full, changed, vanished) of the last reply: what crossed from the process."""
        self._process: ProcessPoolExecutor | None = ProcessPoolExecutor(
            max_workers=1,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_start,
            initargs=(driver_maker, dict(options)),
        )
        self._ready = self._process.submit(_ready)  # start it now, not at the first list

    @property
    def in_process(self) -> bool:
        """Lists still go through the worker process (False after a fallback)."""
        return self._process is not None

    async def started(self) -> bool:
        """Wait until the worker process has started (True) or could not (False)."""
        if self._process is None:
            return False
        try:
            await asyncio.wrap_future(self._ready)
        except Exception:  # the next list falls back to the thread and logs why
            return False
        return True

    async def list_instances(self) -> list[CloudInstance]:
        if self._process is None or not self._ready.done():
            # no process, or it is still starting (a spawn imports the driver: 1-3 s on a
            # loaded machine, and the dispatcher's start-up recovery waits for this list):
            # the thread lists; the process's first reply is then a full list
            return await self.inner.list_instances()
        loop = asyncio.get_running_loop()
        try:
            changes = await loop.run_in_executor(self._process, _list_changes, self._generation)
        except CloudError as exc:
            # its times (when seen, when to retry) on this process's clock
            shift = self._clock() - exc.observed_at
            exc.observed_at += shift
            if exc.retry_at is not None:
                exc.retry_at += shift
            raise
        except (BrokenProcessPool, OSError, RuntimeError, ValueError, TypeError) as exc:
            log.warning(
                "cloud list worker process unusable (%s); listing in a thread from now on",
                type(exc).__name__,
            )
            self._stop_process()
            return await self.inner.list_instances()
        if changes.full:
            self._view = {i.id: i for i in changes.changed}
        else:
            for inst in changes.changed:
                self._view[inst.id] = inst
            for iid in changes.vanished:
                self._view.pop(iid, None)
        self._generation = changes.generation
        self.last_reply = (changes.full, len(changes.changed), len(changes.vanished))
        out: list[CloudInstance] = []
        stamp = {"observed_at": self._clock() - (changes.sent_at - changes.read_at)}
        for n, inst in enumerate(list(self._view.values()), 1):
            out.append(inst.model_copy(update=stamp))
            if n % RESTAMP_CHUNK == 0:
                await asyncio.sleep(0)
        return out

    async def create(self, request: CreateRequest) -> CloudInstance:
        return await self.inner.create(request)

    async def set_tags(self, instance: CloudInstance, tags: Mapping[str, str]) -> None:
        await self.inner.set_tags(instance, tags)

    async def destroy(self, instance: CloudInstance) -> None:
        await self.inner.destroy(instance)

    async def close(self) -> None:
        self._stop_process()
        await self.inner.close()

    def _stop_process(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            process.shutdown(wait=False, cancel_futures=True)
