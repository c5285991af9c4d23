"""Which shard Leases this replica should acquire or release: at most ceil(shards / live
replicas) each, decided the same way on every replica that sees the same Lease records.

    LeaseSeen(holder, changed_at, duration)     one Lease record as this replica saw it
    View(me, shards, held, leases, members, now)
    live_replicas(view)     -> frozenset[str]
    cap(shards, replicas)   -> int           ceil(shards / replicas)
    assignment(view)        -> dict[int, str]  every shard's owner-to-be
    decide(view)            -> Decision      this replica's releases and acquisitions

**Liveness by our own clock.** A Lease's holder is live while the record has changed
within its `leaseDurationSeconds` by *this* replica's monotonic clock (`changed_at`, as
`fence.LeaseWatch` keeps it), never by comparing its `renewTime` with our wall clock. A
record not yet seen change (`changed_at` None) is live: it has to be watched first. Live
replicas are this replica, the holders of live membership Leases (one per replica,
`keys.member_lease_name`: a replica holding no shard still counts) and the holders of
live shard Leases. Our own shards are the ones whose `fence.Leadership` is valid now
(`held`), not what a record says.

**The assignment, in order** (`assignment`), from the current owners:

1. Keep. Every live replica keeps the shards it owns, up to the cap; a replica over the
   cap (replicas joined) keeps those with the highest rendezvous score
   (`keys.score(replica, shard)`) and gives up the rest.
2. Fill. Every shard left over (no live owner, or given up), in id order, goes to the
   live replica with room (below the cap) that owns the fewest so far, ties to the
   highest rendezvous score of (replica, shard).

Only shards that must move move: a replica under the cap never loses one, and the shards
given up are exactly the excess over the cap (the least any rule bounded by the cap can
move). A replica that joins takes only what is free, so with 4 shards on 2 replicas a
third replica idles (2, 2, 0 is within ceil(4/3) = 2): no shard moves for a balance the
bound does not ask for.

**No two takers.** A free shard has exactly one taker in the assignment, and every
replica that sees the same records computes the same assignment: only that replica
tries to take it (`decide`). Replicas whose views differ for a moment (a membership
Lease seen by one and not yet by the other) may both try; the Lease write is
optimistic (resourceVersion) so one of them gets 409 and the next view agrees -- the
API server, not this module, makes two holders impossible. A replica gives a shard up
(`release`) only while it still owns it, and only one that is assigned to somebody
else; it takes one (`acquire`) only when no live replica owns it. So a shard moves
at most once per change of the live set (no flapping: tests run the rounds to a fixed
point).

A release is the fenced handover of `fence`: stop acting on the shard's nodes, step
down (`Leadership.step_down(clean=True)`), then write the Lease with no holder, so the
next owner need not wait for the duration. Pure: the caller passes the records and the
monotonic time.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from nodewarden.shards.keys import score


@dataclass(frozen=True, slots=True)
class LeaseSeen:
    """A Lease record as this replica saw it."""

    holder: str | None
    """`spec.holderIdentity` (None or empty: released)."""
    changed_at: float | None
    """When this replica saw the record change (its monotonic clock); None: not yet seen."""
    duration: float
    """The record's `leaseDurationSeconds`."""

    def live_holder(self, now: float) -> str | None:
        """The holder while the Lease is live by our clock; None once released or expired."""
        if not self.holder:
            return None
        if self.changed_at is not None and now - self.changed_at >= self.duration:
            return None
        return self.holder


@dataclass(frozen=True, slots=True)
class View:
    """What one replica knows when it balances."""

    me: str
    shards: int
    held: frozenset[int]
    """Shards whose `Leadership` is valid on this replica now."""
    leases: Mapping[int, LeaseSeen] = field(default_factory=dict)
    """Shard id -> its Lease as seen (absent: never created, i.e. free)."""
    members: Mapping[str, LeaseSeen] = field(default_factory=dict)
    """Replica -> its membership Lease as seen."""
    now: float = 0.0

    def __post_init__(self) -> None:
        if self.shards < 1:
            raise ValueError(f"shard count {self.shards} must be at least 1")
        stray = [s for s in self.held if not 0 <= s < self.shards]
        if stray:
            raise ValueError(f"held shards {sorted(stray)} outside 0..{self.shards - 1}")


@dataclass(frozen=True, slots=True)
class Decision:
    """What this replica does now: releases first (each a fenced handover), then
    acquisitions (each an optimistic Lease write that may lose a race)."""

    release: tuple[int, ...]
    acquire: tuple[int, ...]
    cap: int
    live: frozenset[str]

    @property
    def idle(self) -> bool:
        return not self.release and not self.acquire


def cap(shards: int, replicas: int) -> int:
    """The most shards one replica may hold: ceil(shards / replicas)."""
    if replicas < 1:
        raise ValueError("at least one live replica (this one)")
    return math.ceil(shards / replicas)


def owners(view: View) -> dict[int, str]:
    """Each owned shard's owner: ours by valid leadership; others' by a live record that
    names someone else (a record naming us without valid leadership is no owner: our
    leadership lapsed, the shard is ours to take again)."""
    owned: dict[int, str] = dict.fromkeys(view.held, view.me)
    for shard, seen in view.leases.items():
        if shard in owned or not 0 <= shard < view.shards:
            continue
        holder = seen.live_holder(view.now)
        if holder is not None and holder != view.me:
            owned[shard] = holder
    return owned


def live_replicas(view: View) -> frozenset[str]:
    live = {view.me}
    for seen in (*view.members.values(), *view.leases.values()):
        holder = seen.live_holder(view.now)
        if holder is not None:
            live.add(holder)
    return frozenset(live)


def _keep_rank(replica: str, shard: int) -> tuple[int, int]:
    """Which of its shards a replica over the cap keeps: the highest score."""
    return (score(replica, shard), -shard)


def _take_rank(load: Mapping[str, int], shard: int, replica: str) -> tuple[int, int, str]:
    """Who takes a free shard: the fewest owned, then the highest score."""
    return (-load[replica], score(replica, shard), replica)


def assignment(view: View) -> dict[int, str]:
    """Every shard's owner-to-be (see module: keep up to the cap, then fill)."""
    live = sorted(live_replicas(view))
    limit = cap(view.shards, len(live))
    by_owner: dict[str, list[int]] = {replica: [] for replica in live}
    for shard, owner in owners(view).items():
        by_owner[owner].append(shard)  # every owner is live by construction
    assigned: dict[int, str] = {}
    load = dict.fromkeys(live, 0)
    for replica in live:
        kept = sorted(by_owner[replica], key=functools.partial(_keep_rank, replica), reverse=True)
        for shard in kept[:limit]:
            assigned[shard] = replica
        load[replica] = min(limit, len(kept))
    for shard in range(view.shards):
        if shard in assigned:
            continue
        roomy = [replica for replica in live if load[replica] < limit]
        taker = max(roomy, key=functools.partial(_take_rank, load, shard))
        assigned[shard] = taker
        load[taker] += 1
    return assigned


def decide(view: View) -> Decision:
    """This replica's releases (held, assigned elsewhere) and acquisitions (assigned to
    us, owned by no live replica)."""
    live = live_replicas(view)
    target = assignment(view)
    taken = owners(view)
    release = tuple(sorted(s for s in view.held if target[s] != view.me))
    acquire = tuple(
        sorted(
            s for s, r in target.items() if r == view.me and s not in view.held and s not in taken
        )
    )
    return Decision(release=release, acquire=acquire, cap=cap(view.shards, len(live)), live=live)
