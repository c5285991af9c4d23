"""The cross-process admission protocol of docs/sharding.md section 2, as a model: the
leader's start (lock write naming node X, then a read of X's admission) and the shard
owner's shutdown (admission write, then a read of the containers on X) over a
linearizable store, in every interleaving of their four operations. Never both a runner
start on X and a power-off of X that did not see the container; the same model with the
reads served from a stale cache (the informer, not a quorum read) lets both through, so
the check is known to catch the bug. Not the live code yet: the protocol it will follow."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import pytest

LEADER = ("lock", "read_admission")
OWNER = ("close", "read_demand")


@dataclass
class Store:
    """etcd as both sides see it: every write, and what a read returns."""

    admission_closed: bool = False
    locked_on_x: bool = False
    stale: bool = False
    """Reads answered from a cache that has seen no write since the race began."""
    log: list[str] = field(default_factory=list)

    def read_admission_closed(self) -> bool:
        return False if self.stale else self.admission_closed

    def read_locked_on_x(self) -> bool:
        return False if self.stale else self.locked_on_x


def run(order: tuple[str, ...], stale: bool) -> tuple[bool, bool]:
    """(runner started on X, power-off sent to X) for one interleaving."""
    store = Store(stale=stale)
    started = powered_off = False
    for op in order:
        if op == "lock":
            store.locked_on_x = True
        elif op == "read_admission":
            started = not store.read_admission_closed()
        elif op == "close":
            store.admission_closed = True
        elif op == "read_demand":
            powered_off = not store.read_locked_on_x()
    return started, powered_off


def interleavings() -> list[tuple[str, ...]]:
    """Every order of the four operations that keeps each side's own order."""
    orders = []
    for leader_slots in itertools.combinations(range(4), 2):
        leader, owner = iter(LEADER), iter(OWNER)
        orders.append(tuple(next(leader) if i in leader_slots else next(owner) for i in range(4)))
    return orders


def test_there_are_six_interleavings() -> None:
    assert len(set(interleavings())) == 6


@pytest.mark.parametrize("order", interleavings())
def test_a_start_and_a_shutdown_never_both_go(order: tuple[str, ...]) -> None:
    started, powered_off = run(order, stale=False)
    assert not (started and powered_off), order


def test_with_cached_reads_both_go_in_some_interleaving() -> None:
    both = [o for o in interleavings() if all(run(o, stale=True))]
    assert both, "the canary should find the store-buffering outcome"


def test_each_side_goes_when_it_runs_alone_first() -> None:
    assert run(LEADER + OWNER, stale=False) == (True, False)
    assert run(OWNER + LEADER, stale=False) == (False, True)
