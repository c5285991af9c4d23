"""The status token in process: re-read when its Secret changes, never sent between replicas
(a standby relays with a signature instead), and optionally required by /metrics."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from pydantic import SecretStr

from nodewarden.endpoints import (
    RELAY_SIGNATURE,
    RELAY_TIME,
    RELAYED_BY,
    STATUS_SIGNATURE_ANNOTATION,
    STATUS_URL_ANNOTATION,
    Health,
    build_app,
    serve,
    sign_relay,
    sign_status_url,
)


class Secret:
    """The token Secret: its value can be rotated; counts reads."""

    def __init__(self, value: str) -> None:
        self.value = value
        self.reads = 0

    async def __call__(self) -> SecretStr:
        self.reads += 1
        return SecretStr(self.value)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def _get(url: str, token: str | None = None, **headers: str) -> tuple[int, Any]:
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    async with aiohttp.ClientSession() as session, session.get(url, headers=headers) as r:
        body = await r.text()
        return r.status, body


@pytest.fixture
async def leader() -> AsyncIterator[tuple[Health, Secret, Clock, int]]:
    secret, clock = Secret("token-one-0123456789"), Clock()
    health = Health(role="leader", handlers_ready=True, identity="pod-a", clock=clock)
    health.token_loader = secret
    health.status_provider = lambda: {"dispatcherId": "d"}
    served = await serve(health, "127.0.0.1", 0, None)
    yield health, secret, clock, served.port
    await served.cleanup()


async def test_a_rotated_token_works_at_once_and_the_old_one_stops(
    leader: tuple[Health, Secret, Clock, int],
) -> None:
    _, secret, clock, port = leader
    url = f"http://127.0.0.1:{port}/api/v1/status"
    assert (await _get(url, "token-one-0123456789"))[0] == 200
    secret.value = "token-two-9876543210"
    clock.now += 10  # a mismatch re-reads the Secret (at most every few seconds)
    assert (await _get(url, "token-two-9876543210"))[0] == 200
    assert (await _get(url, "token-one-0123456789"))[0] == 401
    reads = secret.reads
    for _ in range(5):  # a guessing caller does not turn into a Secret read per request
        assert (await _get(url, "guess"))[0] == 401
    assert secret.reads <= reads + 1


async def test_the_token_is_read_again_after_token_refresh(
    leader: tuple[Health, Secret, Clock, int],
) -> None:
    health, secret, clock, _ = leader
    assert await health.token() == SecretStr("token-one-0123456789")
    secret.value = "token-rotated-000000"
    clock.now += health.token_refresh + 1
    assert await health.token() == SecretStr("token-rotated-000000")


async def test_the_standby_relays_without_the_token(
    leader: tuple[Health, Secret, Clock, int],
) -> None:
    """What crosses the wire between replicas is a signature of this request only."""
    leader_health = leader[0]
    seen: list[dict[str, str]] = []

    @web.middleware
    async def spy(request: web.Request, handler: Any) -> web.StreamResponse:
        seen.append(dict(request.headers))
        return await handler(request)

    # the leader's app, wrapped by a spy that records what a relay sends
    app = build_app(leader_health, "api")
    app.middlewares.insert(0, spy)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    spied = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    token = SecretStr("token-one-0123456789")

    async def lookup() -> tuple[str, dict[str, str]]:
        return "pod-a", {
            STATUS_URL_ANNOTATION: spied,
            STATUS_SIGNATURE_ANNOTATION: sign_status_url(token, "pod-a", spied),
        }

    standby = Health(role="standby", identity="pod-b", leader_lookup=lookup)
    standby.token_loader = lambda: _token(token)
    served = await serve(standby, "127.0.0.1", 0, None)
    try:
        code, body = await _get(
            f"http://127.0.0.1:{served.port}/api/v1/status", "token-one-0123456789"
        )
        assert code == 200, body
        assert len(seen) == 1
        assert "Authorization" not in seen[0]
        assert token.get_secret_value() not in repr(seen[0])
        assert seen[0][RELAYED_BY] == "pod-b" and seen[0][RELAY_SIGNATURE]
    finally:
        await served.cleanup()
        await runner.cleanup()


async def _token(token: SecretStr) -> SecretStr:
    return token


async def test_a_relay_signature_is_good_for_its_path_and_window_only(
    leader: tuple[Health, Secret, Clock, int],
) -> None:
    health, _, _, port = leader
    token = SecretStr("token-one-0123456789")
    now = health.wall()
    base = f"http://127.0.0.1:{port}"

    def relay(path: str, at: float) -> dict[str, str]:
        return {
            RELAYED_BY: "pod-b",
            RELAY_TIME: f"{at:.0f}",
            RELAY_SIGNATURE: sign_relay(token, "pod-b", path, round(at)),
        }

    status = "/api/v1/status"
    assert (await _get(base + status, **relay(status, now)))[0] == 200
    assert (await _get(base + status, **relay(status, now - 120)))[0] == 401
    explain = "/api/v1/explain/workernode/x"
    assert (await _get(base + explain, **relay(status, now)))[0] == 401


async def test_metrics_can_require_the_token() -> None:
    secret = Secret("token-one-0123456789")
    health = Health(role="leader", handlers_ready=True, metrics_auth="token")
    health.token_loader = secret
    served = await serve(health, "127.0.0.1", 0, 0, 0)
    try:
        assert served.metrics_port != served.probe_port
        metrics = f"http://127.0.0.1:{served.metrics_port}/metrics"
        assert (await _get(metrics))[0] == 401
        code, body = await _get(metrics, "token-one-0123456789")
        assert code == 200 and "nodewarden_build_info" in body
        # the probes never need it, and live on their own listener
        assert (await _get(f"http://127.0.0.1:{served.probe_port}/healthz"))[0] == 200
        assert (await _get(f"http://127.0.0.1:{served.metrics_port}/healthz"))[0] == 404
    finally:
        await served.cleanup()
