"""The labeller: gives every unlabelled WorkerNode its shard label (`keys.shard_of`).

    await label_unassigned(kube, namespace, shards, dispatcher_id)  -> int   labelled now

One pass lists the WorkerNodes without `nodewarden.io/shard` (a label selector,
`!nodewarden.io/shard`: the API server sends only those) and writes each one's label with
a merge patch that carries the resourceVersion it read: a node changed meanwhile (someone
else labelled it, a resharder's DRAIN) answers 409 and is left to the next pass. So two
labellers are harmless (both write the same value; the second gets 409), which is why it
needs no Lease of its own; the caller runs it where the dispatcher Lease is held.

The operator runs the resharder instead (`shards.resharder`: the same ASSIGN for unlabelled
nodes, and the moves of a count change); this one pass stays for tests and tools. A node
whose label names a shard outside 0..shards-1 is left as it is (and acted on by nobody:
`nodewarden check` reports it).
"""

from __future__ import annotations

import logging

from nodewarden.api.kinds import WORKER_NODE
from nodewarden.kube.client import Conflict, Kube, KubeError
from nodewarden.ownership import Ownership, ownership
from nodewarden.shards.keys import SHARD_LABEL, label_value, node_key, shard_of

log = logging.getLogger(__name__)

UNLABELLED = f"!{SHARD_LABEL}"


async def label_unassigned(kube: Kube, namespace: str, shards: int, dispatcher_id: str) -> int:
    """Label every unlabelled WorkerNode in `namespace` with its shard (never another
    dispatcher's: an unclaimed one is labelled, so that its shard's owner claims it);
    the count written."""
    written = 0
    for body in await kube.list(WORKER_NODE, namespace, label_selector=UNLABELLED):
        meta = body.get("metadata") or {}
        name = meta.get("name")
        if not name or ownership(body, dispatcher_id) is Ownership.FOREIGN:
            continue
        shard = shard_of(node_key(namespace, name), shards)
        patch = {
            "metadata": {
                "resourceVersion": meta.get("resourceVersion"),
                "labels": {SHARD_LABEL: label_value(shard)},
            }
        }
        try:
            await kube.patch(WORKER_NODE, namespace, name, patch)
        except Conflict:
            continue  # changed since the list: the next pass sees it as it is now
        except KubeError as exc:
            log.warning("shard label of %s not written: %s", name, exc)
            continue
        written += 1
    if written:
        log.info("shard labels written", extra={"nodes": written, "shards": shards})
    return written
