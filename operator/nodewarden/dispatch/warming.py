"""The dispatcher's side of warm capacity: cloud VMs created ahead of demand for the node
classes whose warm and coming nodes fall short of what the levers want (`rules.warm`).

After each plan (`create`): the power controller puts what the levers want of each class
of the default policy -- the policy new instances run under -- on the power board
(`PowerBoard.warm`, at its due times; a change bumps the board's version, so the
dispatcher plans again); `rules.warm.vm_creates` says how many instances of each cloud
class to create: those short of the class's target once its idle, ready nodes the plan
starts nothing on and its booting nodes no container waits for are counted. Each create
goes through the pool's create choke point, so the hard caps and the cloud's back-off
apply. What a lever in Shadow would create is counted
(`nodewarden_warm_creates_total{mode="Shadow"}`), never created.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from nodewarden.api.warmcapacity import NodeClass
from nodewarden.dispatch.context import DispatchContext
from nodewarden.dispatch.views import NodeViews
from nodewarden.metrics import WARM_CREATES
from nodewarden.rules.warm import WarmTarget, vm_creates
from nodewarden.scheduling.views import NodeView, Plan

log = logging.getLogger(__name__)


class DispatchWarmth:
    """See the module docstring."""

    def __init__(self, ctx: DispatchContext, views: NodeViews) -> None:
        self.ctx = ctx
        self.views = views
        self._shadowed: dict[str, int] = {}
        """Per class: the Shadow creates last counted (counted again only when they move)."""

    def create(self, plan: Plan) -> None:
        ctx = self.ctx
        wants = ctx.board.warm
        if not wants or not ctx.recovered or ctx.pool is None or ctx.cloud is None:
            return
        policy = ctx.policies.default
        classes = policy.spec.node_classes
        nodes = self.views.nodes(ctx.pool.workers.values())
        on = {name: WarmTarget(count=w.count) for name, w in wants.items() if w.count > 0}
        for name, itype, count in vm_creates(on, classes, nodes, plan):
            instance_type = ctx.cloud.instance_type(itype)
            if instance_type is None:
                continue
            for _ in range(count):
                if ctx.pool.create(instance_type) is None:
                    break  # a hard cap or the cloud's back-off refused it
                WARM_CREATES.labels(policy.name, name, "On").inc()
                log.info(
                    "warm capacity: creating a %s for class %s (%s)", itype, name, wants[name].why
                )
        shadow = {
            name: WarmTarget(count=w.shadow) for name, w in wants.items() if w.shadow > w.count
        }
        self._count_shadow(policy.name, shadow, classes, nodes, plan)

    def _count_shadow(
        self,
        policy: str,
        shadow: dict[str, WarmTarget],
        classes: Sequence[NodeClass],
        nodes: list[NodeView],
        plan: Plan,
    ) -> None:
        would = {name: n for name, _, n in vm_creates(shadow, classes, nodes, plan)}
        for name, n in would.items():
            if self._shadowed.get(name) != n:
                WARM_CREATES.labels(policy, name, "Shadow").inc(n)
        self._shadowed = would
