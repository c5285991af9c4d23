"""kopf handlers: thin wiring between Kubernetes events, the pure core and the adapters.

`build_registry(ctx)` returns a fresh kopf registry holding every handler, so tests and
the operator process each get their own. Nothing imports this package except
`nodewarden.service`.
"""

from __future__ import annotations

import kopf

from nodewarden.handlers import validation
from nodewarden.handlers.context import HandlerContext


def build_registry(ctx: HandlerContext) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    validation.register(registry, ctx)
    return registry
