"""Which WorkerNodes this replica acts on, and the fence of each action: the shard scope.

    ShardScope(leaderships)          leaderships: shard -> its Leadership now (the
                                     elector's `leadership`), None when not held
    scope.observe(body, deleted)     a WorkerNode as the feed sees it (its shard label)
    scope.shard_of(name)             the shard its label names (None: unassigned)
    scope.acquired(s) / released(s)  told by the elector; `on_change` then (the feed
                                     re-routes its nodes to the power controller)
    scope.acts_on(name)              its label names a shard held here
    scope.draining()                 nodes of held shards told to leave (`shard-drain`):
                                     (name, shard, resourceVersion); `drain_seen` is set
                                     when one is observed (`shards.release` waits on it)
    scope.fence                      a `fence.Fence` that asks the shard of the node the
                                     current action is for (`acting_on`)
    ShardedPowerControl(scope, ...)  the power control whose every request is fenced by
                                     the shard of the node it is for; `drain(shard)`
                                     waits for the requests under way for a shard;
                                     `busy(name)`: a request for the node is under way

**The label is the ownership record** (docs/sharding.md §1): a replica acts on a node only
while the node's `nodewarden.io/shard` label names a shard whose Lease it holds, and each
action on it asks *that* shard's `Leadership` (valid by this replica's monotonic clock,
the token its Lease's `leaseTransitions`). A node with no label, a malformed one, or a
shard's drain label (leaving its shard) is acted on by nobody; its owner then writes
RELEASE (`shards.release`) once no request for it is under way (`busy`).

**How the fence knows the node.** `fence.Fence.check(action)` names no node, and the
power control's request path asks its one fence several times per request (before the
credentials, before the bytes). `acting_on(shard)` sets a context variable for the
length of one request (`ShardedPowerControl.request`); `ShardFence.check` asks that
shard's Leadership, and refuses (NotLeader) when none is set: an action outside a
node's scope is never sent under some other shard's token. Context variables follow
`await` and are copied into tasks started inside, so a request that fans out keeps it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from nodewarden.fence import Fence, FenceToken, Leadership, NotLeader
from nodewarden.power.control import NodeRef, Outcome, PowerControl
from nodewarden.shards.keys import DRAIN_LABEL, SHARD_LABEL, parse_shard
from nodewarden.shards.resharding import acting_shard

Leaderships = Callable[[int], Leadership | None]

_ACTING_ON: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "nodewarden_acting_on_shard", default=None
)


def node_shard(body: Mapping[str, Any]) -> int | None:
    """The shard a WorkerNode body's labels give it; None while unassigned or draining."""
    labels = (body.get("metadata") or {}).get("labels") or {}
    if DRAIN_LABEL in labels:
        return None
    return parse_shard(labels.get(SHARD_LABEL))


class ShardFence:
    """The `fence.Fence` of sharded actions: the Leadership of the shard in `acting_on`
    (and first `also`, when given: the dispatcher Lease of a replica that must hold both)."""

    def __init__(self, leaderships: Leaderships, also: Fence | None = None) -> None:
        self.leaderships = leaderships
        self.also = also

    def _leadership(self, action: str) -> Leadership:
        shard = _ACTING_ON.get()
        if shard is None:
            raise NotLeader(f"{action} not sent: no shard in scope for it")
        leadership = self.leaderships(shard)
        if leadership is None:
            raise NotLeader(f"{action} not sent: shard {shard} is not held here")
        return leadership

    def check(self, action: str) -> FenceToken | None:
        if self.also is not None:
            self.also.check(action)
        return self._leadership(action).check(action)

    def rejected(self, by: str) -> None:
        with contextlib.suppress(NotLeader):  # nothing held: nothing to step down
            self._leadership(by).rejected(by)


