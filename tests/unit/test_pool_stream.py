"""The pool's probe loops with watch streams (in process, real SSH to stub workers on
loopback, the stubs' heartbeats on manual time): at rest, heartbeats = minutes x 60 / N
(+-1) per node and zero probe commands; a runner without ``--watch`` falls back to the
command probes and is not asked again; a killed stream is reopened."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from calibration import scaled
from nodewarden.config import DispatchSettings
from nodewarden.pool.worker import PoolState
from nodewarden.pool.workers import Worker, WorkerPool
from nodewarden.ssh import (
    KnownHostKeys,
    ProbeReport,
    ProbeSettings,
    ProbeThrottle,
    SshClientKey,
    SshError,
    SshProber,
    SshTarget,
)
from nodewarden_doubles.stubworker import StubWorker, StubWorkerConfig
from nodewarden_doubles.stubworker.manualtime import ManualTime

T0 = datetime(2026, 1, 1, tzinfo=UTC)
HEARTBEAT = 10.0


class Observer:
    """Counts what the pool tells the power controller, per node."""

    def __init__(self) -> None:
        self.reports: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.last: dict[str, ProbeReport] = {}

    def probed(self, worker: Any, report: ProbeReport | None, error: SshError | None) -> None:
        if report is not None:
            self.reports[worker.name] += 1
            self.last[worker.name] = report
        else:
            self.errors[worker.name] += 1

    def should_probe(self, name: str) -> bool:
        return True


async def _until(predicate: Callable[[], bool], deadline_s: float = 10.0) -> None:
    deadline = time.monotonic() + scaled(deadline_s)
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached before the deadline"
        await asyncio.sleep(0.002)


class Fleet:
    def __init__(self, pool: WorkerPool, observer: Observer, stubs: dict[str, StubWorker]):
        self.pool, self.observer, self.stubs = pool, observer, stubs

    def commands(self, name: str) -> list[str]:
        return list(self.stubs[name].commands)


@pytest.fixture
def manual() -> ManualTime:
    return ManualTime()


@pytest.fixture
async def fleet_of(manual: ManualTime) -> AsyncIterator[Callable[..., Any]]:
    made: list[tuple[WorkerPool, SshProber, list[StubWorker]]] = []

    async def make(count: int, *, probe_interval: float = 10.0, **config: Any) -> Fleet:
        key = SshClientKey.generate()
        prober = SshProber(
            ProbeSettings(
                connect_timeout=3, login_timeout=3, command_timeout=3, stream_heartbeat=HEARTBEAT
            ),
            throttle=ProbeThrottle(0),
        )
        pool = WorkerPool(
            kube=None,  # type: ignore[arg-type]
            cloud=None,
            prober=prober,
            namespace="ns",
            dispatcher_id="d",
            settings=DispatchSettings(probe_interval=probe_interval, boot_probe_interval=0.1),
            client_key=None,
            master=None,
            takeover_after=lambda: timedelta(hours=1),
            default_policy=None,
            clock=lambda: T0,
            on_change=lambda: None,
        )
        observer = Observer()
        pool.observer = observer  # type: ignore[assignment]
        stubs: dict[str, StubWorker] = {}
        for i in range(count):
            name = f"node-{i:03d}"
            stub = StubWorker(
                StubWorkerConfig(authorized_keys=(key.public_key,), name=name, **config),
                clock=manual,
                sleep=manual.sleep,
            )
            await stub.start()
            stubs[name] = stub
            pool.ctx.workers[name] = Worker(name=name, instance_type=None, created_at=T0)

        async def target(worker: Worker) -> SshTarget:
            stub = stubs[worker.name]
            return SshTarget(
                node=worker.name,
                host="127.0.0.1",
                port=stub.port or 0,
                client_key=key,
                trust=KnownHostKeys(stub.known_hosts_line()),
            )

        pool.probes.target = target  # type: ignore[method-assign]
        made.append((pool, prober, list(stubs.values())))
        for worker in pool.ctx.workers.values():
            assert worker.probing
            pool.probes.ensure(worker)
        return Fleet(pool, observer, stubs)

    yield make
    for pool, prober, stubs in made:
        await pool.probes.close()
        await prober.aclose()
        for stub in stubs:
            await stub.stop()


@pytest.mark.parametrize("nodes", [10, 50])
async def test_at_rest_heartbeats_are_minutes_times_60_over_n_and_no_probe_command_runs(
    fleet_of: Callable[..., Any], manual: ManualTime, nodes: int
) -> None:
    # the probe loops run every 50 ms of real time meanwhile: each finds the stream up
    fleet: Fleet = await fleet_of(nodes, probe_interval=0.05)
    counters = fleet.pool.probes.stream_counters
    await _until(lambda: counters.changes == nodes and manual.sleeping == nodes)
    assert all(w.state is PoolState.READY for w in fleet.pool.ctx.workers.values())
    minutes = 10
    cpu0 = time.process_time()
    for beat in range(1, int(minutes * 60 / HEARTBEAT) + 1):
        manual.advance(HEARTBEAT)
        await _until(
            lambda b=beat: counters.heartbeats == b * nodes and manual.sleeping == nodes  # type: ignore[misc]
        )
    cpu = time.process_time() - cpu0
    expected = minutes * 60 / HEARTBEAT
    for name in fleet.stubs:
        heartbeats = fleet.observer.reports[name] - 1  # the first line is the state
        assert abs(heartbeats - expected) <= 1, (name, heartbeats)
        assert fleet.commands(name) == [f"nodewarden-runner --watch --heartbeat {HEARTBEAT:g}"]
        assert fleet.observer.last[name].ready.observed_at is not None
    assert counters.changes == nodes and counters.stopped == 0
    assert fleet.pool.ctx.prober.stats.commands == nodes  # one watch each, nothing else
    lines = counters.heartbeats
    print(f"CPU per heartbeat line (stub and operator, one process): {cpu / lines * 1000:.3f} ms")


async def test_a_runner_without_watch_falls_back_to_the_command_probes_and_is_not_asked_again(
    fleet_of: Callable[..., Any],
) -> None:
    fleet: Fleet = await fleet_of(1, probe_interval=0.05, watch_supported=False)
    name = next(iter(fleet.stubs))
    await _until(
        lambda: (
            fleet.commands(name).count("nodewarden-runner --list") >= 3
            and fleet.observer.reports[name] >= 3
        )
    )
    counters = fleet.pool.probes.stream_counters
    assert counters.unsupported == 1 and counters.changes == 0
    assert sum("--watch" in c for c in fleet.commands(name)) == 1
    assert fleet.pool.ctx.workers[name].state is PoolState.READY


async def test_a_killed_stream_is_reopened_and_no_probe_command_runs_meanwhile(
    fleet_of: Callable[..., Any], manual: ManualTime
) -> None:
    fleet: Fleet = await fleet_of(1, probe_interval=0.05)
    name, stub = next(iter(fleet.stubs.items()))
    counters = fleet.pool.probes.stream_counters
    await _until(lambda: counters.changes == 1 and stub.watching == 1)
    stub.end_watches()
    await _until(lambda: counters.stopped == 1)
    await _until(lambda: counters.opened == 2 and counters.changes == 2)
    assert [c for c in fleet.commands(name) if "--watch" not in c] == []


async def test_a_probe_asked_for_on_a_streaming_node_runs_at_once_not_at_the_next_heartbeat(
    fleet_of: Callable[..., Any], manual: ManualTime
) -> None:
    # a drain or a verification asks for a fresh runner list (`request_probe`); on a
    # streaming node it must not wait for the next heartbeat (manual time: none comes)
    fleet: Fleet = await fleet_of(1, probe_interval=600.0)
    name = next(iter(fleet.stubs))
    counters = fleet.pool.probes.stream_counters
    await _until(lambda: counters.changes == 1 and manual.sleeping == 1)
    await asyncio.sleep(0.2)  # the probe loops run meanwhile: nothing asked, no command
    assert [c for c in fleet.commands(name) if "--watch" not in c] == []
    reports = fleet.observer.reports[name]
    fleet.pool.request_probe(name)
    await _until(lambda: fleet.observer.reports[name] > reports)
    assert counters.heartbeats == 0  # the answer was the command probe, not a heartbeat
    assert any("--list" in c for c in fleet.commands(name)), fleet.commands(name)
