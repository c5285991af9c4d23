"""Watch events feed the dispatcher and the power controller (cheap hand-offs, no writes).

`on.event` handlers hand each body to its consumers, which do all writing from their own
loops: ContainerDispatch -> the dispatcher's queue; WorkerNode -> the worker pool and the
power controller; PowerPolicy -> the policy book (and every node under it re-evaluates);
PowerIntent -> the power controller. They are `async` on purpose: kopf runs plain
functions in a thread pool, which costs a thread hand-off per event.
"""

from __future__ import annotations

from typing import Any

import kopf

from nodewarden.api.base import GROUP, VERSION
from nodewarden.api.kinds import CONTAINER_DISPATCH, POWER_INTENT, POWER_POLICY, WORKER_NODE
from nodewarden.dispatch import Dispatcher
from nodewarden.dispatch.policies import PolicyBook
from nodewarden.power.controller import PowerController


def register(
    registry: kopf.OperatorRegistry,
    dispatcher: Dispatcher | None,
    controller: PowerController,
    policies: PolicyBook,
) -> None:
    if dispatcher is not None:

        @kopf.on.event(GROUP, VERSION, CONTAINER_DISPATCH.plural, id="feed_cd", registry=registry)
        async def container_event(event: kopf.RawEvent, **_: Any) -> None:
            dispatcher.observe_container(event["object"], deleted=event["type"] == "DELETED")

    @kopf.on.event(GROUP, VERSION, WORKER_NODE.plural, id="feed_wn", registry=registry)
    async def node_event(event: kopf.RawEvent, **_: Any) -> None:
        deleted = event["type"] == "DELETED"
        if dispatcher is not None:
            dispatcher.observe_node(event["object"], deleted=deleted)
        controller.observe_node(event["object"], deleted=deleted)

    @kopf.on.event(GROUP, VERSION, POWER_POLICY.plural, id="feed_pp", registry=registry)
    async def policy_event(event: kopf.RawEvent, **_: Any) -> None:
        deleted = event["type"] == "DELETED"
        policies.observe(event["object"], deleted=deleted)
        if dispatcher is not None:
            dispatcher.poke()
        controller.observe_policy(event["object"], deleted=deleted)

    @kopf.on.event(GROUP, VERSION, POWER_INTENT.plural, id="feed_pi", registry=registry)
    async def intent_event(event: kopf.RawEvent, **_: Any) -> None:
        controller.observe_intent(event["object"], deleted=event["type"] == "DELETED")
