"""Which WorkerNodes this replica acts on, and the fence of each action: the shard scope.

    ShardScope(leaderships)          leaderships: shard -> its Leadership now (the
                                     elector's `leadership`), None when not held
    scope.observe(body, deleted)     a WorkerNode as the feed sees it (its shard label)
    scope.shard_of(name)             the shard its label names (None: unassigned)
    scope.acts_on(name)              its shard's Leadership is valid here now
    scope.fence                      a `fence.Fence` that asks the shard of the node the
                                     current action is for (`acting_on`)
    ShardedPowerControl(scope, ...)  the power control whose every request is fenced by
                                     the shard of the node it is for

**The label is the ownership record** (docs/sharding.md §1): a replica acts on a node only
while the node's `nodewarden.io/shard` label names a shard whose Lease it holds, and each
action on it asks *that* shard's `Leadership` (valid by this replica's monotonic clock,
the token its Lease's `leaseTransitions`). A node with no label, a malformed one, or a
shard's drain label (leaving its shard) is acted on by nobody.

**How the fence knows the node.** `fence.Fence.check(action)` names no node, and the
power control's request path asks its one fence several times per request (before the
credentials, before the bytes). `acting_on(shard)` is a context variable set for the
length of one request (`ShardedPowerControl.request`); `ShardFence.check` asks that
shard's Leadership, and refuses (NotLeader) when none is set: an action outside a
node's scope is never sent under some other shard's token. Context variables follow
`await` and are copied into tasks started inside, so a request that fans out keeps it.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Mapping
from typing import Any

from nodewarden.fence import FenceToken, Leadership, NotLeader
from nodewarden.power.control import NodeRef, Outcome, PowerControl
from nodewarden.shards.keys import DRAIN_LABEL, SHARD_LABEL, parse_shard

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
    """The `fence.Fence` of sharded actions: the Leadership of the shard in `acting_on`."""

    def __init__(self, leaderships: Leaderships) -> None:
        self.leaderships = leaderships

    def _leadership(self, action: str) -> Leadership:
        shard = _ACTING_ON.get()
        if shard is None:
            raise NotLeader(f"{action} not sent: no shard in scope for it")
        leadership = self.leaderships(shard)
        if leadership is None:
            raise NotLeader(f"{action} not sent: shard {shard} is not held here")
        return leadership

    def check(self, action: str) -> FenceToken | None:
        return self._leadership(action).check(action)

    def rejected(self, by: str) -> None:
        with contextlib.suppress(NotLeader):  # nothing held: nothing to step down
            self._leadership(by).rejected(by)


class ShardScope:
    """The nodes of the shards this replica holds (see module)."""

    def __init__(self, leaderships: Leaderships) -> None:
        self.leaderships = leaderships
        self.fence = ShardFence(leaderships)
        self._shards: dict[str, int | None] = {}

    def observe(self, body: Mapping[str, Any], deleted: bool = False) -> None:
        name = (body.get("metadata") or {}).get("name")
        if not name:
            return
        if deleted:
            self._shards.pop(name, None)
        else:
            self._shards[name] = node_shard(body)

    def shard_of(self, name: str) -> int | None:
        return self._shards.get(name)

    def holds(self, shard: int | None) -> bool:
        if shard is None:
            return False
        leadership = self.leaderships(shard)
        return leadership is not None and leadership.valid

    def acts_on(self, name: str) -> bool:
        return self.holds(self.shard_of(name))

    def nodes_of(self, shard: int) -> list[str]:
        return sorted(n for n, s in self._shards.items() if s == shard)


def acting_on(shard: int | None) -> contextvars.Token[int | None]:
    """Name the shard the coming actions are for (reset with `_ACTING_ON.reset(token)`)."""
    return _ACTING_ON.set(shard)


class ShardedPowerControl(PowerControl):
    """`PowerControl` whose every request is fenced by the Leadership of the shard of the
    node it is for (the scope's `ShardFence`; any `fence` argument is replaced)."""

    def __init__(self, scope: ShardScope, *args: Any, **kwargs: Any) -> None:
        kwargs["fence"] = scope.fence
        super().__init__(*args, **kwargs)
        self.scope = scope

    async def request(
        self, node: NodeRef, transition_id: str, attempt: int, action: str
    ) -> Outcome:
        token = acting_on(self.scope.shard_of(node.name))
        try:
            return await super().request(node, transition_id, attempt, action)
        finally:
            _ACTING_ON.reset(token)
