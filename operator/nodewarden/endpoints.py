"""The operator's HTTP endpoints: the status API, /metrics and the probes, on listeners of their own.

Up to three listeners per process (the Helm chart sets all three ports): the status API
(`GET /api/v1/status`, bearer token) on `http.port`, /metrics on `http.metrics_port`, and
/healthz /readyz on `http.probe_port`, so a Service, a scraper, a NetworkPolicy -- and a
flood of connections -- treat them apart. Without `probe_port` the probes are served with
/metrics; without `metrics_port` everything is served on `http.port`. Every listener
resists slow clients (`nodewarden.listener`: header and request deadlines, a connection
cap that evicts the oldest stalled connection). /metrics can require a bearer token
(`http.metrics_auth: token`, the status token): a scraper then sends it like any caller.

/healthz answers while the event loop runs; /readyz is 200 once this replica is either
acting (leader, handlers started) or standing by cleanly, and says which in its body.

The status API is answered correctly by every replica. The leader answers from its live
snapshot. A standby checks the token itself, then relays the request to the leader's
status endpoint, which the leader publishes in annotations of its Lease
(`nodewarden.io/status-url`) together with an HMAC of (holder identity, URL) keyed by
the status token (`nodewarden.io/status-url-signature`): a standby relays only to a URL
signed by someone who holds that token, so whoever can edit the Lease but cannot read
the Secret cannot redirect a request to themselves. The relay carries **no token**: the
standby signs the request (HMAC of its identity, the path and the time, keyed by the
token) and the leader accepts that signature for `RELAY_WINDOW` seconds, so the token
never crosses the network between replicas in plain HTTP; a recorded relay can only be
replayed, within the window, for the same read. A relayed request is never relayed again.
The token is never logged, and it is read again every `http.token_refresh` seconds (and
at once, at most every few seconds, when a caller's token does not match), so a rotated
token works without a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import ipaddress
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import SecretStr

from nodewarden.listener import ListenerLimits, start_guarded
from nodewarden.metrics import REGISTRY
from nodewarden.scraped import scraping

log = logging.getLogger(__name__)

Role = Literal["starting", "standby", "leader", "stopping"]

STATUS_PATH = "/api/v1/status"
EXPLAIN_PATH = "/api/v1/explain/workernode/{name}"
STATUS_URL_ANNOTATION = "nodewarden.io/status-url"
STATUS_SIGNATURE_ANNOTATION = "nodewarden.io/status-url-signature"
POD_IP_ENV = "NODEWARDEN_POD_IP"
RELAYED_BY = "X-Nodewarden-Relayed-By"
SERVED_BY = "X-Nodewarden-Served-By"
RELAY_TIMEOUT = 10.0
RELAY_TIME = "X-Nodewarden-Relay-Time"
RELAY_SIGNATURE = "X-Nodewarden-Relay-Signature"
RELAY_WINDOW = 30.0
"""Seconds a standby's relay signature is accepted (clocks of replicas agree to a second
or so: they run in one cluster with NTP)."""
MISMATCH_REREAD = 5.0
"""A caller's token that does not match makes the Secret be read again, at most this often."""

TokenLoader = Callable[[], Awaitable[SecretStr]]
LeaseHolder = tuple[str | None, dict[str, str]]
"""(identity of the live holder or None, the Lease's annotations)."""
HolderLookup = Callable[[], Awaitable[LeaseHolder]]


def sign_status_url(token: SecretStr, identity: str, url: str) -> str:
    """HMAC-SHA256 of identity and URL keyed by the status token (hex)."""
    message = f"{identity}\n{url}".encode()
    return hmac.new(token.get_secret_value().encode(), message, hashlib.sha256).hexdigest()


def sign_relay(token: SecretStr, identity: str, path: str, at: float) -> str:
    """HMAC-SHA256 of a relayed request (identity, path, unix time) keyed by the token."""
    message = f"relay\n{identity}\n{path}\n{at:.0f}".encode()
    return hmac.new(token.get_secret_value().encode(), message, hashlib.sha256).hexdigest()


