"""What the event loop was doing when it stalled.

Every decision, probe and Lease renewal of the operator runs on one asyncio loop; a
callback that holds it for seconds delays all of them (the Lease is given up when a
stall outlasts its margin, `fence.py`). The lag alone says *that* the loop stalled; this
module says *where*: the loop stamps a heartbeat every `beat` seconds, and a daemon
thread that sees the stamp older than `threshold` takes the loop thread's Python stack
once for that stall (`sys._current_frames`, no signal, no profiler). The loop's own
lag watch (`service.watch_loop_lag`) logs the stack with its warning once the loop runs
again. Cost: one wake-up of the thread and one loop callback per `beat`.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
import traceback

STACK_FRAMES = 12
"""Innermost frames kept of a stalled loop's stack (enough to name the callback)."""


class StallWatch:
    """A heartbeat on the loop and a thread that catches the loop thread's stack when
    the heartbeat stops for longer than `threshold` seconds."""

    def __init__(self, threshold: float = 1.0, beat: float = 0.25) -> None:
        self.threshold = threshold
        self.beat = beat
        self._stamp = time.monotonic()
        self._loop_thread: int | None = None
        self._caught: list[str] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the heartbeat on `loop` (call from the loop's thread) and the thread."""
        self._loop = loop
        self._loop_thread = threading.get_ident()
        self._stamp = time.monotonic()
        self._tick()
        self._thread = threading.Thread(target=self._watch, name="stall-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._handle is not None:
            self._handle.cancel()

    def take(self) -> list[str] | None:
        """The stack caught during the last stall (innermost frame last), once."""
        caught, self._caught = self._caught, None
        return caught

    def _tick(self) -> None:
        self._stamp = time.monotonic()
        if not self._stop.is_set() and self._loop is not None:
            self._handle = self._loop.call_later(self.beat, self._tick)

    def _watch(self) -> None:
        taken_for: float | None = None
        while not self._stop.wait(self.beat):
            stamp = self._stamp
            if time.monotonic() - stamp <= self.threshold or taken_for == stamp:
                continue
            taken_for = stamp  # one stack per stall
            frame = sys._current_frames().get(self._loop_thread or 0)
            if frame is None:
                continue
            summary = traceback.extract_stack(frame)[-STACK_FRAMES:]
            self._caught = [f"{f.filename}:{f.lineno} {f.name}" for f in summary]


def describe(stack: list[str] | None) -> str:
    """The caught stack as one log-friendly string (innermost frame first)."""
    if not stack:
        return "no stack caught"
    return " <- ".join(reversed([_short(line) for line in stack]))


def _short(line: str) -> str:
    """A frame without the site-packages / source-root prefix of its path."""
    for marker in ("site-packages/", "operator/", "lib/python3"):
        at = line.find(marker)
        if at >= 0:
            return line[at + len(marker) :]
    return line
