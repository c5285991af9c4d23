"""kopf handlers: thin wiring between Kubernetes events, the pure core and the adapters.

`build_registry(ctx)` returns a fresh kopf registry holding every handler, so tests and
the operator process each get their own. Nothing imports this package except
`nodewarden.service`.
"""

from __future__ import annotations

import kopf

from nodewarden.dispatch import Dispatcher
from nodewarden.handlers import dispatch, validation
from nodewarden.handlers.context import HandlerContext


def build_registry(
    ctx: HandlerContext, dispatcher: Dispatcher | None = None
) -> kopf.OperatorRegistry:
    """All handlers. With a dispatcher, ContainerDispatch validation is the dispatcher's job
    (it acknowledges and validates each container in its first status write)."""
    registry = kopf.OperatorRegistry()
    validation.register(registry, ctx, containers=dispatcher is None)
    if dispatcher is not None:
        dispatch.register(registry, dispatcher)
    return registry
