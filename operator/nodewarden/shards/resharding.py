"""A change of the shard count from n to m: which nodes move, and the fenced handover of
each, as steps on the node's labels that a writer checks before it writes.

    moves(keys, old, new)     -> tuple[Move, ...]   nodes whose shard changes
    plan(keys, old, new)      -> Plan               the moves' steps, and the Leases
    apply(labels, step)       -> labels             one step, or StepRefused
    acting_shard(labels)      -> int | None         whose node it is, as labels say
    may_act(labels, held)     -> bool               may the holder of `held` act on it
    label_new(key, shards)    -> Step               ASSIGN of a node nobody labelled yet
    next_step(key, labels, shards, usable) -> Step | None   the resharder's next write

The labels are the ownership record (`keys.SHARD_LABEL`, `keys.DRAIN_LABEL`). A node
moving from shard a to shard b goes through three writes, in this order, never two
owners and never skipped:

    step      writer              labels before            labels after
    DRAIN     the resharder       shard=a                  shard=a, drain=a
    RELEASE   the owner of a      shard=a, drain=a         (none)
    ASSIGN    the resharder       (none)                   shard=b

- The owner of a acts on the node while its labels say shard=a. DRAIN tells it to stop;
  it may be late to see it (its watch lags), which is safe: nobody else may act yet.
- RELEASE is written **only by the owner of a**, fenced by shard a's Lease
  (`fence.Leadership.check`), after it has stopped: no action of it on the node is in
  flight or may start (its dirty sets, due times and probes for the node dropped, its
  pending power requests settled or cancelled). The write is the proof that it stopped,
  and is conditional on the labels it read (resourceVersion): a node relabelled meanwhile
  refuses it.
- ASSIGN only once the node is unlabelled; the owner of b acts only once it sees shard=b,
  which is after RELEASE, which is after a stopped. Between RELEASE and ASSIGN the node
  has no owner (no decision is made for it: at most one resharder round, well within one
  Lease duration).
- The resharder (any replica: its writes are conditional, two of them write the same
  labels, and a stale one is refused) also labels new nodes: ASSIGN from unlabelled.

A direct relabel (shard=a to shard=b in one write) would let b act while a, not having
seen the write, still acts: the tests show the model catches exactly that.

Leases: the shards new in m are created before any ASSIGN to them (`Plan.create`); the
shards gone in m are deleted once no node carries their label (`Plan.retire`, after
every RELEASE from them). A shrink's removed shards keep their owners until then.
Pure: the caller reads and writes the labels.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from nodewarden.shards.keys import DRAIN_LABEL, SHARD_LABEL, label_value, parse_shard, shard_of

Labels = Mapping[str, str]


class StepKind(enum.Enum):
    DRAIN = "Drain"
    RELEASE = "Release"
    ASSIGN = "Assign"


WRITER = {
    StepKind.DRAIN: "resharder",
    StepKind.RELEASE: "owner",
    StepKind.ASSIGN: "resharder",
}
"""Who writes each step: RELEASE only the owner of the step's shard, under its Lease."""


@dataclass(frozen=True, slots=True)
class Move:
    key: str
    source: int
    target: int


@dataclass(frozen=True, slots=True)
class Step:
    kind: StepKind
    key: str
    shard: int
    """The shard the step is about: the source for DRAIN and RELEASE, the target for ASSIGN."""

    @property
    def writer(self) -> str:
        return WRITER[self.kind]

    def before(self) -> dict[str, str]:
        """The node's labels (ours only) the write requires."""
        value = label_value(self.shard)
        if self.kind is StepKind.DRAIN:
            return {SHARD_LABEL: value}
        if self.kind is StepKind.RELEASE:
            return {SHARD_LABEL: value, DRAIN_LABEL: value}
        return {}

    def after(self) -> dict[str, str]:
        value = label_value(self.shard)
        if self.kind is StepKind.DRAIN:
            return {SHARD_LABEL: value, DRAIN_LABEL: value}
        if self.kind is StepKind.RELEASE:
            return {}
        return {SHARD_LABEL: value}


