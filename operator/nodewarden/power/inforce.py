"""PowerPolicy `status.inForce` in the live power controller: the policy in force
(`rules.inforce`) written when one of its nodes moves, when a node comes or goes, when
the policy changes, and at its next change by the clock (a warm window's boundary; the
forecast's due hours) -- due times, never a periodic rewrite. A render equal to what
was last written is not sent.

Calls nothing above it: the round calls `moved` (a node's power state changed) and
`due` (once per round, after the steps).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from nodewarden.api.kinds import POWER_POLICY
from nodewarden.fleet.policies import Policy
from nodewarden.kube.client import KubeError
from nodewarden.power.context import PowerContext
from nodewarden.power.runtime import NodeRuntime
from nodewarden.power.warming import PowerWarmth
from nodewarden.rules.inforce import in_force, member

log = logging.getLogger(__name__)

RETRY_AFTER = timedelta(seconds=30)
"""A refused write is tried again this long after (not at every round)."""


class PolicyInForce:
    """See the module docstring. One per power controller."""

    def __init__(self, ctx: PowerContext, warmth: PowerWarmth) -> None:
        self.ctx = ctx
        self.warmth = warmth
        self._dirty: set[str] = set()
        self._all_dirty = True
        self._due: dict[str, datetime] = {}
        """Per policy: its next change by the clock (or a retry)."""
        self._written: dict[str, dict[str, Any]] = {}
        self._versions: tuple[Any, ...] | None = None
        self._forecast_due: datetime | None = None
        self.writes = 0

    def moved(self, rt: NodeRuntime) -> None:
        """Node `rt`'s power state changed: its policy's counts may have."""
        self._dirty.add(rt.policy_name or self.ctx.default_policy)

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
        for gone in [n for n in self._written if n not in policies]:
            del self._written[gone]  # deleted: written afresh should it come back
            self._due.pop(gone, None)
        names = set(policies) if self._all_dirty else self._dirty & set(policies)
        names |= {n for n, at in self._due.items() if at <= now and n in policies}
        self._all_dirty = False
        self._dirty.clear()
        for name in sorted(names):
            self._due.pop(name, None)
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
        shown = in_force(policy.spec, members, now, h.days_observed if h is not None else None)
        if shown.next_change is not None:
            self._due[policy.name] = shown.next_change
        if self._written.get(policy.name) == shown.status:
            return
        self._written[policy.name] = shown.status
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