def advertised_status_url(port: int, pod_ip: str | None = None) -> str | None:
    """http://<pod IP>:<port>, from $NODEWARDEN_POD_IP (the chart sets it); None if unknown."""
    ip_text = pod_ip if pod_ip is not None else os.environ.get(POD_IP_ENV, "")
    try:
        ip = ipaddress.ip_address(ip_text.strip())
    except ValueError:
        return None
    host = f"[{ip}]" if ip.version == 6 else str(ip)
    return f"http://{host}:{port}"


def _plain_http_url(url: str) -> bool:
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.port is None or parts.path not in ("", "/"):
        return False
    try:
        ipaddress.ip_address(parts.hostname or "")
    except ValueError:
        return False
    return not (parts.query or parts.fragment or parts.username)


@dataclass
class Health:
    role: Role = "starting"
    handlers_ready: bool = False
    extra: dict[str, str] = field(default_factory=dict)
    status_provider: Callable[[], dict[str, Any]] | None = None
    explain_provider: Callable[[str], dict[str, Any] | None] | None = None
    """The power controller's live explain document of one WorkerNode (None: unknown)."""
    status_token: SecretStr | None = None
    token_loader: TokenLoader | None = None
    """Reads the status token (standbys need it to check callers and sign relays)."""
    token_refresh: float = 30.0
    """Seconds after which the token is read again (a rotated Secret takes effect)."""
    token_read_at: float | None = None
    """When (monotonic) the token was last read."""
    metrics_auth: Literal["none", "token"] = "none"
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    identity: str = ""
    status_url: str | None = None
    """Where this replica's status API can be reached by the other replicas."""
    leader_lookup: HolderLookup | None = None
    """Reads the Lease: the live holder and its annotations (standbys relay there)."""

    @property
    def ready(self) -> bool:
        return self.role == "standby" or (self.role == "leader" and self.handlers_ready)

    def lease_annotations(self) -> dict[str, str]:
        """What the leader publishes on its Lease: its status URL, signed (once it has both)."""
        if self.status_url is None or self.status_token is None:
            return {}
        signature = sign_status_url(self.status_token, self.identity, self.status_url)
        return {STATUS_URL_ANNOTATION: self.status_url, STATUS_SIGNATURE_ANNOTATION: signature}

    async def token(self, *, mismatch: bool = False) -> SecretStr | None:
        """The status token, read again when `token_refresh` passed (or, after a caller's
        token did not match, when the last read is older than `MISMATCH_REREAD`)."""
        if self.token_loader is None:
            return self.status_token
        age = None if self.token_read_at is None else self.clock() - self.token_read_at
        due = age is None or age >= self.token_refresh or (mismatch and age >= MISMATCH_REREAD)
        if self.status_token is None or due:
            token = await self.token_loader()
            self.token_read_at = self.clock()
            if self.status_token is not None and token != self.status_token:
                log.info("the status token changed; the new one is in use")
            self.status_token = token
        return self.status_token

    async def refresh_loop(self) -> None:
        """Read the token every `token_refresh` seconds, so the leader signs its status URL
        with the current one even while nobody calls (errors: logged, retried)."""
        while True:
            await asyncio.sleep(self.token_refresh)
            try:
                await self.token()
            except Exception as exc:  # never the value: only what failed
                log.warning("status token could not be read again: %s", type(exc).__name__)

    async def accepts(self, given: str, *, relay: Mapping[str, str] | None = None) -> bool:
        """Whether an `Authorization` header value (or a standby's relay signature) is
        the current token's; a mismatch reads the Secret again once before saying no."""
        for attempt in (False, True):
            token = await self.token(mismatch=attempt)
            if token is None:
                return False
            if relay is not None and _relay_valid(token, relay, self.wall()):
                return True
            expected = "Bearer " + token.get_secret_value()
            if relay is None and hmac.compare_digest(given.encode(), expected.encode()):
                return True
            if self.token_loader is None:
                return False
        return False


