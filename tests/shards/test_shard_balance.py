"""`shards.balance`: every replica that sees the same Lease records computes the same
assignment, no replica is given more than ceil(shards / live replicas), no two replicas
try to take the same free shard, only the shards that must move move, and replicas
acting round after round on what they see reach a fixed point without a shard changing
hands twice -- also after a replica dies or joins."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodewarden.shards.balance import LeaseSeen, View, assignment, cap, decide, live_replicas

DURATION = 15.0
NOW = 1000.0
NAMES = [f"replica-{i}" for i in range(7)]


@dataclass
class World:
    """Lease records as the API server holds them; every replica sees all of them (the
    same view), a dead replica's records stopped changing long ago."""

    shards: int
    alive: set[str]
    dead: set[str]
    owner: dict[int, str | None]

    def seen(self, holder: str | None) -> LeaseSeen:
        stale = holder in self.dead
        return LeaseSeen(holder, NOW - (DURATION + 1 if stale else 1), DURATION)

    def view(self, me: str) -> View:
        return View(
            me=me,
            shards=self.shards,
            held=frozenset(s for s, o in self.owner.items() if o == me),
            leases={s: self.seen(o) for s, o in self.owner.items()},
            members={r: self.seen(r) for r in self.alive | self.dead},
            now=NOW,
        )

    def live_owner(self, shard: int) -> str | None:
        holder = self.owner.get(shard)
        return holder if holder in self.alive else None

    def round(self) -> list[tuple[int, str | None, str]]:
        """Every live replica decides on the same snapshot; releases, then acquisitions
        (two takers of one shard would be a failure of agreement). The changes made."""
        decisions = {r: decide(self.view(r)) for r in sorted(self.alive)}
        takers: dict[int, list[str]] = {}
        for replica, decision in decisions.items():
            for shard in decision.acquire:
                takers.setdefault(shard, []).append(replica)
        assert all(len(t) == 1 for t in takers.values()), f"two takers: {takers}"
        changes: list[tuple[int, str | None, str]] = []
        for replica, decision in decisions.items():
            for shard in decision.release:
                assert self.owner[shard] == replica
                self.owner[shard] = None
        for shard, (taker,) in takers.items():
            assert self.live_owner(shard) is None, "took a shard a live replica holds"
            changes.append((shard, self.owner.get(shard), taker))
            self.owner[shard] = taker
        return changes

    def settle(self, limit: int = 4) -> list[tuple[int, str | None, str]]:
        changes: list[tuple[int, str | None, str]] = []
        for _ in range(limit):
            if all(decide(self.view(r)).idle for r in self.alive):
                return changes
            changes += self.round()
        raise AssertionError(f"no fixed point after {limit} rounds: {self.owner}")

    def check_balanced(self) -> None:
        bound = math.ceil(self.shards / len(self.alive))
        assert all(self.live_owner(s) is not None for s in range(self.shards)), self.owner
        load = Counter(self.owner[s] for s in range(self.shards))
        assert max(load.values()) <= bound, (load, bound)


@st.composite
def worlds(draw: st.DrawFn) -> World:
    shards = draw(st.integers(1, 12))
    count = draw(st.integers(1, len(NAMES)))
    names = NAMES[:count]
    alive = set(draw(st.lists(st.sampled_from(names), min_size=1, unique=True)))
    dead = set(names) - alive
    owner = {s: draw(st.sampled_from([None, *names])) for s in range(shards)}
    return World(shards, alive, dead, owner)


def excess(world: World) -> int:
    """Shards that must move: the excess of live replicas over the cap, and every shard
    with no live owner."""
    bound = cap(world.shards, len(world.alive))
    load = Counter(world.live_owner(s) for s in range(world.shards))
    unowned = load.pop(None, 0)
    return unowned + sum(max(0, n - bound) for n in load.values())


@settings(max_examples=100, deadline=None)
@given(world=worlds())
def test_every_replica_computes_the_same_bounded_assignment(world: World) -> None:
    views = {r: world.view(r) for r in world.alive}
    plans = {r: assignment(v) for r, v in views.items()}
    first = next(iter(plans.values()))
    assert all(p == first for p in plans.values()), "replicas disagree"
    assert set(first) == set(range(world.shards))
    assert set(first.values()) <= world.alive
    bound = cap(world.shards, len(world.alive))
    assert max(Counter(first.values()).values()) <= bound
    for r, v in views.items():
        assert live_replicas(v) == world.alive, r


@settings(max_examples=100, deadline=None)
@given(world=worlds())
def test_only_the_excess_moves_and_nobody_flaps(world: World) -> None:
    must = excess(world)
    before = {s: world.live_owner(s) for s in range(world.shards)}
    changes = world.settle()
    world.check_balanced()
    moved = [s for s in range(world.shards) if world.owner[s] != before[s]]
    assert len(moved) == must, (before, world.owner)
    changed = Counter(shard for shard, _, _ in changes)
    assert all(n == 1 for n in changed.values()), f"a shard changed hands twice: {changes}"


@settings(max_examples=60, deadline=None)
@given(world=worlds(), data=st.data())
def test_a_death_moves_only_the_dead_replicas_shards(world: World, data: st.DataObject) -> None:
    world.settle()
    if len(world.alive) < 2:
        return
    victim = data.draw(st.sampled_from(sorted(world.alive)))
    theirs = {s for s, o in world.owner.items() if o == victim}
    before = dict(world.owner)
    world.alive.discard(victim)
    world.dead.add(victim)
    world.settle()
    world.check_balanced()
    moved = {s for s in range(world.shards) if world.owner[s] != before[s]}
    assert moved == theirs


@settings(max_examples=60, deadline=None)
@given(world=worlds())
def test_a_join_moves_only_what_the_new_cap_forces(world: World) -> None:
    world.settle()
    newcomer = "replica-new"
    world.alive.add(newcomer)
    must = excess(world)
    before = dict(world.owner)
    world.settle()
    world.check_balanced()
    assert sum(world.owner[s] != before[s] for s in range(world.shards)) == must


def test_a_third_replica_takes_the_fifth_shard_not_a_held_one() -> None:
    world = World(5, {"a", "b"}, set(), {0: "a", 1: "a", 2: "b", 3: "b", 4: "a"})
    world.alive.add("c")  # cap 2: a gives one shard up, c takes it
    assert decide(world.view("c")).acquire == ()
    release = decide(world.view("a")).release
    assert len(release) == 1
    world.settle()
    assert Counter(world.owner.values()) == {"a": 2, "b": 2, "c": 1}
    assert world.owner[release[0]] == "c"


def test_a_lapsed_leadership_of_ours_is_taken_again_not_counted_as_owned() -> None:
    view = View(
        me="a",
        shards=2,
        held=frozenset({1}),
        leases={0: LeaseSeen("a", NOW - 1, DURATION), 1: LeaseSeen("a", NOW - 1, DURATION)},
        now=NOW,
    )
    assert decide(view).acquire == (0,)


def test_a_record_never_seen_change_is_live_and_a_released_one_free() -> None:
    assert LeaseSeen("b", None, DURATION).live_holder(NOW) == "b"
    assert LeaseSeen("b", NOW - DURATION, DURATION).live_holder(NOW) is None
    assert LeaseSeen(None, NOW, DURATION).live_holder(NOW) is None
    assert LeaseSeen("", NOW, DURATION).live_holder(NOW) is None


def test_held_shards_outside_the_count_are_refused() -> None:
    with pytest.raises(ValueError):
        View(me="a", shards=2, held=frozenset({2}))
