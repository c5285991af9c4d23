"""The one writer of WorkerNode status: owners contribute fields, one merge patch per change.

The power controller owns state, observed power, readiness, admission, idleSince, the
persisted power state (`powerState`), the last Safety Record summary and the conditions;
the worker pool owns what it observes of a cloud instance and its runners (instance id,
address, boot time, running containers, last probe, learned host key, price). Each calls
`contribute(node, fields)`; a field equal to what the API server already holds is not
sent, so a node whose status did not change costs no write. `flush()` sends one merge
patch per node with everything that changed (`flush(hold=...)` keeps some nodes' changes
for the next one). A field that only says when something was
last seen (`RIDE_ALONG`: `observedPowerTime`, which moves at every BMC poll) is no
change on its own: it waits and rides along with the node's next real change (the
controller's freshness gates use each reading's own time, never the status field).

A patch that carries `powerState` is sent with a resourceVersion precondition. On a
conflict the object is read again; the write is retried only if the power state on the
server is still the one this process last wrote (`seq` unchanged): otherwise someone else
advanced the machine and `PowerStateConflict` tells the controller to reload instead of
acting. `persist(node)` writes at once -- the controller persists a transition's request
*before* sending it, so a restarted or new leader that finds the request in status never
sends it a second time unless the state machine says so.

A write the server refuses for another reason (a 422 from a CEL rule or a schema bound,
a 403, a 5xx, a timeout) is not sent again at every round: the node's writes back off
(0.5 s doubling to 60 s, `WRITE_BACKOFF_MAX`), the failure is logged when it starts or
its message changes, and the first write that lands ends the back-off.

What the server holds comes from the WorkerNode informer: the power controller hands
every compact body to `observe`, and the writer keeps a reference to its `status` (one
copy per node in the process, shared with the informer's store; never mutated here).
An object a write returns goes to `fold` -- the informer, which hands it back through
`observe` -- so the store, not the writer, decides which version is newest.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from nodewarden.api.kinds import WORKER_NODE
from nodewarden.kube.client import Conflict, Kube, KubeError, NotFound
from nodewarden.logs import redact_tree
from nodewarden.metrics import STATUS_WRITES

log = logging.getLogger(__name__)


WRITE_BACKOFF_MAX = 60.0
"""Seconds: the longest wait between two writes of a node whose writes keep failing."""

RIDE_ALONG: frozenset[str] = frozenset({"observedPowerTime"})
"""Status fields never written on their own (see the module docstring)."""


class PowerStateConflict(Exception):
    """Another writer changed the node's power state; reload it before acting."""


@dataclass
class _Node:
    resource_version: str | None = None
    server: Mapping[str, Any] = field(default_factory=dict)
    """The status as last seen on the server (watch events and our own write results);
    the informer's compact status, shared: read-only."""
    pending: dict[str, Any] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    """One write per node at a time: a second write waits and then sends against the
    resourceVersion the first one produced (never a false conflict with itself)."""
    failures: int = 0
    """Writes refused in a row (reset by one that lands)."""
    retry_at: float = 0.0
    """Monotonic time before which a flush leaves the node alone (its writes failing)."""
    last_error: str | None = None


