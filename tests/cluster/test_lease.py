"""Leader election against the real API server: who acts, and when a replica says "standby"."""

from __future__ import annotations

import asyncio

import pytest

from clusterkit import ClusterHandle
from nodewarden.kube.client import api_client_from
from nodewarden.kube.lease import LeaderElector

pytestmark = pytest.mark.cluster


async def test_standby_is_reported_only_after_a_lease_attempt_sees_another_holder(
    cluster: ClusterHandle, namespace: str
) -> None:
    api_a = await api_client_from(cluster.kubeconfig)
    api_b = await api_client_from(cluster.kubeconfig)
    a = LeaderElector(api_a, namespace, "lease-roles", "a", lease_duration=15, retry_interval=0.2)
    b = LeaderElector(api_b, namespace, "lease-roles", "b", lease_duration=15, retry_interval=0.2)
    calls: dict[str, int] = {"a": 0, "b": 0}
    try:
        # a lone replica takes the free lease and is never told to stand by
        assert await a.acquire(on_standby=lambda: calls.__setitem__("a", calls["a"] + 1))
        assert calls["a"] == 0 and a.is_leader

        stop = asyncio.Event()
        waiting = asyncio.ensure_future(
            b.acquire(stop, on_standby=lambda: calls.__setitem__("b", calls["b"] + 1))
        )
        await asyncio.sleep(1.0)  # several attempts, all refused
        assert not waiting.done()
        assert calls["b"] == 1  # once, not once per attempt
        assert not b.is_leader

        # a clean stop of the holder hands the lease over at once
        await a.release()
        assert await asyncio.wait_for(waiting, timeout=5)
        assert b.is_leader and calls["b"] == 1
    finally:
        await b.release()
        await api_a.close()
        await api_b.close()
