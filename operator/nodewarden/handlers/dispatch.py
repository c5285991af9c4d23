"""Dispatcher wiring: every ContainerDispatch, WorkerNode and PowerPolicy event feeds its cache.

`on.event` handlers are cheap (no progress annotations, no patches): they hand the body
to the dispatcher, which does all writing from its own loop. They are `async` on purpose:
kopf runs plain functions in a thread pool, which costs a thread hand-off per event.
"""

from __future__ import annotations

from typing import Any

import kopf

from nodewarden.api.base import GROUP, VERSION
from nodewarden.api.kinds import CONTAINER_DISPATCH, POWER_POLICY, WORKER_NODE
from nodewarden.dispatch import Dispatcher


def register(registry: kopf.OperatorRegistry, dispatcher: Dispatcher) -> None:
    @kopf.on.event(GROUP, VERSION, CONTAINER_DISPATCH.plural, id="dispatch_cd", registry=registry)
    async def container_event(event: kopf.RawEvent, **_: Any) -> None:
        dispatcher.observe_container(event["object"], deleted=event["type"] == "DELETED")

    @kopf.on.event(GROUP, VERSION, WORKER_NODE.plural, id="dispatch_wn", registry=registry)
    async def node_event(event: kopf.RawEvent, **_: Any) -> None:
        dispatcher.observe_node(event["object"], deleted=event["type"] == "DELETED")

    @kopf.on.event(GROUP, VERSION, POWER_POLICY.plural, id="dispatch_pp", registry=registry)
    async def policy_event(event: kopf.RawEvent, **_: Any) -> None:
        dispatcher.observe_policy(event["object"], deleted=event["type"] == "DELETED")
