"""`shards.resharding`: the plan from n to m shards moves exactly the nodes whose shard
changes, and its handover (DRAIN by the resharder, RELEASE by the old owner only once it
has seen the drain, ASSIGN by the resharder) never lets two shard owners act on one node
in any interleaving of the steps and of the owners' (lagging) observations; the model
that checks this catches a direct relabel."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodewarden.shards.keys import DRAIN_LABEL, SHARD_LABEL, node_key, shard_of
from nodewarden.shards.resharding import (
    Move,
    Plan,
    Step,
    StepKind,
    StepRefused,
    acting_shard,
    apply,
    draining,
    label_new,
    may_act,
    moves,
    plan,
)

Labels = dict[str, str]


@dataclass
class Fleet:
    """The API server's labels and each shard owner's last observation of them (a watch
    that may lag any amount). An owner acts on a node while what it last saw names its
    shard; it writes RELEASE only after it has seen the drain, and then knows the node is
    no longer its own."""

    plan: Plan
    direct: bool = False
    """A broken plan for the canary: one write from shard=a to shard=b."""
    labels: dict[str, Labels] = field(default_factory=dict)
    belief: dict[int, dict[str, Labels]] = field(default_factory=dict)
    done: dict[str, int] = field(default_factory=dict)
    """Per moving node, the steps written so far."""

    def __post_init__(self) -> None:
        keys = [m.key for m in self.plan.moves]
        self.labels = {k: {SHARD_LABEL: str(shard_of(k, self.plan.old)), "team": "x"} for k in keys}
        owners = range(max(self.plan.old, self.plan.new))
        self.belief = {o: {k: dict(v) for k, v in self.labels.items()} for o in owners}
        self.done = dict.fromkeys(keys, 0)

    def steps(self, move: Move) -> tuple[Step, ...]:
        return self.plan.steps(move) if not self.direct else (Step(StepKind.ASSIGN, move.key, -1),)

    def enabled(self) -> list[tuple[str, int, str]]:
        actions = [("observe", o, k) for o in self.belief for k in self.labels]
        for move in self.plan.moves:
            if self.done[move.key] == len(self.steps(move)):
                continue
            step = self.steps(move)[self.done[move.key]]
            if step.writer == "owner" and not draining(self.belief[move.source][move.key]):
                continue  # the owner has not seen the drain yet: it does not release
            actions.append(("step", -1, move.key))
        return actions

    def act(self, action: tuple[str, int, str]) -> None:
        kind, owner, key = action
        if kind == "observe":
            self.belief[owner][key] = dict(self.labels[key])
            return
        move = next(m for m in self.plan.moves if m.key == key)
        step = self.steps(move)[self.done[key]]
        if self.direct:
            self.labels[key] = {"team": "x", SHARD_LABEL: str(move.target)}
        else:
            self.labels[key] = apply(self.labels[key], step)
            if step.writer == "owner":
                self.belief[move.source][key] = dict(self.labels[key])  # its own write
        self.done[key] += 1

    def acting(self, key: str) -> list[int]:
        return [o for o, seen in self.belief.items() if acting_shard(seen[key]) == o]

    def check(self) -> None:
        for key in self.labels:
            assert len(self.acting(key)) <= 1, f"{key}: two owners act: {self.acting(key)}"

    def run(self, choices: list[tuple[bool, int]]) -> None:
        """Each choice: a write (True) or an observation, and which of those enabled."""
        self.check()
        for write, pick in choices:
            actions = [a for a in self.enabled() if (a[0] == "step") == write]
            if actions:
                self.act(actions[pick % len(actions)])
                self.check()
        # then everything left, in order, every owner catching up after each write
        while any(self.done[m.key] < len(self.steps(m)) for m in self.plan.moves):
            for owner in self.belief:
                for key in self.labels:
                    self.act(("observe", owner, key))
            steps = [a for a in self.enabled() if a[0] == "step"]
            assert steps, "the plan is stuck"
            self.act(steps[0])
            self.check()
        for owner in self.belief:
            for key in self.labels:
                self.act(("observe", owner, key))


@st.composite
def plans(draw: st.DrawFn) -> Plan:
    names = draw(st.lists(st.text("abcdefgh", min_size=1, max_size=4), max_size=8, unique=True))
    old, new = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    return plan([node_key("fleet", n) for n in names], old, new)


@settings(max_examples=200, deadline=None)
@given(p=plans(), choices=st.lists(st.tuples(st.booleans(), st.integers(0, 99)), max_size=80))
def test_no_interleaving_gives_a_node_two_owners(p: Plan, choices: list[tuple[bool, int]]) -> None:
    fleet = Fleet(p)
    fleet.run(choices)
    for move in p.moves:
        assert fleet.labels[move.key] == {"team": "x", SHARD_LABEL: str(move.target)}
        assert fleet.acting(move.key) == [move.target]


def test_the_model_catches_a_direct_relabel() -> None:
    key = next(
        node_key("fleet", f"n{i}")
        for i in range(100)
        if shard_of(node_key("fleet", f"n{i}"), 2) != shard_of(node_key("fleet", f"n{i}"), 3)
    )
    fleet = Fleet(plan([key], 2, 3), direct=True)
    move = fleet.plan.moves[0]
    fleet.act(("step", -1, key))  # shard=a -> shard=b in one write
    fleet.act(("observe", move.target, key))  # b sees it; a has not yet
    with pytest.raises(AssertionError, match="two owners"):
        fleet.check()


@settings(max_examples=100, deadline=None)
@given(p=plans())
def test_the_plan_moves_exactly_the_nodes_whose_shard_changes(p: Plan) -> None:
    keys = [m.key for m in p.moves]
    assert all(
        shard_of(m.key, p.old) == m.source != m.target == shard_of(m.key, p.new) for m in p.moves
    )
    assert len(set(keys)) == len(keys)
    assert p.create == tuple(range(p.old, max(p.old, p.new)))
    assert p.retire == tuple(range(p.new, max(p.old, p.new)))
    assert all(m.target in p.create or m.source in p.retire for m in p.moves)


def test_steps_and_who_writes_them() -> None:
    move = Move("fleet/a", 1, 3)
    drain, release, assign = Plan(2, 4, (move,), (2, 3), ()).steps(move)
    assert [s.writer for s in (drain, release, assign)] == ["resharder", "owner", "resharder"]
    labels = apply({SHARD_LABEL: "1", "app": "gpu"}, drain)
    assert labels == {SHARD_LABEL: "1", DRAIN_LABEL: "1", "app": "gpu"}
    assert acting_shard(labels) == 1 and draining(labels)
    labels = apply(labels, release)
    assert labels == {"app": "gpu"} and acting_shard(labels) is None
    assert apply(labels, assign) == {SHARD_LABEL: "3", "app": "gpu"}


@pytest.mark.parametrize(
    ("labels", "kind"),
    [
        ({}, StepKind.DRAIN),  # already released: a stale resharder's drain
        ({SHARD_LABEL: "1"}, StepKind.RELEASE),  # not drained: the owner may not release
        ({SHARD_LABEL: "2"}, StepKind.ASSIGN),  # still owned: never relabelled directly
        ({SHARD_LABEL: "2", DRAIN_LABEL: "2"}, StepKind.RELEASE),  # another shard's node
    ],
)
def test_a_step_on_labels_it_does_not_expect_is_refused(labels: Labels, kind: StepKind) -> None:
    with pytest.raises(StepRefused):
        apply(labels, Step(kind, "fleet/a", 1))


def test_a_drain_label_naming_another_shard_stops_everyone() -> None:
    assert acting_shard({SHARD_LABEL: "1", DRAIN_LABEL: "2"}) is None
    assert not draining({SHARD_LABEL: "1", DRAIN_LABEL: "2"})


def test_no_moves_when_the_count_stays() -> None:
    assert moves([node_key("f", str(i)) for i in range(50)], 3, 3) == ()


def test_who_may_act() -> None:
    assert may_act({SHARD_LABEL: "1"}, frozenset({1, 2}))
    assert may_act({SHARD_LABEL: "1", DRAIN_LABEL: "1"}, frozenset({1}))  # until it releases
    assert not may_act({SHARD_LABEL: "1"}, frozenset({0, 2}))
    assert not may_act({}, frozenset({0, 1, 2}))
    assert not may_act({SHARD_LABEL: "1", DRAIN_LABEL: "2"}, frozenset({1, 2}))


def test_a_new_node_is_assigned_to_its_shard_only_while_unlabelled() -> None:
    key = node_key("fleet", "new-node")
    step = label_new(key, 3)
    assert apply({"app": "gpu"}, step) == {"app": "gpu", SHARD_LABEL: str(shard_of(key, 3))}
    with pytest.raises(StepRefused):
        apply({SHARD_LABEL: "0"}, step)  # someone labelled it first
