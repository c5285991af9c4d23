"""Fixtures for the SSH prober tests: a client key, stub workers on 127.0.0.1, a prober."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from ssh_helpers import FakeMonotonic, StubFactory, fast_settings

from nodewarden.ssh import ProbeThrottle, SshClientKey, SshProber
from nodewarden_doubles.stubworker import StubFaults, StubWorker, StubWorkerConfig


@pytest.fixture
def client_key() -> SshClientKey:
    return SshClientKey.generate()


@pytest.fixture
def stub_clock() -> FakeMonotonic:
    return FakeMonotonic()


@pytest.fixture
async def stub(client_key: SshClientKey, stub_clock: FakeMonotonic) -> AsyncIterator[StubFactory]:
    """Factory: ``await stub(**config)`` starts a StubWorker accepting ``client_key``."""
    workers: list[StubWorker] = []

    async def make(*, faults: StubFaults | None = None, **config: Any) -> StubWorker:
        config.setdefault("authorized_keys", (client_key.public_key,))
        worker = StubWorker(
            StubWorkerConfig(faults=faults or StubFaults(), **config), clock=stub_clock
        )
        await worker.start()
        workers.append(worker)
        return worker

    yield make
    for worker in workers:
        await worker.stop()


@pytest.fixture
async def prober() -> AsyncIterator[SshProber]:
    p = SshProber(fast_settings(), throttle=ProbeThrottle(0))
    yield p
    await p.aclose()
