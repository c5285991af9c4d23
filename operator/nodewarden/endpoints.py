"""The operator's HTTP endpoints: the status API, and /healthz /readyz /metrics on their own port.

Two listeners per process when `http.metrics_port` is set (the Helm chart sets it): the
status API (`GET /api/v1/status`, bearer token) on `http.port`, and the probes and
metrics on `http.metrics_port`, so a Service, a scraper or a NetworkPolicy can treat them
apart. Without `metrics_port` everything is served on `http.port`.

/healthz answers while the event loop runs; /readyz is 200 once this replica is either
acting (leader, handlers started) or standing by cleanly, and says which in its body.

The status API is answered correctly by every replica. The leader answers from its live
snapshot. A standby checks the token itself, then relays the request to the leader's
status endpoint, which the leader publishes in annotations of its Lease
(`nodewarden.io/status-url`) together with an HMAC of (holder identity, URL) keyed by
the status token (`nodewarden.io/status-url-signature`): a standby sends the caller's
token only to a URL signed by someone who holds that token, so whoever can edit the
Lease but cannot read the Secret cannot redirect the token to themselves. A relayed
request is never relayed again. The token is never logged.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import SecretStr

from nodewarden.metrics import REGISTRY

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

TokenLoader = Callable[[], Awaitable[SecretStr]]
LeaseHolder = tuple[str | None, dict[str, str]]
"""(identity of the live holder or None, the Lease's annotations)."""
HolderLookup = Callable[[], Awaitable[LeaseHolder]]


def sign_status_url(token: SecretStr, identity: str, url: str) -> str:
    """HMAC-SHA256 of identity and URL keyed by the status token (hex)."""
    message = f"{identity}\n{url}".encode()
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
    """Reads the status token on first use (standbys need it to check callers)."""
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

    async def token(self) -> SecretStr | None:
        if self.status_token is None and self.token_loader is not None:
            self.status_token = await self.token_loader()
        return self.status_token


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
    headers = {
        "Authorization": request.headers.get("Authorization", ""),
        RELAYED_BY: health.identity or "standby",
    }
    timeout = aiohttp.ClientTimeout(total=RELAY_TIMEOUT)
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.get(url.rstrip("/") + request.rel_url.raw_path, headers=headers) as answer,
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


def build_app(health: Health, routes: Literal["all", "api", "ops"] = "all") -> web.Application:
    """The status API ("api"), the probes and metrics ("ops"), or both ("all")."""

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        body = json.dumps(
            {"role": health.role, "handlersReady": health.handlers_ready, **health.extra}
        )
        return web.Response(
            text=body + "\n", status=200 if health.ready else 503, content_type="application/json"
        )

    async def metrics(_: web.Request) -> web.Response:
        data = generate_latest(REGISTRY)
        return web.Response(body=data, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def admit(request: web.Request) -> web.Response | None:
        """None when the caller may be answered here (the leader, right token); else the
        answer: disabled, token unreadable or wrong, or the leader's (relayed)."""
        if health.status_token is None and health.token_loader is None:
            return _error(404, "the status API is disabled (management.token_secret_name unset)")
        try:
            token = await health.token()
        except Exception as exc:  # the Secret could not be read: say so, never the value
            log.warning("status token unavailable: %s", type(exc).__name__)
            return _error(503, "the status token Secret cannot be read; check the operator logs")
        assert token is not None
        given = request.headers.get("Authorization", "")
        expected = "Bearer " + token.get_secret_value()
        if not hmac.compare_digest(given.encode(), expected.encode()):
            return _error(401, "missing or wrong token", **{"WWW-Authenticate": "Bearer"})
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
    if routes in ("all", "ops"):
        app.router.add_get("/healthz", healthz)
        app.router.add_get("/readyz", readyz)
        app.router.add_get("/metrics", metrics)
    return app


async def start(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Start serving; returns the runner (for cleanup) and the bound port."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    server: Any = site._server
    bound = port
    sockets = getattr(server, "sockets", None)
    if sockets:
        bound = int(sockets[0].getsockname()[1])
    return runner, bound


@dataclass
class Served:
    """The running listeners of one process."""

    runners: list[web.AppRunner]
    port: int
    metrics_port: int

    async def cleanup(self) -> None:
        for runner in self.runners:
            await runner.cleanup()


async def serve(health: Health, host: str, port: int, metrics_port: int | None) -> Served:
    """Serve the status API on `port` and the probes + metrics on `metrics_port`
    (all on `port` when `metrics_port` is None); records the advertised status URL."""
    if metrics_port is None or (metrics_port == port and port != 0):
        runner, bound = await start(build_app(health, "all"), host, port)
        served = Served([runner], bound, bound)
    else:
        api_runner, bound = await start(build_app(health, "api"), host, port)
        ops_runner, ops_bound = await start(build_app(health, "ops"), host, metrics_port)
        served = Served([api_runner, ops_runner], bound, ops_bound)
    health.status_url = advertised_status_url(served.port)
    return served
