"""The watch stream (`SshProber.watch`) against a stub worker over real SSH on loopback:
runner starts and ends are seen with no probe command in between (commands counted at
the stub), heartbeats refresh the facts without a change, a stream that stops raises
and its facts then turn stale by the telemetry max age, and a runner without ``--watch``
is reported as unsupported while the command probes still work."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from ssh_helpers import StubFactory, fast_settings, target_for

from calibration import scaled
from nodewarden.policy.timing import telemetry_gate
from nodewarden.rules.readings import work_reading
from nodewarden.ssh import ProbeThrottle, SshClientKey, SshProber, StreamedFacts
from nodewarden.ssh.stream import StreamStopped, WatchUnsupported

UUID_1 = "zzzzz-dz642-000000000000001"
HEARTBEAT = 0.2
"""Seconds between heartbeats in these tests (the stub sleeps for real here)."""


def _probe_commands(commands: list[str]) -> list[str]:
    """Commands other than the watch itself: what a stream must not need."""
    return [c for c in commands if "--watch" not in c]


async def _next(stream: AsyncIterator[StreamedFacts], deadline_s: float = 10.0) -> StreamedFacts:
    async with asyncio.timeout(scaled(deadline_s)):
        return await anext(stream)


async def test_a_runner_that_starts_or_ends_is_seen_with_no_probe_command_in_between(
    stub: StubFactory, prober: SshProber, client_key: SshClientKey
) -> None:
    worker = await stub()
    stream = prober.watch(target_for(worker, client_key), heartbeat=10)
    first = await _next(stream)
    assert first.ready.ready and first.runners is not None and first.runners.runners == ()
    before = len(worker.commands)

    t0 = time.perf_counter()
    pid = worker.runner.start(json.dumps({"uuid": UUID_1}), dispatcher_id="d1")
    worker.notify_change()  # what `run --detach` does on the node
    started = await _next(stream)
    start_latency = time.perf_counter() - t0
    assert started.changed and started.runners is not None
    assert [(r.pid, r.uuid, r.dispatcher_id) for r in started.runners.runners] == [
        (pid, UUID_1, "d1")
    ]

    t0 = time.perf_counter()
    worker.runner.kill(UUID_1, "TERM")
    worker.notify_change()
    ended = await _next(stream)
    end_latency = time.perf_counter() - t0
    assert ended.runners is not None and ended.runners.runners == ()
    assert _probe_commands(list(worker.commands)[before:]) == []
    assert prober.stats.streams_opened == 1
    print(f"stream latency: start {start_latency * 1000:.1f} ms, end {end_latency * 1000:.1f} ms")
    await stream.aclose()


async def test_a_heartbeat_refreshes_the_facts_without_a_change(
    stub: StubFactory, prober: SshProber, client_key: SshClientKey
) -> None:
    worker = await stub()
    stream = prober.watch(target_for(worker, client_key), heartbeat=HEARTBEAT)
    first = await _next(stream)
    beat = await _next(stream)
    assert not beat.changed
    assert beat.runners == first.runners.__class__(
        node=first.runners.node,  # type: ignore[union-attr]
        runners=first.runners.runners,  # type: ignore[union-attr]
        observed_at=beat.observed_at,
        source=first.runners.source,  # type: ignore[union-attr]
    )
    assert beat.observed_at > first.observed_at
    assert _probe_commands(list(worker.commands)) == []
    await stream.aclose()


class _Clock:
    """The prober's clock, moved by the test (observed_at of each line)."""

    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


@pytest.mark.parametrize("stop", ["silent", "killed"])
async def test_a_stream_that_stops_raises_and_its_facts_turn_stale_on_time(
    stub: StubFactory, client_key: SshClientKey, stop: str
) -> None:
    clock = _Clock()
    prober = SshProber(fast_settings(), throttle=ProbeThrottle(0), clock=clock)
    worker = await stub()
    seen: list[StreamedFacts] = []
    try:
        stream = prober.watch(target_for(worker, client_key), heartbeat=HEARTBEAT)
        seen.append(await _next(stream))
        clock.now += timedelta(seconds=5)
        seen.append(await _next(stream))  # a heartbeat, observed 5 s later
        if stop == "silent":
            worker.faults.watch_silent = True  # no more lines, channel open
        else:
            worker.end_watches()  # the watch process is killed
        stopped_at = time.monotonic()
        with pytest.raises(StreamStopped):
            while True:
                seen.append(await _next(stream))
        if stop == "silent":  # stopped once 3 heartbeats were missed, not before
            assert time.monotonic() - stopped_at >= 2 * HEARTBEAT
    finally:
        await prober.aclose()
    last = seen[-1]
    assert last.observed_at == datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=5)
    assert last.runners is not None
    reading = work_reading(0, last.runners.source, last.runners.observed_at, None)
    max_age = timedelta(seconds=60)
    just_fresh = telemetry_gate((("work", reading),), last.observed_at + max_age, max_age)
    just_stale = telemetry_gate(
        (("work", reading),), last.observed_at + max_age + timedelta(seconds=1), max_age
    )
    assert tuple(just_fresh[1]) == () and tuple(just_stale[1]) == ("work",)


async def test_a_runner_without_watch_is_unsupported_and_the_command_probe_still_works(
    stub: StubFactory, prober: SshProber, client_key: SshClientKey
) -> None:
    worker = await stub(watch_supported=False)
    target = target_for(worker, client_key)
    with pytest.raises(WatchUnsupported):
        await _next(prober.watch(target, heartbeat=10))
    report = await prober.probe(target)
    assert report.ready.ready and report.runners is not None
    assert [c for c in worker.commands if "--list" in c] == ["nodewarden-runner --list"]


async def test_a_runner_that_ignores_watch_and_exits_0_is_unsupported_too(
    stub: StubFactory, prober: SshProber, client_key: SshClientKey
) -> None:
    worker = await stub(extra_commands={"nodewarden-runner --watch --heartbeat 10": (0, "", "")})
    with pytest.raises(WatchUnsupported):
        await _next(prober.watch(target_for(worker, client_key), heartbeat=10))


async def test_probe_with_streamed_facts_runs_only_what_the_stream_does_not_carry(
    stub: StubFactory, prober: SshProber, client_key: SshClientKey
) -> None:
    worker = await stub()
    target = target_for(worker, client_key)
    stream = prober.watch(target, heartbeat=10)
    facts = await _next(stream)
    report = await prober.probe(target, inhibitors=True, uptime=True, streamed=facts)
    assert report.ready is facts.ready and report.runners is facts.runners
    assert report.inhibitors is not None and report.uptime is not None
    polled = _probe_commands(list(worker.commands))
    assert not any("--list" in c or c == worker.config.ready_command for c in polled)
    assert len(polled) == 2  # busctl and uptime
    await stream.aclose()