def _relay_valid(token: SecretStr, relay: Mapping[str, str], now: float) -> bool:
    try:
        at = float(relay.get("at", ""))
    except ValueError:
        return False
    if abs(now - at) > RELAY_WINDOW:
        return False
    expected = sign_relay(token, relay.get("by", ""), relay.get("path", ""), at)
    return hmac.compare_digest(relay.get("signature", "").encode(), expected.encode())


def _error(status: int, message: str, **headers: str) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers or None)


async def _relay(health: Health, request: web.Request) -> web.Response:
    """Standby: forward an authenticated status call to the leader's signed URL."""
    if request.headers.get(RELAYED_BY):
        return _error(503, f"this replica is {health.role}; leadership is changing, retry")
    if health.leader_lookup is None or health.status_token is None:
        return _error(503, f"this replica is {health.role}; ask the leader")
    holder, annotations = await health.leader_lookup()
    url = annotations.get(STATUS_URL_ANNOTATION, "")
    signature = annotations.get(STATUS_SIGNATURE_ANNOTATION, "")
    if holder is None:
        return _error(503, "no replica holds the lease right now; retry shortly")
    expected = sign_status_url(health.status_token, holder, url)
    if not url or not _plain_http_url(url) or not hmac.compare_digest(signature, expected):
        return _error(503, "the leader has not published a verifiable status endpoint yet")
    identity = health.identity or "standby"
    path = request.rel_url.raw_path
    at = float(round(health.wall()))
    headers = {  # no token: a signature only this request (for RELAY_WINDOW) satisfies
        RELAYED_BY: identity,
        RELAY_TIME: f"{at:.0f}",
        RELAY_SIGNATURE: sign_relay(health.status_token, identity, path, at),
    }
    timeout = aiohttp.ClientTimeout(total=RELAY_TIMEOUT)
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.get(url.rstrip("/") + path, headers=headers) as answer,
        ):
            body = await answer.read()
            served_by = answer.headers.get(SERVED_BY, holder)
            return web.Response(
                body=body,
                status=answer.status,
                content_type=answer.content_type,
                headers={SERVED_BY: served_by, RELAYED_BY: health.identity},
            )
    except (aiohttp.ClientError, TimeoutError) as exc:
        log.warning("status relay to the leader failed: %s", type(exc).__name__)
        return _error(502, "the leader's status endpoint did not answer; retry")


Routes = Literal["all", "api", "ops", "metrics", "probes"]


