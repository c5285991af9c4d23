"""The worker state machine: `Worker.move` allows exactly the transitions of `TRANSITIONS`;
whatever sequence of moves is asked for, the state only ever follows the table."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from nodewarden.pool.worker import TRANSITIONS, PoolState, Worker

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _worker() -> Worker:
    return Worker(name="vm-1", instance_type=None, created_at=T0)


def test_the_table_covers_every_state_and_gone_is_final() -> None:
    assert set(TRANSITIONS) == set(PoolState)
    assert TRANSITIONS[PoolState.GONE] == frozenset()
    assert _worker().state is PoolState.BOOTING


@given(st.lists(st.sampled_from(list(PoolState)), max_size=30))
def test_random_moves_only_follow_the_table(moves: list[PoolState]) -> None:
    worker = _worker()
    for to in moves:
        before = worker.state
        allowed = to is before or to in TRANSITIONS[before]
        assert worker.move(to, "test") is allowed
        assert worker.state is (to if allowed else before)
        assert worker.ready is (worker.state is PoolState.READY)


def test_a_late_probe_cannot_revive_a_node_being_shut_down() -> None:
    worker = _worker()
    assert worker.move(PoolState.READY, "probe")
    assert worker.move(PoolState.SHUTTING_DOWN, "idle")
    assert not worker.move(PoolState.READY, "a probe that was in flight")
    assert worker.state is PoolState.SHUTTING_DOWN
    assert not worker.probing
