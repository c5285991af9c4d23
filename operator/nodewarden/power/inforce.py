"""PowerPolicy `status.inForce` in the live power controller: the policy in force
(`rules.inforce`) written when one of its nodes moves, when a node comes or goes, when
the policy changes, and at its next change by the clock (a warm window's boundary; the
forecast's due hours) -- due times, never a periodic rewrite. A render equal to what
was last written (or, before this process wrote it, to what the PowerPolicy informer
holds: a new leader does not rewrite an equal status) is not sent.

Writes are coalesced: nodes moving under load change the counts every round, yet a
policy's `inForce` is written at most once per `WRITE_GAP`; what changed in between goes
out with the write at the end of the gap. A change by the clock (a window boundary, the
forecast's due hour) is written at its due time, gap or not.

A node changing class under its policy, or moving to another policy (its `policyRef`
edited), marks the policies concerned (`FleetTally.regrouped`), as a move does.

Calls nothing above it: the round calls `moved` (a node's power state changed) and
`due` (once per round, after the steps); the controller calls `seen` per PowerPolicy
event.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from nodewarden.api.kinds import POWER_POLICY
from nodewarden.fleet.policies import Policy
from nodewarden.kube.client import KubeError
from nodewarden.power.consolidating import PowerConsolidation
from nodewarden.power.context import PowerContext
from nodewarden.power.runtime import NodeRuntime
from nodewarden.power.warming import PowerWarmth
from nodewarden.rules.inforce import in_force, member

log = logging.getLogger(__name__)

RETRY_AFTER = timedelta(seconds=30)
"""A refused write is tried again this long after (not at every round)."""
WRITE_GAP = timedelta(seconds=10)
"""At most one `inForce` write per policy this often, window boundaries aside."""


class PolicyInForce:
    """See the module docstring. One per power controller."""

    def __init__(
        self, ctx: PowerContext, warmth: PowerWarmth, consolidation: PowerConsolidation
    ) -> None:
        self.ctx = ctx
        self.warmth = warmth
        self.consolidation = consolidation
        self._consolidating: dict[str, int] = {}
        """Per policy: its consolidation budget in use at the last render pass."""
        self._dirty: set[str] = set()
        self._all_dirty = True
        self._due: dict[str, datetime] = {}
        """Per policy: its next change by the clock (or a retry)."""
        self._written: dict[str, dict[str, Any]] = {}
        self._server: dict[str, Any] = {}
        """Per policy: its `status.inForce` as the informer last handed it over."""
        self._last_write: dict[str, datetime] = {}
        self._deferred: dict[str, datetime] = {}
        """Per policy: a change held back by `WRITE_GAP`, rendered at this time."""
        self._versions: tuple[Any, ...] | None = None
        self._forecast_due: datetime | None = None
        self.writes = 0
        ctx.tally.regrouped = self._regrouped

    def moved(self, rt: NodeRuntime) -> None:
        """Node `rt`'s power state changed: its policy's counts may have."""
        self._dirty.add(rt.policy_name or self.ctx.default_policy)

    def _regrouped(self, policy: str | None) -> None:
        """A node came into or left `policy`, or changed class under it."""
        self._dirty.add(policy or self.ctx.default_policy)

    def seen(self, body: Mapping[str, Any], deleted: bool = False) -> None:
        """A PowerPolicy event: its `status.inForce` as the server holds it."""
        name = (body.get("metadata") or {}).get("name")
        if not isinstance(name, str):
            return
        if deleted:
            self._server.pop(name, None)
            return
        self._server[name] = (body.get("status") or {}).get("inForce")

    @property
    def next_due(self) -> datetime | None:
        """The soonest due time or held-back change (for the controller's sleep)."""
        times = [*self._due.values(), *self._deferred.values()]
        return min(times) if times else None

    def roster_changed(self) -> None:
        self._all_dirty = True

    def due(self, now: datetime) -> None:
        """Render (and write when changed) the policies whose time came."""
        book = self.ctx.policies
        policies = book.policies
        versions = tuple((name, p.view.version) for name, p in sorted(policies.items()))
        if versions != self._versions or self.warmth.next_due != self._forecast_due:
            self._versions = versions
            self._forecast_due = self.warmth.next_due
            self._all_dirty = True
        for gone in [n for n in {*self._written, *self._deferred} if n not in policies]:
            self._written.pop(gone, None)  # deleted: written afresh should it come back
            self._due.pop(gone, None)
            self._deferred.pop(gone, None)
            self._last_write.pop(gone, None)
        consolidating = self.consolidation.in_use()
        if consolidating != self._consolidating:
            for name in {*consolidating, *self._consolidating}:
                if consolidating.get(name, 0) != self._consolidating.get(name, 0):
                    self._dirty.add(name)
            self._consolidating = consolidating
        changed = set(policies) if self._all_dirty else self._dirty & set(policies)
        changed |= {n for n, at in self._deferred.items() if at <= now}
        by_clock = {n for n, at in self._due.items() if at <= now and n in policies}
        self._all_dirty = False
        self._dirty.clear()
        for name in changed - by_clock:
            last = self._last_write.get(name)
            if last is not None and now < last + WRITE_GAP:
                held = self._deferred.get(name)
                at = last + WRITE_GAP
                self._deferred[name] = at if held is None else min(held, at)
                changed.discard(name)
        for name in sorted(changed | by_clock):
            self._due.pop(name, None)
            self._deferred.pop(name, None)
            self._render(policies[name], now)

    def _render(self, policy: Policy, now: datetime) -> None:
        if policy.view.problems:
            return  # not in force: its Valid condition says why
        ctx = self.ctx
        default = policy.name == ctx.default_policy
        members = [
            member(rt.node_class, rt.node_type, rt.state)
            for rt in ctx.nodes.values()
            if rt.policy_name == policy.name or (default and rt.policy_name is None)
        ]
        h = self.warmth.book.histogram(policy.name, policy.spec, now)
        shown = in_force(
            policy.spec,
            members,
            now,
            h.days_observed if h is not None else None,
            self._consolidating.get(policy.name, 0),
        )
        if shown.next_change is not None:
            self._due[policy.name] = shown.next_change
        before = self._written.get(policy.name)
        if before is None:
            before = self._server.get(policy.name)  # a new leader: what the server holds
        if _pruned(before) == _pruned(shown.status):
            self._written[policy.name] = shown.status
            return
        self._written[policy.name] = shown.status
        self._last_write[policy.name] = now
        ctx.spawn(self._write(policy.name, shown.status, now))

    async def _write(self, name: str, status: dict[str, Any], now: datetime) -> None:
        self.writes += 1
        try:
            await self.ctx.kube.patch_status(
                POWER_POLICY, self.ctx.namespace, name, {"inForce": status}
            )
        except KubeError as exc:
            log.info("PowerPolicy %s: status.inForce not written (%s)", name, exc)
            self._written.pop(name, None)
            at = now + RETRY_AFTER
            held = self._due.get(name)
            self._due[name] = at if held is None else min(held, at)


def _pruned(doc: Any) -> Any:
    """`doc` as a merge patch leaves it on the server: no null fields."""
    if isinstance(doc, Mapping):
        return {k: _pruned(v) for k, v in doc.items() if v is not None}
    if isinstance(doc, list):
        return [_pruned(v) for v in doc]
    return doc
