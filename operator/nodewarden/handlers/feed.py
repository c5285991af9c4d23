"""The feed: where every watched object enters the operator.

The hot kinds come from one informer each (`nodewarden.kube.informer`), never from kopf:

- WorkerNode -> compact bodies (`nodewarden.kube.compact`) -> the worker pool (through
  the dispatcher) and the power controller, which also hands each body to the status
  writer; the writer folds what its own writes return back into the informer.
- ContainerDispatch -> compact bodies -> the dispatcher's queue (whose writes fold back
  the same way), or, when no dispatcher runs, the ContainerDispatch validator.

One compact body per object is shared by every consumer (no consumer copies it).
Handlers run in order after the store changed and only hand over: each consumer works
from its own loop. `Feed.start()` returns once both informers have their first LIST and
the PowerPolicies are listed, having handed every object over, so the consumers start
with the whole fleet, queue and policy book and need no LIST of their own.

**Sharding on** (`scope`, docs/sharding.md): the dispatcher still hears every WorkerNode;
the power controller hears only the nodes whose shard label names a shard this replica
holds (client-side filtering of the one WorkerNode watch). When a shard is acquired or
released (`ShardScope.on_change`) every node is routed again: a node that leaves the
scope reaches the controller as deleted (it forgets the node: in-memory state only), one
that enters it as added.

kopf keeps the low-volume kinds a person edits: `register` adds `on.event` handlers for
PowerPolicy (the policy book, the dispatcher, every node under the policy) and
PowerIntent (the power controller). They are `async` on purpose: kopf runs plain
functions in a thread pool, which costs a thread hand-off per event.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

import kopf
from kubernetes_asyncio import client
from pydantic import ValidationError

from nodewarden.api.base import GROUP, VERSION
from nodewarden.api.kinds import CONTAINER_DISPATCH, POWER_INTENT, POWER_POLICY, WORKER_NODE
from nodewarden.api.workernode import WorkerNodeSpec
from nodewarden.compose import adapters_of
from nodewarden.dispatch import Dispatcher
from nodewarden.fleet.policies import PolicyBook
from nodewarden.fleet.status import NodeStatusWriter
from nodewarden.handlers.validation import ContainerValidator
from nodewarden.kube.client import Kube, KubeError
from nodewarden.kube.compact import compact_containerdispatch, compact_workernode
from nodewarden.kube.informer import Informer, InformerSettings
from nodewarden.kube.store import EventType
from nodewarden.power.controller import PowerController
from nodewarden.shards.scope import ShardScope

Body = dict[str, Any]
Handler = Callable[[EventType, Body | None, Body | None], None]

log = logging.getLogger(__name__)


class Feed:
    """The WorkerNode and ContainerDispatch informers and who hears them."""

    def __init__(
        self,
        api: client.ApiClient,
        namespace: str | None,
        *,
        kube: Kube,
        policies: PolicyBook,
        controller: PowerController,
        status: NodeStatusWriter,
        dispatcher: Dispatcher | None,
        validator: ContainerValidator | None,
        settings: InformerSettings | None = None,
        scope: ShardScope | None = None,
    ) -> None:
        self.nodes: Informer[Body] = Informer(
            api, WORKER_NODE, compact_workernode, namespace=namespace, settings=settings
        )
        self.containers: Informer[Body] = Informer(
            api,
            CONTAINER_DISPATCH,
            compact_containerdispatch,
            namespace=namespace,
            settings=settings,
        )
        self._kube = kube
        self._policies = policies
        self._controller = controller
        self._dispatcher = dispatcher
        self._validator = validator
        status.fold = self.nodes.fold
        controller.fold = self.nodes.fold
        if dispatcher is not None:
            parts = adapters_of(dispatcher)
            if parts.pool is not None:
                parts.pool.fold = self.nodes.fold
            parts.queue.fold = self.containers.fold
        self._scope = scope
        self._scoped: set[str] = set()
        """The nodes handed to the power controller (sharding on)."""
        if scope is not None:
            scope.on_change = self._reroute
        self._validation: asyncio.Task[None] | None = None
        self._specs: dict[str, tuple[Mapping[str, Any], WorkerNodeSpec | None]] = {}

    def _node_changed(self, etype: EventType, old: Body | None, new: Body | None) -> None:
        body = new if new is not None else old
        assert body is not None
        deleted = etype == "DELETED"
        if deleted:
            self._specs.pop(body["metadata"]["name"], None)
        spec = None if deleted else self._spec(body)
        if self._dispatcher is not None:
            self._dispatcher.observe_node(body, deleted=deleted, spec=spec)
        if self._scope is None:
            self._controller.observe_node(body, deleted=deleted, spec=spec)
            return
        self._scope.observe(body, deleted=deleted)
        self._route(body, deleted, spec)

    def _route(self, body: Body, deleted: bool, spec: WorkerNodeSpec | None) -> None:
        """Sharding on: the node to the power controller while it is in scope; as deleted
        once it leaves it (label changed, shard released, node deleted)."""
        assert self._scope is not None
        name = body["metadata"]["name"]
        if not deleted and self._scope.acts_on(name):
            self._scoped.add(name)
            self._controller.observe_node(body, deleted=False, spec=spec)
        elif name in self._scoped:
            self._scoped.discard(name)
            self._controller.observe_node(body, deleted=True, spec=None)

    def _reroute(self) -> None:
        """A shard was acquired or released: route every node again."""
        for _, body in self.nodes.store.items():
            name = body["metadata"]["name"]
            if self._scope is not None and (name in self._scoped) != self._scope.acts_on(name):
                self._route(body, False, self._spec(body))

    def _spec(self, body: Body) -> WorkerNodeSpec | None:
        """The node's parsed spec, one parse per spec change shared by both consumers (a
        status write, most events, reuses the last); None if it does not parse (each
        consumer then records why)."""
        name = body["metadata"]["name"]
        raw = body.get("spec") or {}
        held = self._specs.get(name)
        if held is not None and held[0] == raw:
            parsed = held[1]
        else:
            try:
                parsed = WorkerNodeSpec.model_validate(raw)
            except ValidationError:
                parsed = None
        self._specs[name] = (raw, parsed)  # the current body's dict: the old one can go
        return parsed

    def _container_changed(self, etype: EventType, old: Body | None, new: Body | None) -> None:
        assert self._dispatcher is not None
        body = new if new is not None else old
        assert body is not None
        self._dispatcher.observe_container(body, deleted=etype == "DELETED")

    async def start(self) -> None:
        """Start both informers; once both have their first LIST and the PowerPolicies are
        listed (nodes are validated against them), hand every object to its consumers and
        from then on every change."""
        self.nodes.start()
        self.containers.start()
        await asyncio.gather(
            self.nodes.wait_synced(), self.containers.wait_synced(), self._load_policies()
        )
        _deliver(self.nodes, self._node_changed)
        if self._dispatcher is not None:
            _deliver(self.containers, self._container_changed)
        if self._validator is not None:
            self._validator.attach(self.containers)
            _deliver(self.containers, self._validator.on_change)
            self._validation = asyncio.create_task(self._validator.run(), name="cd-validation")
        log.info(
            "feed synced",
            extra={"workernodes": len(self.nodes.store), "containers": len(self.containers.store)},
        )

    async def _load_policies(self) -> None:
        """List the PowerPolicies into the book and hand each to the power controller: what
        their status holds (the forecast's histogram, the policy in force) is read before
        its first round, which would otherwise start the histogram afresh and overwrite the
        stored one before kopf's first PowerPolicy event arrives."""
        delay = 0.5
        while True:
            try:
                bodies = await self._policies.load(self._kube)
                break
            except KubeError as exc:
                log.warning("PowerPolicy listing failed (%s); retrying in %.1fs", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
        for body in bodies:
            self._controller.observe_policy(body)

    async def stop(self) -> None:
        if self._validation is not None:
            self._validation.cancel()
            await asyncio.gather(self._validation, return_exceptions=True)
            self._validation = None
        await self.nodes.stop()
        await self.containers.stop()


def _deliver(informer: Informer[Body], handler: Handler) -> None:
    """Hand `handler` every object the store holds, then every change. Synchronous: no
    change can slip between the two."""
    for _, body in informer.store.items():
        handler("ADDED", None, body)
    informer.add_handler(handler)


def register(
    registry: kopf.OperatorRegistry,
    dispatcher: Dispatcher | None,
    controller: PowerController,
    policies: PolicyBook,
) -> None:
    """kopf's part of the feed: PowerPolicy and PowerIntent events."""

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
