"""Two electors on one Lease with skewed wall clocks and one fake monotonic clock.

An in-memory Lease API with resourceVersions (409 on a stale replace) stands in for the
API server; the cluster twin with libfaketime is tests/cluster/test_lease.py. Wall
clocks an hour apart change nothing: a standby counts the Lease's duration from when it
saw the record change, on its own monotonic clock.
"""

from __future__ import annotations

import asyncio
import copy
import time
from datetime import UTC, datetime, timedelta

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from fencekit import Clock
from nodewarden.fence import NotLeader
from nodewarden.kube.lease import LeaderElector, initial_transitions


class FakeLeases:
    """read / create / replace of one Lease, with resourceVersion preconditions."""

    def __init__(self) -> None:
        self.lease: client.V1Lease | None = None
        self.version = 0

    def _stored(self, body: client.V1Lease) -> None:
        self.version += 1
        body = copy.deepcopy(body)
        body.metadata.resource_version = str(self.version)
        self.lease = body

    async def read_namespaced_lease(self, name: str, namespace: str) -> client.V1Lease:
        if self.lease is None:
            raise ApiException(status=404)
        return copy.deepcopy(self.lease)

    async def create_namespaced_lease(self, namespace: str, body: client.V1Lease) -> None:
        if self.lease is not None:
            raise ApiException(status=409)
        self._stored(body)

    async def replace_namespaced_lease(
        self, name: str, namespace: str, body: client.V1Lease
    ) -> None:
        assert self.lease is not None
        if body.metadata.resource_version != self.lease.metadata.resource_version:
            raise ApiException(status=409)
        self._stored(body)


def elector(leases: FakeLeases, identity: str, mono: Clock, skew: timedelta) -> LeaderElector:
    e = LeaderElector(
        client.ApiClient(client.Configuration()),
        "ns",
        "nodewarden-d",
        identity,
        lease_duration=15,
        renew_interval=5,
        monotonic=mono,
        wall_clock=lambda: datetime.now(tz=UTC) + skew,
    )
    e.leases = leases  # type: ignore[assignment]
    return e


@pytest.mark.parametrize("standby_skew_hours", [1, -1])
async def test_skewed_wall_clocks_never_make_two_leaders(standby_skew_hours: int) -> None:
    mono, leases = Clock(), FakeLeases()
    a = elector(leases, "a", mono, timedelta(0))
    b = elector(leases, "b", mono, timedelta(hours=standby_skew_hours))
    try:
        assert await a.try_acquire_or_renew()
        a.is_leader = True
        first = a.leadership.check("anything").value
        # a renews every 5 s, b tries every second: b never wins while a renews
        for second in range(60):
            mono.now += 1
            a.leadership.beat()
            if second % 5 == 4:
                assert await a.try_acquire_or_renew()
            assert not await b.try_acquire_or_renew(), f"b took the lease after {second + 1}s"
        assert a.leadership.valid
        # a dies (no release): b takes over 15 s after it last saw the record change,
        # not earlier, with the next token
        died = mono.now
        while not await b.try_acquire_or_renew():
            mono.now += 1
            assert mono.now - died <= 16
        assert mono.now - died >= 15 - 5  # a's last renewal was up to 5 s before it died
        assert b.leadership.check("anything").value == first + 1
        # a's own view: it stopped being valid before b could take over
        assert not a.leadership.valid
    finally:
        await a.api.close()
        await b.api.close()


async def test_a_leader_that_sees_another_holder_steps_down_at_once() -> None:
    mono, leases = Clock(), FakeLeases()
    a = elector(leases, "a", mono, timedelta(0))
    b = elector(leases, "b", mono, timedelta(0))
    try:
        assert await a.try_acquire_or_renew()
        a.is_leader = True
        assert not await b.try_acquire_or_renew()  # b sees the record
        mono.now += 16  # a's event loop froze: no renewal, no heartbeat
        assert await b.try_acquire_or_renew()
        assert not await a.try_acquire_or_renew()
        assert a.leadership.lost_reason is not None and "held by 'b'" in a.leadership.lost_reason
    finally:
        await a.api.close()
        await b.api.close()


async def test_a_released_lease_is_taken_at_once_and_a_new_lease_starts_high() -> None:
    mono, leases = Clock(), FakeLeases()
    a = elector(leases, "a", mono, timedelta(0))
    b = elector(leases, "b", mono, timedelta(0))
    try:
        assert await a.try_acquire_or_renew()
        created = a.leadership.check("x").value
        # a Lease deleted and created again still issues higher tokens than before
        assert created == initial_transitions(datetime.now(tz=UTC)) or created > 10**7
        a.is_leader = True
        assert not await b.try_acquire_or_renew()
        await a.release()
        assert await b.try_acquire_or_renew()
        assert b.leadership.check("x").value == created + 1
    finally:
        await a.api.close()
        await b.api.close()


async def test_keep_steps_down_when_the_event_loop_stalls_longer_than_the_margin() -> None:
    """The real heartbeat on the real loop: a blocking call of 0.5 s against a 0.2 s
    margin ends leadership before anything else runs."""
    leases = FakeLeases()
    e = LeaderElector(
        client.ApiClient(client.Configuration()),
        "ns",
        "nodewarden-d",
        "a",
        lease_duration=1.2,
        renew_interval=0.1,
        retry_interval=0.05,
        margin=0.2,
    )
    e.leases = leases  # type: ignore[assignment]
    try:
        assert await e.acquire()
        lost = asyncio.Event()
        keeping = asyncio.create_task(e.keep(lost.set))
        await asyncio.sleep(0.5)  # renewing and beating: still leading
        assert e.leadership.valid and not lost.is_set()
        time.sleep(0.5)  # noqa: ASYNC251 - the stall under test: the loop is blocked
        with pytest.raises(NotLeader, match="stalled"):
            e.leadership.check("runner start")
        await asyncio.wait_for(lost.wait(), timeout=2)
        await keeping
    finally:
        await e.api.close()
