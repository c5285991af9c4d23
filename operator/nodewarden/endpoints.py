"""The operator's HTTP endpoint: /healthz, /readyz, /metrics (and routes added by later components).

One aiohttp server per process. /healthz answers while the event loop runs; /readyz is
200 once this replica is either acting (leader, handlers started) or standing by
cleanly, and says which in its body.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import SecretStr

from nodewarden.metrics import REGISTRY

Role = Literal["starting", "standby", "leader", "stopping"]


@dataclass
class Health:
    role: Role = "starting"
    handlers_ready: bool = False
    extra: dict[str, str] = field(default_factory=dict)
    status_provider: Callable[[], dict[str, Any]] | None = None
    status_token: SecretStr | None = None

    @property
    def ready(self) -> bool:
        return self.role == "standby" or (self.role == "leader" and self.handlers_ready)


def build_app(health: Health) -> web.Application:
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

    async def status(request: web.Request) -> web.Response:
        """Management status: live view of instances and containers (token required)."""
        if health.status_token is None:
            return web.json_response(
                {"error": "the status endpoint is disabled (management.token_secret_name unset)"},
                status=404,
            )
        given = request.headers.get("Authorization", "")
        expected = "Bearer " + health.status_token.get_secret_value()
        if not hmac.compare_digest(given.encode(), expected.encode()):
            return web.json_response(
                {"error": "missing or wrong token"},
                status=401,
                headers={"WWW-Authenticate": "Bearer"},
            )
        if health.status_provider is None or health.role != "leader":
            return web.json_response(
                {"error": f"this replica is {health.role}; ask the leader"}, status=503
            )
        return web.json_response(health.status_provider())

    app = web.Application()
    app.router.add_get("/api/v1/status", status)
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
