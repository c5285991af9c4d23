"""Helpers shared by the SSH tests (imported as a plain module: tests/ssh is on sys.path)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from calibration import scaled
from nodewarden.ssh import KnownHostKeys, ProbeSettings, SshClientKey, SshTarget
from nodewarden_doubles.stubworker import StubWorker

StubFactory = Callable[..., Awaitable[StubWorker]]
"""The ``stub`` fixture: ``await stub(**StubWorkerConfig fields, faults=...)``."""


class FakeMonotonic:
    """A monotonic clock the test moves by hand (stub boot delays, container run times)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def fast_settings(**overrides: Any) -> ProbeSettings:
    values: dict[str, Any] = {
        "connect_timeout": 3.0,
        "login_timeout": 3.0,
        "command_timeout": 3.0,
    }
    values.update(overrides)
    return ProbeSettings(**values)


def target_for(
    worker: StubWorker, client_key: SshClientKey, node: str = "node-a", **kw: Any
) -> SshTarget:
    """A target trusting the worker's genuine host key for 127.0.0.1:port."""
    assert worker.port is not None
    return SshTarget(
        node=node,
        host="127.0.0.1",
        port=worker.port,
        client_key=client_key,
        trust=kw.pop("trust", None) or KnownHostKeys(worker.known_hosts_line()),
        **kw,
    )


async def eventually(
    predicate: Callable[[], bool], deadline_s: float = 10.0, interval: float = 0.01
) -> None:
    """Poll ``predicate`` until it holds or fail after ``deadline_s`` seconds (scaled by the
    calibration figure)."""
    deadline = time.monotonic() + scaled(deadline_s)
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached before the deadline")
        await asyncio.sleep(interval)
