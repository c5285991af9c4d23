"""The resharder: the shell around `resharding.next_step` that walks every WorkerNode to
its shard under the configured count.

    await usable_shards(kube, namespace, dispatcher_id)       -> frozenset[int]
    await reshard(kube, namespace, shards, dispatcher_id)     -> Pass
    await run_resharder(kube, namespace, shards, dispatcher_id, stop, interval)
    labels_patch(resource_version, before, after)             -> merge patch

One pass lists the shard Leases (those with a holder are *usable*: a node is drained
towards, or assigned to, a shard only once somebody holds its Lease, so a node's time
without an owner stays one step) and every WorkerNode of the namespace, and writes each
node's next step (`resharding.next_step`): DRAIN (`nodewarden.io/shard-drain=<its shard>`)
when its label names another shard than `keys.shard_of(key, shards)`, ASSIGN when it is
unlabelled (new nodes, and nodes their old owner has RELEASEd). It never writes RELEASE:
that is the old owner's (`shards.release`), under its shard's Lease, once it stopped
acting on the node. Every write is a merge patch carrying the resourceVersion it read: a
node changed since the list answers 409 and waits for the next pass, so two resharders
(a new leader and an old one still finishing a pass) are harmless -- which is why it
needs no Lease of its own and runs where the dispatcher Lease is held. It labels new
nodes too (the labeller's job, `shards.labeller`): after a pass that found every node
settled, it lists only the unlabelled ones until the count changes.

**A count that disagrees with the labels.** A node labelled with a shard at or above the
resharder's count is left alone (`Pass.beyond`, logged): its resharder is older than the
labels (a replica with the old count during a rollout that grows the count) or asked to
shrink, which is not built (the removed shards' owners would have to keep their Leases
until their nodes are released, docs/sharding.md §1). Two resharders with different
counts that both grow are still safe (every step conditional, RELEASE only by the owner)
but may move a node twice; a rollout converges once the dispatcher Lease sits on a
replica with the new count.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from nodewarden.api.kinds import WORKER_NODE
from nodewarden.kube.client import Conflict, Kube, KubeError
from nodewarden.kube.lease import UNREACHABLE
from nodewarden.ownership import DISPATCHER_LABEL, Ownership, ownership
from nodewarden.shards.keys import (
    DRAIN_LABEL,
    SHARD_LABEL,
    lease_name,
    node_key,
    parse_shard,
    shard_of,
)
from nodewarden.shards.labeller import UNLABELLED
from nodewarden.shards.resharding import StepKind, acting_shard, next_step

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Pass:
    """What one pass wrote, and what it refused."""

    drained: int = 0
    assigned: int = 0
    beyond: int = 0
    """Nodes labelled with a shard at or above this resharder's count (left alone)."""
    pending: int = 0
    """Nodes not yet where they belong and not written this pass (draining: waiting for
    their owner's RELEASE; their target shard not held yet; a write refused)."""
    malformed: int = 0
    """Nodes whose labels name no owner (a malformed shard label, a drain label naming
    another shard): acted on by nobody, left alone (a person edited them: `nodewarden
    check` counts them), and no reason to list every node again."""

    @property
    def settled(self) -> bool:
        """Every node listed is labelled with its shard under the count."""
        return not (self.drained or self.assigned or self.beyond or self.pending)


def labels_patch(
    resource_version: str | None, before: Mapping[str, str], after: Mapping[str, str]
) -> dict[str, Any]:
    """The merge patch from our labels `before` to `after`, only on `resource_version`."""
    labels: dict[str, str | None] = {k: None for k in before if k not in after}
    labels.update(after)
    return {"metadata": {"resourceVersion": resource_version, "labels": labels}}


async def usable_shards(kube: Kube, namespace: str, dispatcher_id: str) -> frozenset[int]:
    """The shards whose Lease has a holder (empty when the Leases cannot be read)."""
    try:
        listed = await kube.coordination.list_namespaced_lease(
            namespace, label_selector=f"{DISPATCHER_LABEL}={dispatcher_id}"
        )
    except (ApiException, *UNREACHABLE) as exc:
        log.warning("resharder: shard Leases not read: %s", type(exc).__name__)
        return frozenset()
    prefix = lease_name(dispatcher_id, 0).removesuffix("0")
    held = set()
    for lease in listed.items:
        name: str = lease.metadata.name
        shard = parse_shard(name.removeprefix(prefix)) if name.startswith(prefix) else None
        if shard is not None and lease.spec is not None and lease.spec.holder_identity:
            held.add(shard)
    return frozenset(held)


async def reshard(
    kube: Kube, namespace: str, shards: int, dispatcher_id: str, *, every: bool = True
) -> Pass:
    """One pass (see module) over every WorkerNode, or (`every` False) only over the
    unlabelled ones (`!nodewarden.io/shard`: new nodes, released ones)."""
    usable = await usable_shards(kube, namespace, dispatcher_id)
    drained = assigned = beyond = pending = malformed = 0
    if not usable:
        return Pass(pending=1)
    selector = None if every else UNLABELLED
    for body in await kube.list(WORKER_NODE, namespace, label_selector=selector):
        meta = body.get("metadata") or {}
        name = meta.get("name")
        if not name or ownership(body, dispatcher_id) is Ownership.FOREIGN:
            continue
        labels = meta.get("labels") or {}
        label = parse_shard(labels.get(SHARD_LABEL))
        if label is not None and label >= shards:
            beyond += 1
            continue
        key = node_key(namespace, name)
        step = next_step(key, labels, shards, usable)
        if step is None:
            if (SHARD_LABEL in labels or DRAIN_LABEL in labels) and acting_shard(labels) is None:
                malformed += 1  # nobody acts on it; relabelling it is a person's call
            elif DRAIN_LABEL in labels or label != shard_of(key, shards):
                pending += 1
            continue
        patch = labels_patch(meta.get("resourceVersion"), step.before(), step.after())
        try:
            await kube.patch(WORKER_NODE, namespace, name, patch)
        except Conflict:
            pending += 1  # changed since the list: the next pass sees it as it is now
            continue
        except KubeError as exc:
            log.warning("resharder: %s of %s not written: %s", step.kind.value, name, exc)
            pending += 1
            continue
        if step.kind is StepKind.DRAIN:
            drained += 1
        else:
            assigned += 1
    done = Pass(drained, assigned, beyond, pending, malformed)
    if drained or assigned:
        log.info(
            "resharder pass", extra={"drained": drained, "assigned": assigned, "shards": shards}
        )
    if malformed:
        log.warning("resharder: %d nodes with malformed shard labels left alone", malformed)
    if beyond:
        log.warning(
            "resharder: %d nodes labelled with a shard beyond the configured count %d: left "
            "alone until the rollout converges (a shrink is not built)",
            beyond,
            shards,
        )
    return done


async def run_resharder(
    kube: Kube,
    namespace: str,
    shards: int | Callable[[], int],
    dispatcher_id: str,
    stop: asyncio.Event,
    interval: float = 5.0,
) -> None:
    """A pass every `interval` until `stop` (`shards`: the count, or a function giving
    it at each pass); a failed pass is retried at the next. Once a pass over every node
    found them all settled under a count, later passes list only the unlabelled nodes
    (one small LIST) until the count changes (or the process restarts)."""
    settled_at: int | None = None
    while not stop.is_set():
        count = shards() if callable(shards) else shards
        every = count != settled_at
        try:
            done = await reshard(kube, namespace, count, dispatcher_id, every=every)
            if every and done.settled:
                settled_at = count
        except KubeError as exc:
            log.warning("resharder pass failed: %s", exc)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(interval):
                await stop.wait()