def _stripped(value: Any) -> Any:
    """`value` without null members: a merge patch deletes a key by sending null, so the
    server never holds nulls, and what we want (with nulls) equals what it holds."""
    if isinstance(value, Mapping):
        return {k: _stripped(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_stripped(v) for v in value]
    return value


def _same(a: Any, b: Any) -> bool:
    return bool(_stripped(a) == _stripped(b))


def _seq(status: Mapping[str, Any]) -> int | None:
    state = status.get("powerState")
    if isinstance(state, Mapping):
        seq = state.get("seq")
        return int(seq) if isinstance(seq, int) else None
    return None


class NodeStatusWriter:
    """See the module docstring. One per operator process."""

    def __init__(
        self,
        kube: Kube,
        namespace: str,
        concurrency: int = 16,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self.monotonic = monotonic
        self.namespace = namespace
        self._nodes: dict[str, _Node] = {}
        self._writes = asyncio.Semaphore(concurrency)
        self._flushing: set[str] = set()
        self._pending: set[str] = set()
        """Nodes that may have pending fields (a superset; `dirty` checks each)."""
        self.writes = 0
        self.fold: Callable[[Mapping[str, Any]], bool] | None = None
        """Where an object returned by a write goes (the WorkerNode informer, which hands
        it back through `observe`); None: straight to `observe`."""

    # -- what the server holds ---------------------------------------------------------

    def observe(self, name: str, body: Mapping[str, Any] | None) -> None:
        """A watched or written version of the object (None: deleted)."""
        if body is None:
            self._nodes.pop(name, None)
            return
        node = self._nodes.setdefault(name, _Node())
        rv = (body.get("metadata") or {}).get("resourceVersion")
        if (
            rv is not None
            and node.resource_version is not None
            and _newer(node.resource_version, rv)
        ):
            return  # an older event than a write we already folded in
        node.resource_version = rv
        node.server = body.get("status") or {}
        for key in list(node.pending):
            if _same(node.server.get(key), node.pending[key]):
                del node.pending[key]

    def _take(self, name: str, body: Mapping[str, Any]) -> None:
        """An object read or written by this writer."""
        if self.fold is not None:
            self.fold(body)
        else:
            self.observe(name, body)

    def server_status(self, name: str) -> Mapping[str, Any]:
        node = self._nodes.get(name)
        return node.server if node is not None else {}

    def known(self, name: str) -> bool:
        return name in self._nodes

    # -- contributions ----------------------------------------------------------------

    def contribute(self, name: str, fields: Mapping[str, Any]) -> bool:
        """Queue the fields that differ from the server's; returns whether any did (a
        `RIDE_ALONG` field is queued but does not count)."""
        node = self._nodes.get(name)
        if node is None:
            return False
        changed = False
        # masked here already (the API adapter masks again): compared with the server's
        # masked copy, an unmasked value would differ at every round and be written again
        for key, value in redact_tree(fields).items():
            if _same(node.server.get(key), value):
                node.pending.pop(key, None)
                continue
            if key in node.pending and _same(node.pending[key], value):
                continue
            node.pending[key] = value
            self._pending.add(name)
            changed = changed or key not in RIDE_ALONG
        return changed

    def dirty(self) -> list[str]:
        """Nodes with a pending change worth a write (not only `RIDE_ALONG` fields); looks
        only at nodes that were given fields, not at the whole fleet."""
        out: list[str] = []
        now = self.monotonic()
        for name in list(self._pending):
            node = self._nodes.get(name)
            if node is None or not node.pending:
                self._pending.discard(name)
            elif not node.pending.keys() <= RIDE_ALONG and node.retry_at <= now:
                out.append(name)
        return out

    # -- writes -----------------------------------------------------------------------

    async def flush(self, hold: Collection[str] = ()) -> None:
        """Write every node with pending changes (one patch each, bounded concurrency),
        except those in `hold` (their changes wait for the next flush)."""
        names = [n for n in self.dirty() if n not in self._flushing and n not in hold]
        if not names:
            return
        await asyncio.gather(*(self._write_guarded(n) for n in names))

    async def persist(self, name: str) -> None:
        """Write `name`'s pending changes now; raises PowerStateConflict or KubeError."""
        await self._write(name)

    async def _write_guarded(self, name: str) -> None:
        try:
            await self._write(name)
        except PowerStateConflict:
            log.warning("WorkerNode %s: power state changed by another writer; reloading", name)
        except KubeError as exc:
            node = self._nodes.get(name)
            if node is None:
                return
            node.failures += 1
            wait = min(WRITE_BACKOFF_MAX, 0.5 * 2 ** (node.failures - 1))
            node.retry_at = self.monotonic() + wait
            if str(exc) != node.last_error:
                node.last_error = str(exc)
                log.warning(
                    "status write of WorkerNode %s failed: %s (next try in %.1fs, backing "
                    "off to %.0fs while it keeps failing)",
                    name,
                    exc,
                    wait,
                    WRITE_BACKOFF_MAX,
                )

    async def _write(self, name: str) -> None:
        node = self._nodes.get(name)
        if node is None or not node.pending:
            return
        self._flushing.add(name)
        try:
            async with node.lock, self._writes:
                if node.pending:
                    await self._send(name, node)
        finally:
            self._flushing.discard(name)

    async def _send(self, name: str, node: _Node) -> None:
        patch = dict(node.pending)
        guarded = "powerState" in patch
        expected_seq = _seq(node.server)
        for attempt in (1, 2):
            try:
                self.writes += 1
                STATUS_WRITES.labels("WorkerNode").inc()
                body = await self.kube.patch_status(
                    WORKER_NODE,
                    self.namespace,
                    name,
                    patch,
                    resource_version=node.resource_version if guarded else None,
                )
            except NotFound:
                node.pending.clear()
                return
            except Conflict:
                if attempt == 2:
                    raise
                latest = await self.kube.get(WORKER_NODE, self.namespace, name)
                if latest is None:
                    node.pending.clear()
                    return
                self._take(name, latest)
                if _seq(node.server) != expected_seq:
                    node.pending.pop("powerState", None)
                    raise PowerStateConflict(name) from None
                continue
            self._take(name, body)
            if node.failures:
                log.info("status write of WorkerNode %s lands again", name)
                node.failures, node.retry_at, node.last_error = 0, 0.0, None
            for key, value in patch.items():
                if key in node.pending and _same(node.pending[key], value):
                    node.pending.pop(key, None)
            return


def _newer(current: str, incoming: str) -> bool:
    """Whether `current` is a newer resourceVersion than `incoming` (etcd revisions are
    integers; anything else compares as not newer)."""
    try:
        return int(current) > int(incoming)
    except ValueError:
        return False
