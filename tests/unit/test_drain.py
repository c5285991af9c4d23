"""`nodewarden.drain`: what a stopping component does with the tasks it still has."""

from __future__ import annotations

import asyncio
from typing import Any

from nodewarden.drain import drain


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
