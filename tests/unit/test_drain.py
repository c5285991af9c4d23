"""`nodewarden.drain`: what a stopping component does with the tasks it still has."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from nodewarden.drain import Drained, drain


async def _sleep_then(seconds: float, done: list[str], name: str) -> None:
    await asyncio.sleep(seconds)
    done.append(name)


def test_tasks_that_end_within_the_grace_finish_the_rest_are_cancelled() -> None:
    async def scenario() -> tuple[Any, list[str], bool]:
        done: list[str] = []
        quick = asyncio.create_task(_sleep_then(0.05, done, "quick"))
        slow = asyncio.create_task(_sleep_then(30, done, "slow"))
        result = await drain({quick, slow}, grace=0.5)
        return result, done, slow.cancelled()

    result, done, slow_cancelled = asyncio.run(scenario())
    assert done == ["quick"]
    assert slow_cancelled
    assert (result.finished, result.cancelled) == (1, 1)


def test_no_grace_cancels_everything_at_once() -> None:
    async def scenario() -> tuple[Any, list[str]]:
        done: list[str] = []
        tasks = {asyncio.create_task(_sleep_then(0.05, done, str(i))) for i in range(3)}
        return await drain(tasks, grace=0), done

    result, done = asyncio.run(scenario())
    assert done == []
    assert (result.finished, result.cancelled) == (0, 3)


def test_tasks_spawned_while_draining_are_waited_for_too() -> None:
    async def scenario() -> tuple[Any, list[str]]:
        done: list[str] = []
        tasks: set[asyncio.Task[None]] = set()

        async def write_then_record() -> None:
            await asyncio.sleep(0.05)
            tasks.add(asyncio.create_task(_sleep_then(0.05, done, "record")))
            done.append("write")

        tasks.add(asyncio.create_task(write_then_record()))
        return await drain(tasks, grace=5), done

    result, done = asyncio.run(scenario())
    assert done == ["write", "record"]
    assert (result.finished, result.cancelled) == (2, 0)


def test_a_task_that_ignores_its_cancellation_does_not_hold_the_stop(
    caplog: pytest.LogCaptureFixture,
) -> None:
    release = asyncio.Event()

    async def stubborn() -> None:
        while not release.is_set():
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                continue  # the bug class: a retry loop that swallows cancellation

    async def scenario() -> tuple[Drained, float, bool]:
        task = asyncio.create_task(stubborn(), name="stubborn-retry")
        await asyncio.sleep(0)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        result = await drain({task}, grace=0, unwind=0.2)
        took = loop.time() - t0
        running = not task.done()
        release.set()
        task.cancel()
        await asyncio.wait({task}, timeout=5)
        return result, took, running

    with caplog.at_level(logging.WARNING, logger="nodewarden.drain"):
        result, took, running = asyncio.run(scenario())
    assert running  # it really ignored the cancellation
    assert result == Drained(finished=0, cancelled=1)
    assert took < 5.0  # bounded by `unwind`, not by the task
    assert "stubborn-retry" in caplog.text
