"""An API server that cannot be reached is a KubeError (a failed request callers retry),
never a raw connection error that escapes a round or crashes the operator; an Event that
cannot be posted is logged, not raised."""

from __future__ import annotations

import asyncio
import socket

import pytest
from kubernetes_asyncio import client

from nodewarden.api.kinds import WORKER_NODE
from nodewarden.kube.client import Kube, KubeError


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed when the block ends: nothing listens


def _kube() -> Kube:
    cfg = client.Configuration(host=f"http://127.0.0.1:{_closed_port()}")
    return Kube(client.ApiClient(configuration=cfg))


def test_a_status_write_to_an_unreachable_api_server_is_a_kube_error() -> None:
    async def scenario() -> KubeError:
        kube = _kube()
        try:
            with pytest.raises(KubeError) as caught:
                await kube.patch_status(WORKER_NODE, "ns", "n1", {"phase": "On"})
            with pytest.raises(KubeError):
                await kube.get(WORKER_NODE, "ns", "n1")
            return caught.value
        finally:
            await kube.close()

    error = asyncio.run(scenario())
    assert "unreachable" in str(error)
    assert error.status is None


def test_an_event_to_an_unreachable_api_server_is_logged_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> None:
        kube = _kube()
        try:
            body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns"}}
            await kube.emit_event(body, reason="Test", message="hello")
        finally:
            await kube.close()

    asyncio.run(scenario())
    assert "could not post event Test" in caplog.text
