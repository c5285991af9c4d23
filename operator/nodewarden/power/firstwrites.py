"""Which nodes' first status write waits for their start-up facts.

At start-up a node's facts arrive one source at a time: its validation verdict, the
worker pool's view of it (address, instance), its first power reading (the BMC, the cloud
list). Written as each arrived, a node cost up to four status patches before it settled.
A node that arrives while the controller is starting (before it holds the whole fleet and
the dispatcher's first plan) therefore keeps its status write back until its verdict is
known, its power is observed once or cannot be (a BMC read failing or refused -- an
invalid node's BMC is read all the same --, a side node without a BMC, an invalid cloud
VM, a cloud VM when no cloud is configured, when the cloud list was read without it --
declared, not created yet -- or when the list failed), and the answer its last step
asked for at once has been stepped (a live re-read of the queue, the recheck after a
verification closed: the decision that follows at once goes in the same write) -- or
until `hold` seconds after it arrived, whichever is first. Then one write carries all of
it (`power.round` says which facts are in).
The dispatcher's ledger is not waited for: until it is known the node's decision is a
DEFER (work unknown), written then, so the start-up's decisions are visible before the
dispatcher has recovered.

Only the *write* waits: the node is stepped as before (a DEFER for missing telemetry is
its decision in memory, its Safety Record is built), and a power request's
persist-before-send write (`NodeStatusWriter.persist`) never waits. A node that arrives
later (a VM the dispatcher creates) is written as before.

No I/O and no clock of its own: the round hands in the time and what a node's facts are.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from datetime import datetime, timedelta

FIRST_WRITE_HOLD = 20.0
"""Seconds a starting node's first status write waits at most for its facts."""


@dataclass
class FirstWrites:
    """The starting nodes whose first write waits, each with its latest release time."""

    hold: float = FIRST_WRITE_HOLD
    starting: bool = True
    """Whether nodes that arrive now are held (the controller's start-up)."""
    _waiting: dict[str, datetime] = field(default_factory=dict)
    _unobservable: set[str] = field(default_factory=set)

    def arrive(self, name: str, now: datetime) -> None:
        """Node `name` joined the fleet at `now`: held if the controller is starting."""
        if self.starting and self.hold > 0 and name not in self._waiting:
            self._waiting[name] = now + timedelta(seconds=self.hold)

    def started(self) -> None:
        """The controller holds the fleet and the ledger: later arrivals are not held."""
        self.starting = False

    def forget(self, name: str) -> None:
        self._waiting.pop(name, None)
        self._unobservable.discard(name)

    def waiting(self) -> Collection[str]:
        """The nodes whose first write still waits (a view: do not keep it)."""
        return self._waiting.keys()

    def unobservable(self, name: str) -> None:
        """Node `name`'s power will not be observed soon (a source read without it: a
        declared cloud VM the cloud list does not hold yet): released at the next
        `holding`, whatever its facts say."""
        if name in self._waiting:
            self._unobservable.add(name)

    def holding(self, now: datetime, facts_in: Callable[[str], bool]) -> set[str]:
        """The nodes whose write still waits at `now`; the others are released for good.
        `facts_in(name)`: whether node `name`'s start-up facts are all in."""
        if not self._waiting:
            return set()
        released = [
            n
            for n, at in self._waiting.items()
            if now >= at or n in self._unobservable or facts_in(n)
        ]
        for name in released:
            del self._waiting[name]
            self._unobservable.discard(name)
        return set(self._waiting)

    def soonest(self) -> datetime | None:
        """The earliest release time still waiting (the controller wakes for it)."""
        return min(self._waiting.values(), default=None)

    def __len__(self) -> int:
        return len(self._waiting)
