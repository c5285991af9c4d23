"""The shard elector's loop survives a failing round: an error in one round (a bug in a
callback, an unexpected API answer) is logged and the next round runs -- before, any
exception but a timeout ended the loop, and the shards held lapsed unrenewed."""

from __future__ import annotations

import asyncio

import pytest
from kubernetes_asyncio import client

from nodewarden.shards.elector import ShardElector


async def test_a_round_that_fails_does_not_end_the_rounds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    api = client.ApiClient()  # (never called: the round is the test's own)
    elector = ShardElector(api, "ns", "d", "r", 2, lease_duration=5.0, retry_interval=0.01)
    calls: list[int] = []
    stop = asyncio.Event()

    async def flaky() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a bug in a callback")
        if len(calls) == 3:
            stop.set()

    try:
        await asyncio.wait_for(elector._every_round(stop, flaky, "test round"), timeout=10)
    finally:
        await api.close()
    assert len(calls) == 3
    assert "test round failed" in caplog.text
