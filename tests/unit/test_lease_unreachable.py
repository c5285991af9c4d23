"""Leader election when the API server cannot be reached: a failed attempt, never a crash.

Found by the chaos suite (e2e/chaos): with the API connection dropped, a connection error
escaped the lease code -- the standby replica exited, and the leader's renewal task died
while the leader went on acting (its lease then expires under it).
"""

from __future__ import annotations

import asyncio
import socket

from kubernetes_asyncio import client

from nodewarden.kube.lease import LeaderElector


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _elector() -> LeaderElector:
    config = client.Configuration()
    config.host = f"https://127.0.0.1:{_closed_port()}"
    config.verify_ssl = False
    return LeaderElector(
        client.ApiClient(config), "ns", "nodewarden-test", "me", retry_interval=0.05
    )


async def test_an_unreachable_api_server_is_a_failed_attempt() -> None:
    elector = _elector()
    try:
        assert await elector.try_acquire_or_renew() is False
        assert await elector.holder() == (None, {})
        elector.is_leader = True
        await elector.release()  # logs, does not raise
        assert elector.is_leader is False
    finally:
        await elector.api.close()


async def test_a_standby_keeps_trying_while_the_api_server_is_unreachable() -> None:
    elector = _elector()
    stop = asyncio.Event()
    standby: list[bool] = []
    attempts: list[bool] = []
    three = asyncio.Event()
    attempt = elector.try_acquire_or_renew

    async def counted() -> bool:
        attempts.append(await attempt())
        if len(attempts) >= 3:
            three.set()
        return attempts[-1]

    elector.try_acquire_or_renew = counted  # type: ignore[method-assign]
    try:
        task = asyncio.create_task(elector.acquire(stop, on_standby=lambda: standby.append(True)))
        await asyncio.wait(
            [task, asyncio.create_task(three.wait())], timeout=10, return_when="FIRST_COMPLETED"
        )
        assert not task.done(), task
        assert attempts[:3] == [False, False, False]
        stop.set()
        assert await asyncio.wait_for(task, 5) is False
        assert standby == [True]
    finally:
        await elector.api.close()


async def test_a_release_the_api_server_never_answers_gives_up_within_the_renew_interval() -> None:
    """A stopping process must not wait on a hung API server (seen in CI: a stop that
    outlived its exit deadline): the release is abandoned after `renew_interval` and the
    Lease expires by itself, as after a crash."""
    elector = _elector()
    elector.renew_interval = 0.2
    answered = asyncio.Event()

    async def hangs(*_: object) -> None:
        await answered.wait()  # never set: the API server does not answer

    elector.leases.read_namespaced_lease = hangs  # type: ignore[method-assign]
    try:
        elector.is_leader = True
        loop = asyncio.get_running_loop()
        began = loop.time()
        await asyncio.wait_for(elector.release(), timeout=10)
        assert loop.time() - began < 5
        assert elector.is_leader is False and not answered.is_set()
    finally:
        await elector.api.close()