class ShardScope:
    """The nodes of the shards this replica holds (see module). Which shards are held is
    told by the elector (`acquired`, `released`: a release is told *before* the shard's
    Leadership steps down, so the nodes leave the scope before the Lease is written
    free); whether an action may go is asked of the shard's Leadership (`fence`)."""

    def __init__(self, leaderships: Leaderships, also: Fence | None = None) -> None:
        self.leaderships = leaderships
        self.fence = ShardFence(leaderships, also)
        self.held: set[int] = set()
        self.on_change: Callable[[], None] | None = None
        """Told after `acquired` or `released` (the feed re-routes its nodes)."""
        self._shards: dict[str, int | None] = {}
        self._draining: dict[str, tuple[int, str | None]] = {}
        self.drain_seen = asyncio.Event()
        """Set when a node of a held shard is observed draining (cleared by its reader)."""

    def acquired(self, shard: int) -> None:
        self.held.add(shard)
        if self.on_change is not None:
            self.on_change()

    def released(self, shard: int) -> None:
        self.held.discard(shard)
        if self.on_change is not None:
            self.on_change()

    def observe(self, body: Mapping[str, Any], deleted: bool = False) -> None:
        name = (body.get("metadata") or {}).get("name")
        if not name:
            return
        if deleted:
            self._shards.pop(name, None)
            self._draining.pop(name, None)
            return
        self._shards[name] = node_shard(body)
        meta = body.get("metadata") or {}
        labels = meta.get("labels") or {}
        shard = acting_shard(labels) if DRAIN_LABEL in labels else None
        if shard is None:
            self._draining.pop(name, None)
            return
        self._draining[name] = (shard, meta.get("resourceVersion"))
        if shard in self.held:
            self.drain_seen.set()

    def shard_of(self, name: str) -> int | None:
        return self._shards.get(name)

    def acts_on(self, name: str) -> bool:
        """The node's label names a shard this replica holds (as told by the elector)."""
        return self.shard_of(name) in self.held

    def draining(self) -> list[tuple[str, int, str | None]]:
        """The nodes of held shards told to leave them, as last observed: (name, shard,
        resourceVersion). The scope no longer acts on them (`node_shard` is None)."""
        return [(n, s, rv) for n, (s, rv) in sorted(self._draining.items()) if s in self.held]


@contextlib.contextmanager
def acting_on(shard: int | None) -> Iterator[None]:
    """The actions inside are for a node of `shard` (None: of no shard)."""
    token = _ACTING_ON.set(shard)
    try:
        yield
    finally:
        _ACTING_ON.reset(token)


class ShardedPowerControl(PowerControl):
    """`PowerControl` whose every request is fenced by the Leadership of the shard of the
    node it is for (the scope's `ShardFence`; any `fence` argument is replaced)."""

    def __init__(self, scope: ShardScope, *args: Any, **kwargs: Any) -> None:
        kwargs["fence"] = scope.fence
        super().__init__(*args, **kwargs)
        self.scope = scope
        self._in_flight: Counter[int] = Counter()
        self._nodes_in_flight: Counter[str] = Counter()
        self._quiet: dict[int, asyncio.Event] = {}

    async def request(
        self, node: NodeRef, transition_id: str, attempt: int, action: str
    ) -> Outcome:
        shard = self.scope.shard_of(node.name)
        if shard is None:
            with acting_on(None):  # refused by the fence, as an outcome
                return await super().request(node, transition_id, attempt, action)
        self._in_flight[shard] += 1
        self._nodes_in_flight[node.name] += 1
        self._quiet.setdefault(shard, asyncio.Event()).clear()
        try:
            with acting_on(shard):
                return await super().request(node, transition_id, attempt, action)
        finally:
            self._nodes_in_flight[node.name] -= 1
            if self._nodes_in_flight[node.name] <= 0:
                del self._nodes_in_flight[node.name]
            self._in_flight[shard] -= 1
            if self._in_flight[shard] <= 0:
                del self._in_flight[shard]
                self._quiet[shard].set()

    def busy(self, name: str) -> bool:
        """A request for node `name` is under way (started under its shard)."""
        return self._nodes_in_flight[name] > 0

    async def drain(self, shard: int) -> None:
        """Until no request for a node of `shard` is under way (the elector's `drain`,
        called after the shard left the scope: no new request starts for it)."""
        if self._in_flight[shard] > 0:
            await self._quiet[shard].wait()
