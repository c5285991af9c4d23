"""`stallwatch.StallWatch`: a callback that holds the event loop longer than the threshold
is caught with its stack (named in the lag warning), once per stall."""

from __future__ import annotations

import asyncio
import time

import pytest

from nodewarden.stallwatch import StallWatch, describe

pytestmark = pytest.mark.asyncio


def hold_the_loop_for(seconds: float) -> None:
    time.sleep(seconds)  # a stand-in for a long synchronous callback


async def test_a_stall_is_caught_with_the_function_that_held_the_loop() -> None:
    watch = StallWatch(threshold=0.3, beat=0.05)
    watch.start(asyncio.get_running_loop())
    try:
        await asyncio.sleep(0.1)
        watch.take()  # (a loaded machine may have stalled the loop already)
        hold_the_loop_for(1.5)
        await asyncio.sleep(0)
        stack = watch.take()
        assert stack is not None
        assert "hold_the_loop_for" in stack[-1]
        assert "hold_the_loop_for" in describe(stack).split(" <- ")[0]  # innermost first
        assert watch.take() is None  # once per stall
    finally:
        watch.stop()


async def test_describe_without_a_stack() -> None:
    assert describe(None) == "no stack caught"
