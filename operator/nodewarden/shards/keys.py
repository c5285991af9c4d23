"""Where a WorkerNode goes: its shard, by rendezvous hashing of a stable key.

    node_key(namespace, name)   -> str    the stable key ("namespace/name")
    shard_of(key, shards)       -> int    0 <= shard < shards
    SHARD_LABEL, DRAIN_LABEL              the labels nodewarden writes on a WorkerNode
    label_value(shard) / parse_shard(v)   the label's value, and back (None: not a shard)
    lease_name(dispatcher_id, shard)      the shard's coordination.k8s.io Lease

**Rendezvous (HRW) rather than a ring with virtual nodes.** Every shard scores the key
(a keyed BLAKE2b of key and shard id, 64 bits) and the highest score wins. Shard ids are
the integers 0..n-1, so going from n to m shards only moves a node whose winner changes:
growing, a node moves only to one of the new shards (n..m-1), and a fraction (m-n)/m of
nodes moves; shrinking, only the nodes of the removed shards move (their next-best
existing shard wins), never a node between two shards that exist before and after. The
expected load is even without tuning, where a ring needs hundreds of virtual nodes per
shard to come close, plus the ring itself to agree on. The cost is O(shards) hashes per
lookup: with tens of shards, a few microseconds, once per node per change of the shard
count (the label keeps the answer in between).

**The key is namespace/name**, not `metadata.uid`: it is known before the object exists
(a GitOps tool that re-creates a WorkerNode gets the same shard, so the same replica and
its warm caches), and it never changes for the life of the object (a WorkerNode's name is
the machine's). Hash input is UTF-8 of the key, a NUL, and the decimal shard id: stable
across processes, Python versions and machines (never `hash()`, which is salted).
"""

from __future__ import annotations

import hashlib

SHARD_LABEL = "nodewarden.io/shard"
"""On every WorkerNode: the decimal id of the shard that owns it. Absent: not yet assigned
(a new node, or a node between two owners during resharding). A replica watches (or
filters) the nodes whose label names a shard whose Lease it holds."""

DRAIN_LABEL = "nodewarden.io/shard-drain"
"""Set (to the same shard id as `SHARD_LABEL`) while a node leaves its shard: its owner
stops acting on it, then removes both labels (`resharding`)."""

MAX_SHARDS = 256
"""Shard counts above this are refused: a lookup hashes once per shard."""

_PERSON = b"nodewarden-shd"  # BLAKE2b personalisation: scores of no other use collide


def node_key(namespace: str, name: str) -> str:
    """The stable key of a WorkerNode."""
    if not name:
        raise ValueError("a WorkerNode key needs a name")
    return f"{namespace}/{name}"


def score(key: str, shard: int) -> int:
    """The key's weight for `shard` (64 bits; the highest wins)."""
    digest = hashlib.blake2b(
        key.encode("utf-8") + b"\x00" + str(shard).encode("ascii"),
        digest_size=8,
        person=_PERSON,
    ).digest()
    return int.from_bytes(digest, "big")


def _check_count(shards: int) -> None:
    if not 1 <= shards <= MAX_SHARDS:
        raise ValueError(f"shard count {shards} outside 1..{MAX_SHARDS}")


def shard_of(key: str, shards: int) -> int:
    """The shard of `key` among shards 0..shards-1 (ties, never seen in 64 bits, go to
    the lower id, so the answer is total)."""
    _check_count(shards)
    return max(range(shards), key=lambda shard: (score(key, shard), -shard))


def label_value(shard: int) -> str:
    if shard < 0:
        raise ValueError(f"shard id {shard} is negative")
    return str(shard)


def parse_shard(value: str | None) -> int | None:
    """The shard id a label value names; None for absent or malformed values (a node
    whose label someone edited by hand is treated as unassigned, never guessed)."""
    if value is None or not value.isascii() or not value.isdecimal():
        return None
    if len(value) > 1 and value.startswith("0"):
        return None  # one spelling per id: "07" is not shard 7
    shard = int(value)
    return shard if shard < MAX_SHARDS else None


def lease_name(dispatcher_id: str, shard: int) -> str:
    """The shard's Lease in the operator's namespace: `<dispatcher id>-shard-<id>`."""
    return f"{dispatcher_id}-shard-{label_value(shard)}"


def member_lease_name(dispatcher_id: str, replica: str) -> str:
    """A replica's membership Lease (`balance`: a replica that holds no shard is still
    counted as live): `<dispatcher id>-member-<replica>`."""
    return f"{dispatcher_id}-member-{replica}"
