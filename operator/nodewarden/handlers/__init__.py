"""kopf handlers: thin wiring between Kubernetes events, the pure core and the adapters.

`build_registry(ctx, dispatcher, controller, policies)` returns a fresh kopf registry
holding every kopf handler (PowerPolicy and PowerIntent), so tests and the operator
process each get their own; `feed.Feed` holds the informers of the hot kinds (WorkerNode,
ContainerDispatch). Nothing imports this package except `nodewarden.service`.
"""

from __future__ import annotations

import kopf

from nodewarden.dispatch import Dispatcher
from nodewarden.fleet.policies import PolicyBook
from nodewarden.handlers import feed, validation
from nodewarden.handlers.context import HandlerContext
from nodewarden.power.controller import PowerController


def build_registry(
    ctx: HandlerContext,
    dispatcher: Dispatcher | None,
    controller: PowerController,
    policies: PolicyBook,
) -> kopf.OperatorRegistry:
    """kopf's handlers: PowerPolicy and PowerIntent only (validation and their events).
    WorkerNodes and ContainerDispatches come from the informers of `feed.Feed`, so kopf
    opens no watch on them and writes nothing to them."""
    registry = kopf.OperatorRegistry()
    validation.register(registry, ctx, controller)
    feed.register(registry, dispatcher, controller, policies)
    return registry
