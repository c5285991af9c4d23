"""HTTP listeners that a slow or hostile client cannot exhaust: deadlines and a connection cap.

aiohttp serves the requests; this module owns the connections underneath. Each listener
(status API, metrics, probes) has its own `ConnectionGuard`:

- **header deadline**: a connection whose request line and headers have not all arrived
  `header_timeout` seconds after it was accepted is dropped (a client that sends one
  header line and then nothing holds a slot for at most that long);
- **request deadline**: a connection is dropped `request_timeout` seconds after it was
  accepted, whatever it is doing (a trickled body, a response read slowly); every
  response closes its connection (`Connection: close`), so a connection serves one
  request and an idle keep-alive never holds a slot;
- **header size**: more than `max_header_bytes` before the blank line ends the headers is
  dropped at once;
- **connection cap**: at most `max_connections` at once, so the descriptors a listener
  holds are bounded. Below the cap every connection is accepted and a stalled one costs a
  slot for `header_timeout` only, so a flood of fewer half-open connections than the cap
  -- however fast they are re-opened -- never keeps a prompt client (a kubelet probe, a
  scraper) from being served. At the cap, a new connection takes the slot of the oldest
  one still waiting for its headers, if that one has had `EVICT_AFTER` to send them (a
  connection accepted in the same burst has not even been read yet); otherwise the new
  one is closed at once. Beyond the cap, service is best effort: size the cap above the
  number of clients you expect at once.

The probes get a listener of their own (`http.probe_port`), so a flood of the metrics
port cannot fail them either.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from nodewarden.metrics import HTTP_CONNECTIONS, HTTP_CONNECTIONS_DROPPED

log = logging.getLogger(__name__)

_END_OF_HEADERS = b"\r\n\r\n"
EVICT_AFTER = 0.1
"""Seconds a waiting connection is protected from eviction (it has not been read yet)."""


@dataclass(frozen=True, slots=True)
class ListenerLimits:
    header_timeout: float = 5.0
    request_timeout: float = 30.0
    max_connections: int = 512
    max_header_bytes: int = 16384


class _Guarded(asyncio.Protocol):
    """One connection: aiohttp's protocol inside, the deadlines and the cap around it."""

    def __init__(self, inner: Any, guard: ConnectionGuard) -> None:
        self.inner = inner
        self.guard = guard
        self.transport: asyncio.Transport | None = None
        self.header_bytes = 0
        self.tail = b""
        self.headers_done = False
        self.timers: list[asyncio.TimerHandle] = []
        self.accepted_at = 0.0

    # -- asyncio.Protocol --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        loop = asyncio.get_running_loop()
        self.accepted_at = loop.time()
        if not self.guard.admit(self, self.accepted_at):
            HTTP_CONNECTIONS_DROPPED.labels(self.guard.name, "cap").inc()
            transport.abort()
            return
        limits = self.guard.limits
        self.timers = [
            loop.call_later(limits.header_timeout, self._expire, "header_deadline", True),
            loop.call_later(limits.request_timeout, self._expire, "request_deadline", False),
        ]
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if not self.headers_done:
            self.header_bytes += len(data)
            seen = self.tail + data
            if _END_OF_HEADERS in seen:
                self.headers_done = True
                self.guard.started(self)
                self.timers[0].cancel()
            elif self.header_bytes > self.guard.limits.max_header_bytes:
                self._expire("header_size", True)
                return
            else:
                self.tail = seen[-3:]
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        result: bool | None = self.inner.eof_received()
        return result

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in self.timers:
            timer.cancel()
        self.guard.release(self)
        if self.timers:  # aiohttp saw connection_made: it must see the end too
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    # -- the guard's side ------------------------------------------------------------------

    def _expire(self, why: str, only_before_headers: bool) -> None:
        if only_before_headers and self.headers_done:
            return
        self.evict(why)

    def evict(self, why: str) -> None:
        HTTP_CONNECTIONS_DROPPED.labels(self.guard.name, why).inc()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.abort()


@dataclass
class ConnectionGuard:
    """The connections of one listener (see the module docstring)."""

    name: str
    limits: ListenerLimits
    waiting: OrderedDict[int, _Guarded] = field(default_factory=OrderedDict)
    """Accepted, headers not complete yet (oldest first)."""
    serving: set[int] = field(default_factory=set)

    @property
    def open(self) -> int:
        return len(self.waiting) + len(self.serving)

    def admit(self, conn: _Guarded, now: float) -> bool:
        if self.open >= self.limits.max_connections:
            oldest = next(iter(self.waiting.values()), None)
            if oldest is None or now - oldest.accepted_at < EVICT_AFTER:
                return False
            del self.waiting[id(oldest)]
            oldest.evict("evicted")
        self.waiting[id(conn)] = conn
        HTTP_CONNECTIONS.labels(self.name).set(self.open)
        return True

    def started(self, conn: _Guarded) -> None:
        if self.waiting.pop(id(conn), None) is not None:
            self.serving.add(id(conn))

    def release(self, conn: _Guarded) -> None:
        self.waiting.pop(id(conn), None)
        self.serving.discard(id(conn))
        HTTP_CONNECTIONS.labels(self.name).set(self.open)


class GuardedSite(web.TCPSite):
    """`web.TCPSite` whose connections pass through a `ConnectionGuard`."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, guard: ConnectionGuard):
        super().__init__(runner, host, port, backlog=max(128, guard.limits.max_connections))
        self.guard = guard

    async def start(self) -> None:
        self._runner._reg_site(self)
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None
        guard = self.guard
        self._server = await loop.create_server(
            lambda: _Guarded(server(), guard), self._host, self._port, backlog=self._backlog
        )
        sockets = self._server.sockets
        self._bound_port = sockets[0].getsockname()[1] if sockets else self._port


@web.middleware
async def close_after_response(request: web.Request, handler: Any) -> web.StreamResponse:
    """One request per connection: a kept-alive idle connection never holds a slot."""
    response: web.StreamResponse = await handler(request)
    response.force_close()
    return response


async def start_guarded(
    app: web.Application, name: str, host: str, port: int, limits: ListenerLimits
) -> tuple[web.AppRunner, int]:
    """Serve `app` on host:port behind a guard; the runner (for cleanup) and the bound port."""
    app.middlewares.append(close_after_response)
    runner = web.AppRunner(app, access_log=None, keepalive_timeout=limits.header_timeout)
    await runner.setup()
    site = GuardedSite(runner, host, port, ConnectionGuard(name, limits))
    await site.start()
    return runner, site.port
