"""Periodic background tasks of the side-node double: run a step every N seconds, stop cleanly.

A failing step is logged and the next one still runs (a double must not die of one bad
tick); `cancel` stops a task and waits for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Awaitable, Callable

logger = logging.getLogger(__name__)

Step = Callable[[], Awaitable[None] | None]


def every(interval: float, step: Step, label: str) -> asyncio.Task[None]:
    """Start a task that calls ``step`` (sync or async) every ``interval`` seconds."""
    if interval <= 0:
        raise ValueError("interval must be > 0")

    async def forever() -> None:
        while True:
            try:
                result = step()
                if inspect.isawaitable(result):
                    await result
            except Exception:
                logger.exception("%s failed", label)
            await asyncio.sleep(interval)

    return asyncio.get_running_loop().create_task(forever(), name=label)


async def cancel(task: asyncio.Task[None] | None) -> None:
    """Cancel ``task`` (if any) and wait until it has ended."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
