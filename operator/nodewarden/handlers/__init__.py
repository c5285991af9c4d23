"""kopf handlers: thin wiring between Kubernetes events, the pure core and the adapters.

`build_registry(ctx, dispatcher, controller, policies)` returns a fresh kopf registry
holding every handler, so tests and the operator process each get their own. Nothing
imports this package except `nodewarden.service`.
"""

from __future__ import annotations

import kopf

from nodewarden.dispatch import Dispatcher
from nodewarden.dispatch.policies import PolicyBook
from nodewarden.handlers import feed, validation
from nodewarden.handlers.context import HandlerContext
from nodewarden.power.controller import PowerController


def build_registry(
    ctx: HandlerContext,
    dispatcher: Dispatcher | None,
    controller: PowerController,
    policies: PolicyBook,
) -> kopf.OperatorRegistry:
    """All handlers. With a dispatcher, ContainerDispatch validation is the dispatcher's job
    (it acknowledges and validates each container in its first status write); WorkerNodes
    are validated by the power controller (Valid condition in its status writes)."""
    registry = kopf.OperatorRegistry()
    validation.register(registry, ctx, controller, containers=dispatcher is None)
    feed.register(registry, dispatcher, controller, policies)
    return registry