def build_app(health: Health, routes: Routes = "all") -> web.Application:
    """The status API ("api"), /metrics ("metrics"), the probes ("probes"), /metrics and
    the probes ("ops"), or everything ("all")."""

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        body = json.dumps(
            {"role": health.role, "handlersReady": health.handlers_ready, **health.extra}
        )
        return web.Response(
            text=body + "\n", status=200 if health.ready else 503, content_type="application/json"
        )

    async def metrics(request: web.Request) -> web.Response:
        if health.metrics_auth == "token":
            refused = await authenticate(request)
            if refused is not None:
                return refused
        scraping()  # gauges kept current per scrape, not per round (`scraped.before_scrape`)
        data = generate_latest(REGISTRY)
        return web.Response(body=data, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def authenticate(request: web.Request, relay_ok: bool = False) -> web.Response | None:
        """None when the caller holds the token (or, `relay_ok`, is a standby's signed
        relay); else the answer: disabled, token unreadable, or wrong."""
        if health.status_token is None and health.token_loader is None:
            return _error(404, "the status API is disabled (management.token_secret_name unset)")
        relay = None
        if relay_ok and request.headers.get(RELAY_SIGNATURE):
            relay = {
                "by": request.headers.get(RELAYED_BY, ""),
                "at": request.headers.get(RELAY_TIME, ""),
                "signature": request.headers.get(RELAY_SIGNATURE, ""),
                "path": request.rel_url.raw_path,
            }
        try:
            accepted = await health.accepts(request.headers.get("Authorization", ""), relay=relay)
        except Exception as exc:  # the Secret could not be read: say so, never the value
            log.warning("status token unavailable: %s", type(exc).__name__)
            return _error(503, "the status token Secret cannot be read; check the operator logs")
        if not accepted:
            return _error(401, "missing or wrong token", **{"WWW-Authenticate": "Bearer"})
        return None

    async def admit(request: web.Request) -> web.Response | None:
        """None when the caller may be answered here (the leader, right token or a signed
        relay); else the answer: disabled, refused, or the leader's (relayed)."""
        refused = await authenticate(request, relay_ok=True)
        if refused is not None:
            return refused
        if health.role != "leader":
            return await _relay(health, request)
        return None

    def served_by() -> dict[str, str] | None:
        return {SERVED_BY: health.identity} if health.identity else None

    async def status(request: web.Request) -> web.Response:
        """Management status: live view of instances and containers (token required)."""
        refused = await admit(request)
        if refused is not None:
            return refused
        if health.status_provider is None:
            return _error(503, "this replica leads but runs no dispatcher (dispatch disabled)")
        return web.json_response(health.status_provider(), headers=served_by())

    async def explain(request: web.Request) -> web.Response:
        """The power controller's live view of one WorkerNode (token required)."""
        refused = await admit(request)
        if refused is not None:
            return refused
        if health.explain_provider is None:
            return _error(503, "this replica leads but its power controller is not running yet")
        name = request.match_info["name"]
        doc = health.explain_provider(name)
        if doc is None:
            return _error(404, f"the power controller holds no WorkerNode {name!r}")
        return web.json_response(doc, headers=served_by())

    app = web.Application()
    if routes in ("all", "api"):
        app.router.add_get(STATUS_PATH, status)
        app.router.add_get(EXPLAIN_PATH, explain)
    if routes in ("all", "ops", "probes"):
        app.router.add_get("/healthz", healthz)
        app.router.add_get("/readyz", readyz)
    if routes in ("all", "ops", "metrics"):
        app.router.add_get("/metrics", metrics)
    return app


@dataclass
class Served:
    """The running listeners of one process."""

    runners: list[web.AppRunner]
    port: int
    metrics_port: int
    probe_port: int
    refresher: asyncio.Task[None] | None = None

    async def cleanup(self) -> None:
        if self.refresher is not None:
            self.refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.refresher
        for runner in self.runners:
            await runner.cleanup()


def _layout(
    port: int, metrics_port: int | None, probe_port: int | None
) -> list[tuple[Routes, int]]:
    """Which routes each listener serves (ports equal to the status port share it)."""
    if metrics_port is None or (metrics_port == port and port != 0):
        return [("all", port)]
    if probe_port is None or (probe_port == metrics_port and metrics_port != 0):
        return [("api", port), ("ops", metrics_port)]
    return [("api", port), ("metrics", metrics_port), ("probes", probe_port)]


async def serve(
    health: Health,
    host: str,
    port: int,
    metrics_port: int | None,
    probe_port: int | None = None,
    limits: ListenerLimits | None = None,
) -> Served:
    """Serve the status API on `port`, /metrics on `metrics_port` and the probes on
    `probe_port` (see `_layout` for what shares a port), each listener behind its own
    connection guard; records the advertised status URL and starts the token refresh."""
    bound: dict[Routes, int] = {}
    runners = []
    for routes, wanted in _layout(port, metrics_port, probe_port):
        runner, bound[routes] = await start_guarded(
            build_app(health, routes), routes, host, wanted, limits or ListenerLimits()
        )
        runners.append(runner)
    api = bound.get("api", bound.get("all", 0))
    ops = bound.get("metrics", bound.get("ops", api))
    served = Served(runners, api, ops, bound.get("probes", ops))
    health.status_url = advertised_status_url(served.port)
    if health.token_loader is not None:
        served.refresher = asyncio.create_task(health.refresh_loop())
    return served
