"""The informer: one LIST+WATCH of one nodewarden kind feeding a store of compact models.

The feed for the hot kinds (WorkerNode, ContainerDispatch), in the manner of client-go's
reflector + informer with a transform function:

1. LIST in pages (`limit`/`continue`); each raw object goes through the transform
   (`raw dict -> T | None`, None = drop) once, and only the compact model is kept.
2. WATCH from the list's resourceVersion with `allowWatchBookmarks=true`. Every event
   and bookmark advances the resumable resourceVersion. The server ends each watch after
   `watch_timeout` seconds; the client gives up on a stream silent for `read_timeout`
   seconds (a dead connection); either way the watch resumes from the last
   resourceVersion without a relist.
3. `410 Gone` (an ERROR event or the HTTP status; also an expired continue token) relists
   and reconciles the store by diff: DELETED for vanished objects, MODIFIED for changed
   ones, nothing for the unchanged (`nodewarden.kube.store`).
4. Any other failure backs off (capped exponential, jittered) and retries; the loop only
   ends when `stop()` cancels it.

Handlers `(event_type, old, new)` run synchronously, in order, after the store is
updated; they must be cheap (mark dirty, wake a loop). `fold(raw)` applies an object the
operator got back from its own write, under the same resourceVersion ordering rule.

One informer per kind is the intended use; its metrics are labelled by kind only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar, cast

import aiohttp
from kubernetes_asyncio import client

from nodewarden.api.base import GROUP, VERSION
from nodewarden.api.kinds import Kind
from nodewarden.cooperate import Turns
from nodewarden.kube.backoff import Backoff
from nodewarden.kube.store import Delta, Entry, EventType, ObjectKey, Store, parse_resource_version
from nodewarden.kube.useragent import identify
from nodewarden.metrics import (
    INFORMER_ERRORS,
    INFORMER_EVENTS,
    INFORMER_HANDLER_ERRORS,
    INFORMER_LAG,
    INFORMER_LIST_PAGES,
    INFORMER_RELISTS,
    INFORMER_STORE_OBJECTS,
    INFORMER_WATCH_RESTARTS,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

Transform = Callable[[Mapping[str, Any]], T | None]
Handler = Callable[[EventType, T | None, T | None], None]

WATCH_TYPES: frozenset[str] = frozenset({"ADDED", "MODIFIED", "DELETED"})


@dataclass(frozen=True)
class InformerSettings:
    """Knobs of one informer. Defaults suit a production API server."""

    page_size: int = 500
    """Objects per LIST page."""
    watch_timeout: float = 300.0
    """Server-side `timeoutSeconds` of one watch; the watch then resumes (no relist)."""
    read_timeout: float = 90.0
    """Longest silence accepted on a watch stream. The watch cache sends a bookmark about
    every minute, so a longer silence means a dead connection."""
    request_timeout: float = 60.0
    """Whole-request timeout of one LIST page."""
    connect_timeout: float = 10.0
    backoff_initial: float = 0.5
    backoff_max: float = 30.0

    def __post_init__(self) -> None:
        checks = {
            "page_size": self.page_size >= 1,
            "watch_timeout": self.watch_timeout >= 1,
            "read_timeout": self.read_timeout > 0,
            "request_timeout": self.request_timeout > 0,
            "connect_timeout": self.connect_timeout > 0,
            "backoff_initial": 0 < self.backoff_initial <= self.backoff_max,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise ValueError(
                f"InformerSettings: invalid {', '.join(bad)} ({self}); sizes and timeouts "
                "must be positive (watch_timeout >= 1 s) and backoff_initial <= backoff_max"
            )


class ApiStatusError(Exception):
    """The API server answered a list or watch with a non-2xx status (or an ERROR event)."""

    def __init__(self, status: int, message: str, retry_after: float | None = None) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.retry_after = retry_after


class Expired(Exception):
    """410 Gone: the resourceVersion (or continue token) is too old; only a relist helps."""

    def __init__(self, cause: str, message: str) -> None:
        super().__init__(message)
        self.cause = cause


@dataclass(frozen=True)
class _Decoded(Generic[T]):
    key: ObjectKey
    rv: int
    model: T | None


class Informer(Generic[T]):
    """LIST+WATCH of `kind` in `namespace` (None: all namespaces) into `self.store`."""

    def __init__(
        self,
        api: client.ApiClient,
        kind: Kind,
        transform: Transform[T],
        *,
        namespace: str | None = None,
        settings: InformerSettings | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.kind = kind
        self.namespace = namespace
        self.transform = transform
        self.settings = settings or InformerSettings()
        self.store: Store[T] = Store()
        self.synced = asyncio.Event()
        self._custom = client.CustomObjectsApi(identify(api))
        self._clock = clock
        self._handlers: list[Handler[T]] = []
        self._rv: int | None = None
        self._task: asyncio.Task[None] | None = None
        self._backoff = Backoff(self.settings.backoff_initial, self.settings.backoff_max)
        label = kind.kind
        self._events = {t: INFORMER_EVENTS.labels(label, t) for t in (*WATCH_TYPES, "BOOKMARK")}
        self._size = INFORMER_STORE_OBJECTS.labels(label)
        self._lag = INFORMER_LAG.labels(label)
        self._pages = INFORMER_LIST_PAGES.labels(label)

    # --- consumer interface -------------------------------------------------------------

    @property
    def resource_version(self) -> str | None:
        """The resourceVersion a resumed watch starts from (advanced by events and bookmarks)."""
        return None if self._rv is None else str(self._rv)

    def add_handler(self, handler: Handler[T]) -> None:
        """Call `handler(event_type, old, new)` after each change of the store, in order."""
        self._handlers.append(handler)

    def start(self) -> asyncio.Task[None]:
        if self._task is not None and not self._task.done():
            raise RuntimeError(f"informer for {self.kind.kind} already started")
        self._task = asyncio.create_task(self._run(), name=f"informer-{self.kind.plural}")
        return self._task

    async def stop(self) -> None:
        """Cancel the loop and wait until it has closed its connection."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def wait_synced(self) -> None:
        """Return once the first full LIST is in the store (bound it with asyncio.timeout).

        RuntimeError if the informer is not running or stops before that."""
        if self._task is None:
            raise RuntimeError(f"informer for {self.kind.kind} not started")
        waiter = asyncio.ensure_future(self.synced.wait())
        try:
            await asyncio.wait({waiter, self._task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
        if not self.synced.is_set():
            raise RuntimeError(f"informer for {self.kind.kind} stopped before its first sync")

    def fold(self, raw: Mapping[str, Any]) -> bool:
        """Apply an object received from one of the operator's own writes.

        Applied only if newer than what the store holds (and not an object the watch has
        already seen deleted); True if that changed the store's model and handlers ran."""
        decoded = self._decode(raw)
        if decoded is None or not self._in_scope(decoded.key):
            return False
        delta = self.store.fold(decoded.key, decoded.rv, decoded.model, self._rv)
        if delta is None:
            return False
        self._dispatch([delta])
        return True

    # --- the loop -----------------------------------------------------------------------

    async def _run(self) -> None:
        relist: str | None = "initial"
        expired_in_a_row = 0
        while True:
            operation = "list"
            try:
                if relist:
                    if expired_in_a_row > 1:
                        await self._pause("the server keeps answering 410 Gone")
                    await self._list(relist)
                    relist = None
                    self._backoff.reset()
                operation = "watch"
                cause, healthy = await self._watch_once()
                INFORMER_WATCH_RESTARTS.labels(self.kind.kind, cause).inc()
                if healthy:
                    expired_in_a_row = 0
                    self._backoff.reset()
                    continue
                await self._pause(f"watch ended early ({cause}) without any event")
            except Expired as exc:
                log.info("%s informer: %s; relisting", self.kind.kind, exc)
                if operation == "watch":
                    INFORMER_WATCH_RESTARTS.labels(self.kind.kind, "expired").inc()
                expired_in_a_row += 1
                relist = exc.cause
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the feed must never stop: classify, back off, retry
                klass = _classify(exc)
                INFORMER_ERRORS.labels(self.kind.kind, operation, klass).inc()
                if operation == "watch":
                    INFORMER_WATCH_RESTARTS.labels(self.kind.kind, "error").inc()
                if klass == "internal":
                    log.exception("%s informer: unexpected error in %s", self.kind.kind, operation)
                retry_after = exc.retry_after if isinstance(exc, ApiStatusError) else None
                await self._pause(f"{operation} failed: {exc}", retry_after)

    async def _pause(self, why: str, retry_after: float | None = None) -> None:
        delay = self._backoff.next_delay()
        if retry_after is not None:
            delay = max(delay, min(retry_after, self.settings.backoff_max))
        log.warning(
            "%s informer: %s; retrying in %.1fs (failure %d)",
            self.kind.kind,
            why,
            delay,
            self._backoff.failures,
        )
        await asyncio.sleep(delay)

    async def _list(self, cause: str) -> None:
        timeout = aiohttp.ClientTimeout(
            total=self.settings.request_timeout, sock_connect=self.settings.connect_timeout
        )
        snapshot: dict[ObjectKey, Entry[T]] = {}
        token: str | None = None
        while True:
            resp = await self._request(
                limit=self.settings.page_size, _continue=token, _request_timeout=timeout
            )
            try:
                body = json.loads(await self._body(resp, continuing=token is not None))
            finally:
                resp.release()
            self._pages.inc()
            for raw in body.get("items") or ():
                self._take_into(snapshot, raw)
            meta = body.get("metadata") or {}
            token = meta.get("continue") or None
            if token is None:
                list_rv = parse_resource_version(meta.get("resourceVersion"))
                break
        deltas = self.store.replace(snapshot, list_rv)
        self._rv = list_rv
        INFORMER_RELISTS.labels(self.kind.kind, cause).inc()
        self._dispatch(deltas)
        self.synced.set()
        log.info(
            "%s informer: listed %d objects at resourceVersion %d (%s)",
            self.kind.kind,
            len(snapshot),
            list_rv,
            cause,
        )

    def _take_into(self, snapshot: dict[ObjectKey, Entry[T]], raw: Mapping[str, Any]) -> None:
        decoded = self._decode(raw)
        if decoded is None:  # the transform failed: keep what the store holds, if anything
            key = _key_of(raw)
            held = self.store.entry(key) if key is not None else None
            if key is not None and held is not None:
                snapshot[key] = held
            return
        if decoded.model is not None:
            snapshot[decoded.key] = Entry(decoded.rv, decoded.model)

    async def _watch_once(self) -> tuple[str, bool]:
        """One watch request; returns why it ended and whether that was healthy.

        Healthy: it delivered something, ran for at least half its timeout, or went
        silent for `read_timeout` (restart at once). An early end with nothing delivered
        backs off, so a server that closes every watch at once is not hammered."""
        if self._rv is None:
            raise RuntimeError("watch before list")
        s = self.settings
        timeout = aiohttp.ClientTimeout(
            total=s.watch_timeout + s.read_timeout,
            sock_connect=s.connect_timeout,
            sock_read=s.read_timeout,
        )
        resp = await self._request(
            watch=True,
            allow_watch_bookmarks=True,
            resource_version=str(self._rv),
            timeout_seconds=max(1, int(s.watch_timeout)),
            _request_timeout=timeout,
        )
        started = time.monotonic()
        productive = False
        clean = False
        try:
            if resp.status != 200:
                await self._body(resp, continuing=False)  # raises
            turns = Turns()  # buffered lines are read without a suspension
            while True:
                await turns.share()
                try:
                    line = await resp.content.readline()
                except TimeoutError:
                    return "read_timeout", True
                if not line:
                    clean = True
                    lived = time.monotonic() - started
                    return "closed", productive or lived >= s.watch_timeout / 2
                if line.strip():
                    self._on_line(line)
                    productive = True
        finally:
            if clean:
                resp.release()
            else:
                resp.close()

    async def _request(self, **kwargs: Any) -> aiohttp.ClientResponse:
        kwargs["_preload_content"] = False
        if self.namespace is None:
            resp = await self._custom.list_cluster_custom_object(
                GROUP, VERSION, self.kind.plural, **kwargs
            )
        else:
            resp = await self._custom.list_namespaced_custom_object(
                GROUP, VERSION, self.namespace, self.kind.plural, **kwargs
            )
        return cast(aiohttp.ClientResponse, resp)

    async def _body(self, resp: aiohttp.ClientResponse, *, continuing: bool) -> bytes:
        """The response body if 2xx; otherwise the status as Expired or ApiStatusError."""
        data = await resp.read()
        if 200 <= resp.status < 300:
            return data
        message = _status_message(data) or resp.reason or ""
        if resp.status == 410:
            raise Expired("continue_expired" if continuing else "expired", message)
        retry_after = _float_or_none(resp.headers.get("Retry-After"))
        raise ApiStatusError(resp.status, message, retry_after)

    def _on_line(self, line: bytes) -> None:
        event = json.loads(line)
        etype = event.get("type")
        obj = event.get("object") or {}
        counter = self._events.get(etype)
        if counter is None:
            INFORMER_EVENTS.labels(self.kind.kind, str(etype)).inc()
        else:
            counter.inc()
        if etype == "BOOKMARK":
            self._advance(parse_resource_version(obj.get("metadata", {}).get("resourceVersion")))
            return
        if etype == "ERROR":
            code = int(obj.get("code") or 0)
            message = str(obj.get("message") or obj.get("reason") or "watch error")
            if code == 410:
                raise Expired("expired", message)
            raise ApiStatusError(code, message)
        if etype not in WATCH_TYPES:
            log.warning("%s informer: ignoring watch event of type %r", self.kind.kind, etype)
            return
        delta = self._apply(etype, obj)
        if delta is not None:
            self._dispatch([delta])

    def _apply(self, etype: str, obj: Mapping[str, Any]) -> Delta[T] | None:
        if etype == "DELETED":
            key = _key_of(obj)
            rv = parse_resource_version(obj.get("metadata", {}).get("resourceVersion"))
            self._advance(rv)
            return None if key is None else self.store.delete(key, rv)
        self._observe_lag(obj)
        decoded = self._decode(obj)
        if decoded is None:  # transform failed: keep the old state, still move on
            self._advance(parse_resource_version(obj.get("metadata", {}).get("resourceVersion")))
            return None
        self._advance(decoded.rv)
        if decoded.model is None:
            return self.store.delete(decoded.key, decoded.rv)
        return self.store.upsert(decoded.key, decoded.rv, decoded.model)

    def _advance(self, rv: int) -> None:
        if self._rv is None or rv > self._rv:
            self._rv = rv

    def _decode(self, raw: Mapping[str, Any]) -> _Decoded[T] | None:
        """Key, resourceVersion and compact model of a raw object; None if that failed."""
        try:
            key = _key_of(raw)
            if key is None:
                raise ValueError("object without metadata.name")
            rv = parse_resource_version(raw.get("metadata", {}).get("resourceVersion"))
            model = self.transform(raw)
        except Exception:
            INFORMER_HANDLER_ERRORS.labels(self.kind.kind, "transform").inc()
            meta = raw.get("metadata") or {}
            log.exception(
                "%s informer: cannot take %s/%s; keeping the last good state",
                self.kind.kind,
                meta.get("namespace"),
                meta.get("name"),
            )
            return None
        return _Decoded(key, rv, model)

    def _in_scope(self, key: ObjectKey) -> bool:
        return self.namespace is None or key.namespace == self.namespace

    def _observe_lag(self, obj: Mapping[str, Any]) -> None:
        written = _last_write_time(obj)
        if written is not None:
            self._lag.observe(max(0.0, self._clock() - written))

    def _dispatch(self, deltas: list[Delta[T]]) -> None:
        for delta in deltas:
            for handler in self._handlers:
                try:
                    handler(delta.type, delta.old, delta.new)
                except Exception:
                    INFORMER_HANDLER_ERRORS.labels(self.kind.kind, "handler").inc()
                    log.exception("%s informer: handler %r failed", self.kind.kind, handler)
        self._size.set(len(self.store))


def _key_of(raw: Mapping[str, Any]) -> ObjectKey | None:
    meta = raw.get("metadata") or {}
    name = meta.get("name")
    if not isinstance(name, str):
        return None
    return ObjectKey(str(meta.get("namespace") or ""), name)


def _last_write_time(obj: Mapping[str, Any]) -> float | None:
    """Newest `metadata.managedFields[].time` (RFC 3339, whole seconds) as epoch seconds."""
    times = [
        entry["time"]
        for entry in obj.get("metadata", {}).get("managedFields") or ()
        if isinstance(entry, Mapping) and isinstance(entry.get("time"), str)
    ]
    if not times:
        return None
    try:
        return datetime.fromisoformat(max(times)).timestamp()
    except ValueError:
        return None


def _status_message(data: bytes) -> str:
    try:
        status = json.loads(data)
    except ValueError:
        return data[:200].decode(errors="replace")
    if isinstance(status, dict):
        return str(status.get("message") or status.get("reason") or "")
    return ""


def _float_or_none(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _classify(exc: Exception) -> str:
    if isinstance(exc, ApiStatusError):
        return f"http_{exc.status}"
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, aiohttp.ClientConnectionError | ConnectionError):
        return "connection"
    if isinstance(exc, aiohttp.ClientError | ValueError):
        return "protocol"
    return "internal"
