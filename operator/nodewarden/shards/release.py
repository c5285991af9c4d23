"""The owner's step of a node leaving its shard: RELEASE (docs/sharding.md §1).

    await release_drained(kube, namespace, scope, control)   -> int   released now
    await run_releases(kube, namespace, scope, control, stop, interval)

The resharder marks a node `nodewarden.io/shard-drain=<its shard>` (DRAIN). The owner of
that shard, on observing it, stops acting on the node at once: `scope.node_shard` gives a
draining node no shard, so the feed routes it to the power controller as deleted and the
fence (`ShardFence`) refuses any new request for it. Once no request for it is under way
(`ShardedPowerControl.busy`), the owner writes RELEASE -- both labels removed -- with a
merge patch carrying the resourceVersion it observed, and only while its Leadership of
that shard is valid (`Leadership.check`, as any action on the shard's nodes). The write
is the proof that it stopped; the resharder ASSIGNs the node to its new shard only after
it. A 409 (the node changed since it was observed) is retried once the scope has
observed it again. A replica that loses the shard meanwhile writes nothing: the next
holder sees the drain label when it takes the shard and releases the node itself.

What waits for RELEASE is the power path's requests only (the fenced part of the
sharded power path today); status writes, runner and cloud ports are fenced by the
dispatcher Lease (docs/sharding.md §1, "In the operator").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from nodewarden.api.kinds import WORKER_NODE
from nodewarden.fence import NotLeader
from nodewarden.kube.client import Conflict, Kube, KubeError, NotFound
from nodewarden.shards.resharder import labels_patch
from nodewarden.shards.resharding import Step, StepKind
from nodewarden.shards.scope import ShardedPowerControl, ShardScope

log = logging.getLogger(__name__)


async def release_drained(
    kube: Kube, namespace: str, scope: ShardScope, control: ShardedPowerControl
) -> int:
    """RELEASE every draining node of a held shard that no request is under way for;
    the count written."""
    released = 0
    for name, shard, resource_version in scope.draining():
        if control.busy(name):
            continue  # a request past its fence check: wait until it finished
        leadership = scope.leaderships(shard)
        if leadership is None:
            continue
        step = Step(StepKind.RELEASE, name, shard)
        try:
            leadership.check(f"release {name} from shard {shard}")
        except NotLeader:
            continue
        patch = labels_patch(resource_version, step.before(), step.after())
        try:
            written = await kube.patch(WORKER_NODE, namespace, name, patch)
        except (Conflict, NotFound):
            continue  # observed again (or gone): the scope has the news
        except KubeError as exc:
            log.warning("shard %s: release of %s not written: %s", shard, name, exc)
            continue
        scope.observe(written)  # unlabelled now: neither ours nor draining
        released += 1
        log.info("released node from shard", extra={"node": name, "shard": shard})
    return released


async def run_releases(
    kube: Kube,
    namespace: str,
    scope: ShardScope,
    control: ShardedPowerControl,
    stop: asyncio.Event,
    interval: float = 2.0,
) -> None:
    """Release drained nodes when one is observed (`scope.drain_seen`), or every
    `interval` (a node busy or refused last time), until `stop`."""
    while not stop.is_set():
        scope.drain_seen.clear()
        try:
            await release_drained(kube, namespace, scope, control)
        except KubeError as exc:
            log.warning("shard releases failed: %s", exc)
        waits = [asyncio.ensure_future(scope.drain_seen.wait()), asyncio.ensure_future(stop.wait())]
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(interval):
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for waiting in waits:
            waiting.cancel()