@dataclass(frozen=True, slots=True)
class Plan:
    old: int
    new: int
    moves: tuple[Move, ...]
    create: tuple[int, ...]
    """Shard Leases to create before any ASSIGN (the ids new in `new`)."""
    retire: tuple[int, ...]
    """Shard Leases to delete once no node is labelled with them (the ids gone in `new`)."""

    def steps(self, move: Move) -> tuple[Step, Step, Step]:
        """One move's steps, in the only order they may be written."""
        return (
            Step(StepKind.DRAIN, move.key, move.source),
            Step(StepKind.RELEASE, move.key, move.source),
            Step(StepKind.ASSIGN, move.key, move.target),
        )


class StepRefused(Exception):
    """The node's labels are not what the step requires (someone wrote first)."""


def moves(keys: Iterable[str], old: int, new: int) -> tuple[Move, ...]:
    """The nodes whose shard under `new` differs from under `old`, in key order."""
    found = []
    for key in sorted(set(keys)):
        source, target = shard_of(key, old), shard_of(key, new)
        if source != target:
            found.append(Move(key, source, target))
    return tuple(found)


def plan(keys: Iterable[str], old: int, new: int) -> Plan:
    return Plan(
        old=old,
        new=new,
        moves=moves(keys, old, new),
        create=tuple(range(old, new)),
        retire=tuple(range(new, old)),
    )


def _ours(labels: Labels) -> dict[str, str]:
    return {k: v for k, v in labels.items() if k in (SHARD_LABEL, DRAIN_LABEL)}


def apply(labels: Labels, step: Step) -> dict[str, str]:
    """The node's labels after `step`; StepRefused when they are not what it requires
    (labels of others are kept untouched)."""
    if _ours(labels) != step.before():
        raise StepRefused(
            f"{step.kind.value} of {step.key} to shard {step.shard}: labels are "
            f"{_ours(labels)}, the step requires {step.before()}"
        )
    kept = {k: v for k, v in labels.items() if k not in (SHARD_LABEL, DRAIN_LABEL)}
    return {**kept, **step.after()}


def acting_shard(labels: Labels) -> int | None:
    """The shard whose owner may act on the node as its labels say: the shard label's,
    draining or not (a draining owner may still be finishing); None when unlabelled or
    the labels are malformed (a drain label naming another shard: nobody acts)."""
    shard = parse_shard(labels.get(SHARD_LABEL))
    drain = labels.get(DRAIN_LABEL)
    if drain is not None and parse_shard(drain) != shard:
        return None
    return shard


def draining(labels: Labels) -> bool:
    """The node's owner is told to stop acting and release it."""
    return DRAIN_LABEL in labels and acting_shard(labels) is not None


def may_act(labels: Labels, held: frozenset[int]) -> bool:
    """Whether a replica holding the shard Leases `held` (valid now) may act on a node with
    these labels: its shard is one of them. A draining node is still its owner's until it
    releases it (to finish or cancel what is in flight, and to write RELEASE); it starts
    nothing new there -- that is the shell's rule, this only says whose node it is."""
    shard = acting_shard(labels)
    return shard is not None and shard in held


def label_new(key: str, shards: int) -> Step:
    """The resharder's write for a node without our labels: ASSIGN to its shard."""
    return Step(StepKind.ASSIGN, key, shard_of(key, shards))


def next_step(key: str, labels: Labels, shards: int, usable: frozenset[int]) -> Step | None:
    """The resharder's next write on one node towards `shards` (None: nothing to write
    now): DRAIN a node whose label names another shard than `shard_of(key, shards)`,
    ASSIGN an unlabelled one. Never RELEASE (the owner's), never a node whose labels
    are malformed or that is draining (its owner releases it), and only towards a shard
    in `usable` (its Lease is held: the node's time without an owner stays one step).
    A node labelled with a shard outside 0..shards-1 is left as it is: the resharder's
    count is lower than the labels' (an old replica mid-rollout, or a shrink, which is
    not built) and it refuses to act on it."""
    ours = _ours(labels)
    target = shard_of(key, shards)
    if target not in usable:
        return None
    if not ours:
        return Step(StepKind.ASSIGN, key, target)
    if DRAIN_LABEL in ours:
        return None
    source = parse_shard(ours.get(SHARD_LABEL))
    if source is None or source >= shards or source == target:
        return None
    return Step(StepKind.DRAIN, key, source)
