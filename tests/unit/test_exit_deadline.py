"""`exitdeadline.ExitDeadline`: a stop that hangs ends the process at its deadline, with
the stacks of what hung; a stop that ends in time is left alone."""

from __future__ import annotations

import asyncio
import threading

import pytest

from nodewarden.exitdeadline import ExitDeadline, unfinished_tasks

pytestmark = pytest.mark.asyncio


async def hung_forever(gate: asyncio.Event) -> None:
    await gate.wait()


async def test_a_hung_stop_is_ended_at_the_deadline_with_what_hung(
    capfd: pytest.CaptureFixture[str],
) -> None:
    exits: list[int] = []
    ended = threading.Event()

    def exit_now(code: int) -> None:  # in place of os._exit
        exits.append(code)
        ended.set()

    gate = asyncio.Event()
    task = asyncio.create_task(hung_forever(gate), name="hung-close")
    deadline = ExitDeadline(0.2, exit_now=exit_now)
    deadline.arm(asyncio.get_running_loop())
    deadline.arm(asyncio.get_running_loop())  # a second arm changes nothing
    assert await asyncio.to_thread(ended.wait, 30.0)
    assert exits == [1]
    err = capfd.readouterr().err
    assert "hung-close" in err and "hung_forever" in err
    assert "Thread" in err or "thread" in err  # faulthandler's stacks of every thread
    gate.set()
    await task


async def test_a_stop_that_ends_in_time_is_not_ended() -> None:
    exits: list[int] = []
    deadline = ExitDeadline(0.3, exit_now=exits.append)
    deadline.arm(asyncio.get_running_loop())
    deadline.disarm()
    await asyncio.sleep(0.6)
    assert exits == [] and not deadline.fired.is_set()


async def test_no_loop_no_tasks() -> None:
    assert unfinished_tasks(None) == []
