"""How the background tasks of the dispatcher and the power controller end when the operator stops.

A stopping operator (SIGTERM) lets what is already under way finish -- a status write, a
runner start and the write that records it, a power request and its Safety Record -- for
up to `shutdown_grace`, and cancels what is left after that. Every write is one request,
so a cancelled one was applied whole or not at all, and the persisted state (container
phases, power transition ids) lets the next leader finish the rest either way. A replica
that lost its lease drains with no grace: another replica may already be acting.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

UNWIND = 5.0
"""Seconds cancelled tasks get to unwind (run their finally blocks) before the stop goes on."""


@dataclass(frozen=True)
class Drained:
    """What became of the tasks a stopping component still had."""

    finished: int
    cancelled: int


async def drain(
    tasks: Collection[asyncio.Task[Any]], grace: float, unwind: float = UNWIND
) -> Drained:
    """Wait up to `grace` seconds for `tasks` (a live set: tasks they spawn meanwhile are
    waited for too), then cancel the rest and wait up to `unwind` seconds for them to
    unwind (those that do not are named in a warning and left)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max(0.0, grace)
    finished = 0
    while True:
        pending = {t for t in tasks if not t.done()}
        left = deadline - loop.time()
        if not pending or left <= 0:
            break
        done, _ = await asyncio.wait(pending, timeout=left)
        finished += len(done)
    pending = {t for t in tasks if not t.done()}
    for task in pending:
        task.cancel()
    if pending:
        # bounded: a task that ignores its cancellation must not hold the stop up (the
        # process's exit deadline, `exitdeadline.py`, is the last resort)
        unwound, stuck = await asyncio.wait(pending, timeout=unwind)
        for task in unwound:
            if not task.cancelled():
                task.exception()  # retrieved: an error while unwinding is not news
        if stuck:
            log.warning(
                "%d task(s) had not unwound %.0fs after their cancellation: %s",
                len(stuck),
                unwind,
                ", ".join(sorted(t.get_name() for t in stuck)[:10]),
            )
    return Drained(finished=finished, cancelled=len(pending))
