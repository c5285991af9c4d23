"""What the power controller has to do next, without a scan of the fleet: the nodes with
events (the dirty set) and a heap of due times per kind of timer.

A round steps only the nodes `Agenda.take` names: those with events since the last round
(an `EventQueue` marks its node dirty when an event is appended), those whose recheck
time has come (`Timer.STEP`, `NodeRuntime.due_at`) and those whose decisive telemetry
expires (`Timer.EXPIRY`, `NodeRuntime.expires_at`: stale evidence is judged at its due
time, not at the next scan). The BMC reads and capability discoveries are due times too
(`Timer.POLL`, `Timer.DISCOVER`), taken by `Sensing`, and so is the next write of its
energy figures (`Timer.ENERGY`, `power.energy`). A node at rest costs nothing until
one of its times comes.

The heaps are lazy: setting a timer attribute on a bound `NodeRuntime` pushes an entry,
and an entry whose time is no longer the node's current one is dropped when it reaches
the top (`due`, `soonest`). `compact` rebuilds a heap grown past a few entries per node.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterable
from datetime import datetime
from enum import Enum
from itertools import count
from typing import Any


class Timer(Enum):
    """The due times a node may hold, by the `NodeRuntime` attribute that holds each."""

    STEP = "due_at"
    EXPIRY = "expires_at"
    POLL = "next_poll"
    DISCOVER = "next_discovery"
    ENERGY = "energy_due"


TIMER_OF_ATTRIBUTE: dict[str, Timer] = {t.value: t for t in Timer}

Current = Callable[[str], datetime | None]
"""A timer's current value for node `name` (None: none, or the node is gone)."""

_COMPACT_PER_NODE = 4
"""A heap longer than this many entries per node (plus a margin) is rebuilt."""


class Agenda:
    """The dirty set and the due-time heaps of one power controller."""

    def __init__(self) -> None:
        self._dirty: set[str] = set()
        self._heaps: dict[Timer, list[tuple[datetime, int, str]]] = {t: [] for t in Timer}
        self._seq = count()
        self.roster_changed = True
        """A node came or went since the last round (the fleet gauges are recounted)."""

    # -- input ----------------------------------------------------------------------

    def mark(self, name: str) -> None:
        """Node `name` has an event to step."""
        self._dirty.add(name)

    def push(self, timer: Timer, at: datetime, name: str) -> None:
        """Node `name`'s `timer` is now `at` (earlier entries for it become stale)."""
        heapq.heappush(self._heaps[timer], (at, next(self._seq), name))

    # -- output ---------------------------------------------------------------------

    @property
    def dirty(self) -> bool:
        return bool(self._dirty)

    def take_dirty(self) -> set[str]:
        taken, self._dirty = self._dirty, set()
        return taken

    def due(self, timer: Timer, now: datetime, current: Current) -> set[str]:
        """Pop the nodes whose `timer` is due at `now` (their current value, not a stale
        entry's)."""
        heap = self._heaps[timer]
        out: set[str] = set()
        while heap and heap[0][0] <= now:
            at, _, name = heapq.heappop(heap)
            if current(name) == at:
                out.add(name)
        return out

    def soonest(self, timer: Timer, current: Current) -> datetime | None:
        """The earliest current `timer` of any node (stale entries at the top dropped)."""
        heap = self._heaps[timer]
        while heap:
            at, _, name = heap[0]
            if current(name) == at:
                return at
            heapq.heappop(heap)
        return None

    def compact(
        self, nodes: int, current: Callable[[Timer], Iterable[tuple[str, datetime]]]
    ) -> None:
        """Rebuild every heap longer than a few entries per node from the current values."""
        limit = _COMPACT_PER_NODE * nodes + 64
        for timer, heap in self._heaps.items():
            if len(heap) > limit:
                fresh = [(at, next(self._seq), name) for name, at in current(timer)]
                heapq.heapify(fresh)
                self._heaps[timer] = fresh

    def size(self, timer: Timer) -> int:
        return len(self._heaps[timer])


class EventQueue(deque[Any]):
    """A node's events; appending one marks the node dirty on its agenda (once bound)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.agenda: Agenda | None = None
        self.name = ""

    def append(self, item: Any) -> None:
        super().append(item)
        if self.agenda is not None:
            self.agenda.mark(self.name)

    def extend(self, items: Iterable[Any]) -> None:
        super().extend(items)
        if self.agenda is not None and self:
            self.agenda.mark(self.name)

    def appendleft(self, item: Any) -> None:
        super().appendleft(item)
        if self.agenda is not None:
            self.agenda.mark(self.name)
