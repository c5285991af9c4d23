"""`cooperate.Turns`: a long loop shares the event loop every budget; a short pass (within
`after` items) stays whole."""

from __future__ import annotations

import asyncio
import time

import pytest

from nodewarden.cooperate import Turns

pytestmark = pytest.mark.asyncio


def busy(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


async def _pass(items: int, each: float, turns: Turns) -> list[int]:
    """Run a pass while another task counts its own turns; the count seen at each item."""
    ticks = 0
    stop = asyncio.Event()

    async def other() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(other())
    await asyncio.sleep(0)
    seen = []
    start = ticks
    for _ in range(items):
        await turns.share()
        busy(each)
        seen.append(ticks - start)
    stop.set()
    await task
    return seen


async def test_a_long_pass_lets_others_run_every_budget() -> None:
    turns = Turns(budget=0.01)
    seen = await _pass(items=60, each=0.002, turns=turns)  # 120 ms of work
    assert turns.taken >= 3
    assert seen[-1] >= turns.taken  # the other task ran at each turn


async def test_a_short_pass_stays_whole() -> None:
    turns = Turns(budget=0.001, after=20)
    seen = await _pass(items=20, each=0.002, turns=turns)
    assert turns.taken == 0 and seen[-1] == 0  # nobody else ran inside the pass
