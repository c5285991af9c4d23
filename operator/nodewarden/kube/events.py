"""Events a user can read: aggregated the way Kubernetes' own event recorder aggregates,
and never in the hot path of a decision.

`EventRecorder.record` is synchronous and never waits: it decides, in memory, what the
API server should hold and queues one write for the background drainer.

- **Aggregation** (client-go's `EventCorrelator`): the same involved object, reason, type
  and message key within `window` of the last occurrence is the same Event: its core/v1
  `count` grows and `lastTimestamp` moves (a PATCH), no new Event is created. While the
  first write of a series is still queued, a repeat only bumps that queued write: no
  request at all.
- **Rate per object** (client-go's spam filter): a token bucket per involved object,
  `burst` Events then one every `refill_seconds`; an Event over it is dropped.
- **Bounded queue**: at most `queue_size` writes wait; one more is dropped. Every drop is
  counted in `nodewarden_events_dropped_total{why}` -- an Event is information, a
  decision never waits for one.

The drainer is one task, started by a `record` on a running loop when none runs; it ends
when the queue is empty (nothing lingers between Events). `close` sends what is queued
(within a deadline) and refuses more. The writes go through a
sink (`Kube.send_event`): this module does no I/O of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from nodewarden.metrics import EVENTS_DROPPED

log = logging.getLogger(__name__)

QUEUE_SIZE = 4096
"""Writes that may wait for the drainer; one more is dropped (counted)."""
WINDOW_SECONDS = 600.0
"""client-go's aggregation window: a repeat within it joins the Event's series."""
BURST = 25
"""client-go's spam filter: Events per involved object before the refill rate applies."""
REFILL_SECONDS = 300.0
"""client-go's spam filter: one more Event per object every this many seconds."""
PATCH_INTERVAL_SECONDS = 60.0
"""A series' count is patched at most this often (loop time); close sends the rest."""
MAX_SERIES = 20_000
"""Series remembered (least recently seen forgotten first); each is a few hundred bytes."""


@dataclass(frozen=True)
class SeriesKey:
    """What makes two occurrences the same Event."""

    namespace: str
    kind: str
    name: str
    uid: str
    reason: str
    type: str
    message_key: str


@dataclass
class EventWrite:
    """One request the drainer sends: the first of a series (`create`) or its new count."""

    name: str
    namespace: str
    involved: dict[str, Any]
    reason: str
    message: str
    type: str
    action: str
    component: str
    first: datetime
    last: datetime
    count: int
    create: bool
    series: _Series | None = field(default=None, repr=False, compare=False)


@dataclass
class _Series:
    name: str
    first: datetime
    last: datetime
    count: int
    pending: EventWrite | None
    """The write still queued for this series (a repeat bumps it in place)."""
    sent_at: float | None = None
    """Loop time its last write left the queue."""
    dirty: tuple[Any, ...] | None = None
    """A repeat not yet sent (its `_enqueue` arguments): sent when its patch is due."""
    scheduled: bool = False


@dataclass
class _Bucket:
    tokens: float
    at: datetime


EventSink = Callable[[EventWrite], Awaitable[None]]


def _utcnow() -> datetime:
    return datetime.now(tz=UTC)


