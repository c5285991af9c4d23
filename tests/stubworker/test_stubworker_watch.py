"""The stub worker's ``RUNNER --watch`` on the wire, read by a plain asyncssh client: the
state line at once and on every change, heartbeats on the worker's (manual) time, the
older runner without it, and the silent and killed watch."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import asyncssh
import pytest

from calibration import scaled
from nodewarden_doubles.stubworker import StubWorker, StubWorkerConfig
from nodewarden_doubles.stubworker.manualtime import ManualTime

UUID_1 = "zzzzz-dz642-000000000000001"
WATCH = "nodewarden-runner --watch --heartbeat 10"
HEARTBEAT = {"v": 1, "kind": "heartbeat"}


@pytest.fixture
def client_key() -> asyncssh.SSHKey:
    return asyncssh.generate_private_key("ssh-ed25519")


@pytest.fixture
def manual() -> ManualTime:
    return ManualTime()


async def _worker(
    key: asyncssh.SSHKey, manual: ManualTime, **config: object
) -> AsyncIterator[StubWorker]:
    w = StubWorker(
        StubWorkerConfig(
            authorized_keys=(key.export_public_key("openssh").decode(),),
            **config,  # type: ignore[arg-type]
        ),
        clock=manual,
        sleep=manual.sleep,
    )
    await w.start()
    yield w
    await w.stop()


@pytest.fixture
async def worker(client_key: asyncssh.SSHKey, manual: ManualTime) -> AsyncIterator[StubWorker]:
    async for w in _worker(client_key, manual):
        yield w


@pytest.fixture
async def conn(
    worker: StubWorker, client_key: asyncssh.SSHKey
) -> AsyncIterator[asyncssh.SSHClientConnection]:
    async with asyncssh.connect(
        "127.0.0.1", worker.port, username="t", client_keys=[client_key], known_hosts=None
    ) as c:
        yield c


async def _line(process: asyncssh.SSHClientProcess[str]) -> dict[str, object]:
    async with asyncio.timeout(scaled(10)):
        return json.loads(await process.stdout.readline())  # type: ignore[no-any-return]


async def _until(predicate: object, deadline_s: float = 10.0) -> None:
    deadline = time.monotonic() + scaled(deadline_s)
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not reached before the deadline"
        await asyncio.sleep(0.005)


async def test_watch_prints_the_state_at_once_then_each_start_and_kill(
    worker: StubWorker, conn: asyncssh.SSHClientConnection
) -> None:
    watch = await conn.create_process(WATCH)
    first = await _line(watch)
    assert first == {
        "v": 1,
        "kind": "state",
        "ready": True,
        "detail": "running",
        "broken": False,
        "runners": [],
    }
    started = await conn.run(
        "nodewarden-runner run --detach --dispatcher-id d1 --fence 4",
        input=json.dumps({"uuid": UUID_1}),
    )
    assert started.exit_status == 0
    pid = str(started.stdout).strip()
    assert (await _line(watch))["runners"] == [f"{pid} {UUID_1} dispatcher=d1 fence=4"]
    await conn.run(f"nodewarden-runner --kill TERM {UUID_1}")
    assert (await _line(watch))["runners"] == []
    watch.close()


async def test_a_container_that_ends_by_itself_is_pushed_when_its_time_comes(
    worker: StubWorker, conn: asyncssh.SSHClientConnection, manual: ManualTime
) -> None:
    watch = await conn.create_process(WATCH)
    await _line(watch)
    spec = {"uuid": UUID_1, "runtime": {"durationHintSeconds": 4}}
    await conn.run("nodewarden-runner run --detach", input=json.dumps(spec))
    assert len((await _line(watch))["runners"]) == 1  # type: ignore[arg-type]
    await _until(lambda: manual.sleeping == 1)
    manual.advance(4)  # before the heartbeat (10 s): the end itself wakes the watch
    line = await _line(watch)
    assert line["kind"] == "state" and line["runners"] == []
    watch.close()


async def test_heartbeats_come_on_the_interval_and_only_when_nothing_changed(
    worker: StubWorker, conn: asyncssh.SSHClientConnection, manual: ManualTime
) -> None:
    watch = await conn.create_process(WATCH)
    await _line(watch)
    for beat in range(1, 7):  # one simulated minute
        await _until(lambda: manual.sleeping == 1)
        manual.advance(9.5)
        await _until(lambda: manual.sleeping == 1)
        assert worker.watch_heartbeats == beat - 1  # not before the 10 s are up
        manual.advance(0.5)
        assert await _line(watch) == HEARTBEAT
    assert worker.watch_heartbeats == 6
    assert list(worker.commands) == [WATCH]
    watch.close()


async def test_an_older_runner_without_watch_fails_with_a_usage_error(
    client_key: asyncssh.SSHKey, manual: ManualTime
) -> None:
    async for w in _worker(client_key, manual, watch_supported=False):
        async with asyncssh.connect(
            "127.0.0.1", w.port, username="t", client_keys=[client_key], known_hosts=None
        ) as c:
            result = await c.run(WATCH)
        assert result.exit_status == 2 and result.stdout == ""
        assert "usage" in str(result.stderr)


async def test_a_silent_watch_stays_open_without_lines_and_a_killed_one_closes(
    worker: StubWorker, conn: asyncssh.SSHClientConnection, manual: ManualTime
) -> None:
    watch = await conn.create_process(WATCH)
    await _line(watch)
    worker.faults.watch_silent = True
    for _ in range(3):
        await _until(lambda: manual.sleeping == 1)
        manual.advance(10)
    await _until(lambda: manual.sleeping == 1)
    assert worker.watch_heartbeats == 0 and worker.watching == 1
    worker.end_watches()
    async with asyncio.timeout(scaled(10)):
        assert await watch.stdout.readline() == ""
    await _until(lambda: worker.watching == 0)
