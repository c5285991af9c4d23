"""A stopping operator exits within a deadline, whatever hangs.

A replica that lost its Lease must leave at once so its Pod is restarted and the
standby (or the restarted process) takes over; a SIGTERM must end before the kubelet's
SIGKILL. The stop path lets work under way finish (`drain.py`) and then closes adapters
-- any of which could wait forever on a peer or a task that ignores cancellation (seen
once in `bench_dispatch` on a loaded machine: the dispatcher had stopped, the process
stayed up for minutes without acting). So once stopping begins, a daemon thread waits
`seconds`; if the process is still there, it logs every thread's stack and the event
loop's unfinished tasks (what hung), then ends the process with exit code 1 (a stop that
had to be forced is a failure). Nothing it prints carries a secret: stacks and task
names name code, not values.
"""

from __future__ import annotations

import asyncio
import faulthandler
import logging
import os
import sys
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

TASKS_SHOWN = 20
"""Unfinished tasks named when the deadline passes (the rest are counted)."""


class ExitDeadline:
    """Armed when stopping begins; fires `seconds` later unless the process has ended."""

    def __init__(
        self,
        seconds: float,
        exit_now: Callable[[int], None] = os._exit,
    ) -> None:
        self.seconds = seconds
        self._exit_now = exit_now
        self._timer: threading.Timer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.fired = threading.Event()

    def arm(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Start the countdown (once; later calls change nothing)."""
        if self._timer is not None:
            return
        self._loop = loop
        self._timer = threading.Timer(self.seconds, self._fire)
        self._timer.daemon = True
        self._timer.name = "exit-deadline"
        self._timer.start()

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def _fire(self) -> None:
        code = 1
        log.error(
            "still stopping %.0fs after the stop began: exiting now (exit code %d); the "
            "stacks of every thread and the unfinished tasks follow on stderr",
            self.seconds,
            code,
        )
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        for line in unfinished_tasks(self._loop):
            print(line, file=sys.stderr)
        sys.stderr.flush()
        logging.shutdown()
        self.fired.set()
        self._exit_now(code)


def unfinished_tasks(loop: asyncio.AbstractEventLoop | None) -> list[str]:
    """One line per unfinished task of `loop`: its name and where its coroutine waits.
    Read from another thread while the loop may run: best effort (a set that changes
    size while read is read again, at most three times)."""
    if loop is None:
        return []
    for _ in range(3):
        try:
            tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
            break
        except RuntimeError:
            continue
    else:
        return ["(the task set kept changing: not listed)"]
    lines = [f"{len(tasks)} unfinished task(s):"]
    for task in tasks[:TASKS_SHOWN]:
        frames = task.get_stack(limit=1)
        where = "?"
        if frames:
            code = frames[-1].f_code
            where = f"{code.co_filename}:{frames[-1].f_lineno} {code.co_name}"
        lines.append(f"  {task.get_name()}: {task.get_coro()!r:.120} at {where}")
    if len(tasks) > TASKS_SHOWN:
        lines.append(f"  ... and {len(tasks) - TASKS_SHOWN} more")
    return lines