@dataclass
class EventRecorder:
    """See the module docstring."""

    sink: EventSink
    clock: Callable[[], datetime] = _utcnow
    queue_size: int = QUEUE_SIZE
    window_seconds: float = WINDOW_SECONDS
    burst: int = BURST
    refill_seconds: float = REFILL_SECONDS
    max_series: int = MAX_SERIES
    patch_interval: float = PATCH_INTERVAL_SECONDS
    queue: deque[EventWrite] = field(default_factory=deque)
    sent: int = 0
    """Writes the sink has been handed (creates and patches)."""
    _series: OrderedDict[SeriesKey, _Series] = field(default_factory=OrderedDict)
    _buckets: OrderedDict[tuple[str, str, str], _Bucket] = field(default_factory=OrderedDict)
    _sequence: Iterator[int] = field(default_factory=itertools.count)
    _task: asyncio.Task[None] | None = None
    _closed: bool = False

    # -- the caller's side: never waits -------------------------------------------------

    def record(
        self,
        obj: Mapping[str, Any],
        *,
        reason: str,
        message: str,
        type_: str = "Normal",
        action: str = "Reconcile",
        component: str = "nodewarden",
        message_key: str | None = None,
    ) -> bool:
        """Queue (or fold into its series) an Event about `obj`. Returns False when it
        was dropped (rate per object, full queue, recorder closed)."""
        if self._closed:
            return False
        meta = obj.get("metadata") or {}
        namespace = str(meta.get("namespace") or "default")
        name = str(meta.get("name") or "nodewarden")
        kind = str(obj.get("kind") or "")
        key = SeriesKey(
            namespace,
            kind,
            name,
            str(meta.get("uid") or ""),
            reason,
            type_,
            message if message_key is None else message_key,
        )
        now = self.clock()
        series = self._series.get(key)
        if series is not None and (now - series.last).total_seconds() <= self.window_seconds:
            series.count += 1
            series.last = now
            self._series.move_to_end(key)
            if series.pending is not None:  # not sent yet: the queued write carries it
                series.pending.count = series.count
                series.pending.last = now
                series.pending.message = message
                return True
            args = (key, series, obj, meta, reason, message, type_, action, component, False)
            return self._repeat(series, args)
        if not self._allowed((namespace, kind, name), now):
            EVENTS_DROPPED.labels("rate_limited").inc()
            return False
        series = _Series(
            # client-go's name (object.nanoseconds in hex), made unique within this
            # recorder by a sequence: two series opened at the same instant differ
            name=f"{name}.{int(now.timestamp() * 1e9) + next(self._sequence):x}",
            first=now, last=now, count=1, pending=None,
        )  # fmt: skip
        self._series[key] = series
        self._series.move_to_end(key)
        while len(self._series) > self.max_series:
            self._series.popitem(last=False)
        return self._enqueue(
            key, series, obj, meta, reason, message, type_, action, component, True
        )

    def _repeat(self, series: _Series, args: tuple[Any, ...]) -> bool:
        """A repeat of a series already sent: its count goes out at most once per
        `patch_interval` seconds (client-go's events library updates a series on a
        heartbeat too), the latest occurrence carrying the total."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return self._enqueue(*args)
        due = (series.sent_at or 0.0) + self.patch_interval - loop.time()
        if due <= 0 and not series.scheduled:
            return self._enqueue(*args)
        series.dirty = args
        if not series.scheduled:
            series.scheduled = True
            loop.call_later(max(due, 0.0), self._patch_due, series)
        return True

    def _patch_due(self, series: _Series) -> None:
        series.scheduled = False
        args, series.dirty = series.dirty, None
        if args is not None and not self._closed:
            self._enqueue(*args)

    def _allowed(self, obj_key: tuple[str, str, str], now: datetime) -> bool:
        """The per-object token bucket (a new Event, not a repeat, spends a token)."""
        bucket = self._buckets.get(obj_key)
        if bucket is None:
            bucket = self._buckets[obj_key] = _Bucket(float(self.burst), now)
            while len(self._buckets) > self.max_series:
                self._buckets.popitem(last=False)
        else:
            elapsed = max(0.0, (now - bucket.at).total_seconds())
            refill = elapsed / self.refill_seconds if self.refill_seconds > 0 else self.burst
            bucket.tokens = min(float(self.burst), bucket.tokens + refill)
            bucket.at = now
            self._buckets.move_to_end(obj_key)
        if bucket.tokens < 1.0:
            return False
        bucket.tokens -= 1.0
        return True

    def _enqueue(
        self,
        key: SeriesKey,
        series: _Series,
        obj: Mapping[str, Any],
        meta: Mapping[str, Any],
        reason: str,
        message: str,
        type_: str,
        action: str,
        component: str,
        create: bool,
    ) -> bool:
        if len(self.queue) >= self.queue_size:
            EVENTS_DROPPED.labels("queue_full").inc()
            if create:  # never created: a repeat must not patch what does not exist
                self._series.pop(key, None)
            return False
        write = EventWrite(
            name=series.name,
            namespace=key.namespace,
            involved={
                "apiVersion": obj.get("apiVersion"),
                "kind": obj.get("kind"),
                "name": meta.get("name"),
                "namespace": key.namespace,
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
            },
            reason=reason,
            message=message,
            type=type_,
            action=action,
            component=component,
            first=series.first,
            last=series.last,
            count=series.count,
            create=create,
            series=series,
        )
        series.pending = write
        self.queue.append(write)
        self._kick()
        return True

    def _kick(self) -> None:
        """Start the drainer on the running loop if it is not running (it ends when the
        queue is empty: no task lingers between Events)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop yet: the writes wait for the first record (or flush) on one
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._drain(), name="nodewarden-events")

    # -- the drainer ----------------------------------------------------------------------

    async def _drain(self) -> None:
        while self.queue:
            write = self.queue.popleft()
            self._release(write)
            self.sent += 1
            try:
                await self.sink(write)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # one Event's failure is a log line, nothing more
                log.warning("could not post event %s: %s", write.reason, exc)

    @staticmethod
    def _release(write: EventWrite) -> None:
        """The write leaves the queue: a repeat from now on is a new (patch) write."""
        series = write.series
        if series is not None and series.pending is write:
            series.pending = None
            series.sent_at = asyncio.get_running_loop().time()

    async def flush(self, within: float = 5.0) -> None:
        """Wait (at most `within` seconds) until every queued write has been sent."""
        if not self.queue and (self._task is None or self._task.done()):
            return
        self._kick()
        task = self._task
        if task is not None:
            await asyncio.wait([task], timeout=within)

    async def close(self, within: float = 5.0) -> None:
        """Send what is queued and every series' count not sent yet (within `within`
        seconds), then stop the drainer."""
        for series in list(self._series.values()):
            args, series.dirty = series.dirty, None
            if args is not None:
                self._enqueue(*args)
        await self.flush(within)
        self._closed = True
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
