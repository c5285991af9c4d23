"""`power.firstwrites`: a starting node's first status write waits for its facts, at most
`hold` seconds; nodes that arrive after the start-up are never held."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from nodewarden.power.firstwrites import FirstWrites

T0 = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def test_a_starting_node_is_held_until_its_facts_are_in() -> None:
    first = FirstWrites(hold=20.0)
    first.arrive("a", T0)
    first.arrive("b", T0)
    facts_in = {"a": False, "b": True}
    assert first.holding(T0, facts_in.__getitem__) == {"a"}
    assert first.holding(T0 + timedelta(seconds=5), facts_in.__getitem__) == {"a"}
    facts_in["a"] = True
    assert first.holding(T0 + timedelta(seconds=6), facts_in.__getitem__) == set()
    # released for good: a fact that goes missing again does not hold it a second time
    facts_in["a"] = False
    assert first.holding(T0 + timedelta(seconds=7), facts_in.__getitem__) == set()
    assert len(first) == 0 and first.soonest() is None


def test_a_node_whose_facts_never_come_is_released_at_the_hold() -> None:
    first = FirstWrites(hold=20.0)
    first.arrive("slow", T0)
    never = lambda _name: False  # noqa: E731
    assert first.soonest() == T0 + timedelta(seconds=20)
    assert first.holding(T0 + timedelta(seconds=19.9), never) == {"slow"}
    assert first.holding(T0 + timedelta(seconds=20), never) == set()


def test_nodes_arriving_after_the_start_up_or_with_no_hold_are_written_at_once() -> None:
    first = FirstWrites(hold=20.0)
    first.started()
    first.arrive("late", T0)
    assert first.holding(T0, lambda _name: False) == set()
    off = FirstWrites(hold=0.0)
    off.arrive("a", T0)
    assert off.holding(T0, lambda _name: False) == set()


def test_a_node_that_leaves_is_forgotten() -> None:
    first = FirstWrites(hold=20.0)
    first.arrive("gone", T0)
    first.forget("gone")
    assert first.holding(T0, lambda _name: False) == set()


def test_a_node_whose_power_cannot_be_observed_is_released_at_the_next_look() -> None:
    first = FirstWrites(hold=20.0)
    first.arrive("declared", T0)
    first.arrive("listed", T0)
    first.unobservable("declared")
    first.unobservable("stranger")  # not waiting: nothing to release
    never = lambda _name: False  # noqa: E731
    assert set(first.waiting()) == {"declared", "listed"}
    assert first.holding(T0, never) == {"listed"}
    assert set(first.waiting()) == {"listed"}
