"""The sharded power path in process: the feed hands the power controller only the nodes
of held shards (and takes them back when a shard goes or a label changes), and every
power request is fenced by its node's shard Leadership (`shards.scope`)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any, cast

import pytest
from kubernetes_asyncio import client

from nodewarden.credentials import CredentialResolver
from nodewarden.credentials.settings import CredentialsConfig
from nodewarden.fence import Leadership, NotLeader
from nodewarden.handlers.feed import Feed
from nodewarden.kube.store import ObjectKey
from nodewarden.power.control import NodeRef, PowerControl, RequestAccepted, RequestErrored
from nodewarden.shards.keys import DRAIN_LABEL, SHARD_LABEL
from nodewarden.shards.scope import ShardedPowerControl, ShardScope, acting_on, node_shard
from nodewarden_doubles.hollow import HollowBmcSecrets, HollowFleet, side_node_spec
from nodewarden_doubles.hollow.bmc import bmc_transports


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


def held(clock: Clock, shard: int) -> Leadership:
    lead = Leadership(f"nw-shard-{shard}", 15.0, 5.0, clock=clock)
    lead.renewed(clock.now, 40 + shard)
    return lead


def body(name: str, shard: int | None, rv: int = 1, **labels: str) -> dict[str, Any]:
    if shard is not None:
        labels[SHARD_LABEL] = str(shard)
    return {
        "metadata": {"name": name, "namespace": "ns", "resourceVersion": str(rv), "labels": labels},
        "spec": {},
    }


class Controller:
    def __init__(self) -> None:
        self.fold: Any = None
        self.seen: list[tuple[str, bool]] = []

    def observe_node(self, body: dict[str, Any], deleted: bool = False, spec: Any = None) -> None:
        self.seen.append((body["metadata"]["name"], deleted))

    def take(self) -> list[tuple[str, bool]]:
        seen, self.seen = self.seen, []
        return sorted(seen)


def test_node_shard_reads_the_label_and_ignores_draining_or_malformed_ones() -> None:
    assert node_shard(body("a", 3)) == 3
    assert node_shard(body("a", None)) is None
    assert node_shard(body("a", 3, **{DRAIN_LABEL: "3"})) is None
    assert node_shard(body("a", None, **{SHARD_LABEL: "07"})) is None


async def test_the_feed_hands_the_controller_only_the_nodes_of_held_shards() -> None:
    clock = Clock()
    leads: dict[int, Leadership] = {}
    scope = ShardScope(leads.get)
    controller = Controller()
    api = client.ApiClient(client.Configuration())
    feed = Feed(
        api,
        "ns",
        kube=cast(Any, None),
        policies=cast(Any, None),
        controller=cast(Any, controller),
        status=cast(Any, SimpleNamespace(fold=None)),
        dispatcher=None,
        validator=None,
        scope=scope,
    )
    nodes = [body("n0", 0), body("n1", 1), body("n2", 0), body("n3", None)]

    def event(etype: str, b: dict[str, Any]) -> None:
        feed.nodes.store.upsert(ObjectKey("ns", b["metadata"]["name"]), 1, b)
        feed._node_changed(cast(Any, etype), None, b)

    for b in nodes:
        event("ADDED", b)
    assert controller.take() == []  # nothing held: nothing to decide

    leads[0] = held(clock, 0)
    scope.acquired(0)
    assert controller.take() == [("n0", False), ("n2", False)]
    event("MODIFIED", body("n2", 0, rv=2))  # a status write: still in scope
    event("MODIFIED", body("n1", 1, rv=2))  # another shard's node: not ours
    assert controller.take() == [("n2", False)]

    event("MODIFIED", body("n0", 0, rv=3, **{DRAIN_LABEL: "0"}))  # leaving its shard
    assert controller.take() == [("n0", True)]

    leads[1] = held(clock, 1)
    scope.acquired(1)
    assert controller.take() == [("n1", False)]

    scope.released(0)  # told before the Lease is written free
    assert controller.take() == [("n2", True)]
    feed._node_changed("DELETED", body("n1", 1), None)
    assert controller.take() == [("n1", True)]
    await api.close()


async def test_every_power_request_asks_the_leadership_of_its_nodes_shard() -> None:
    clock = Clock()
    fleet = HollowFleet(clock=clock)
    fleet.add(["n0", "n1", "n2"])
    leads = {0: held(clock, 0), 1: held(clock, 1)}
    dispatcher_lease = held(clock, 9)
    scope = ShardScope(leads.get, also=dispatcher_lease)
    for name, shard in (("n0", 0), ("n1", 1), ("n2", 2)):
        scope.observe(body(name, shard))
    resolver = CredentialResolver(
        HollowBmcSecrets(), "ns", CredentialsConfig(bmc_endpoints=["127.0.0.1:9"], secret_ttl="0s")
    )
    control = ShardedPowerControl(
        scope,
        resolver,
        None,
        None,
        lambda: datetime.now(tz=UTC),
        user_agent="nodewarden/0.1.0 (power; dispatcher=nw; replica=a)",
        bmc_transport=bmc_transports(fleet),
    )
    try:

        async def request(name: str) -> object:
            return await control.request(NodeRef(name, side_node_spec(name)), "t", 1, "On")

        assert isinstance(await request("n0"), RequestAccepted)
        refused = await request("n2")  # shard 2 is not held here
        assert isinstance(refused, RequestErrored) and refused.source == "fence"
        assert "shard 2 is not held" in refused.detail
        # the token is the node's shard's, not another's
        with acting_on(1):
            assert scope.fence.check("x") == leads[1].check("x")
        with pytest.raises(NotLeader, match="no shard in scope"):
            scope.fence.check("x")
        # shard 1's Lease lapses by our clock: its node is refused, shard 0's still acts
        leads[1].step_down("not renewed in time")
        assert isinstance(await request("n1"), RequestErrored)
        assert isinstance(await request("n0"), RequestAccepted)
        # the dispatcher Lease (`also`) is asked first
        dispatcher_lease.step_down("lost")
        assert isinstance(await request("n0"), RequestErrored)
        assert [(a.node, a.actor) for a in fleet.actions] == [("n0", "a"), ("n0", "a")]
    finally:
        await control.close()


async def test_drain_waits_for_the_requests_under_way_for_its_shard(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = Clock()
    leads = {0: held(clock, 0), 1: held(clock, 1)}
    scope = ShardScope(leads.get)
    scope.observe(body("n0", 0))
    scope.observe(body("n1", 1))
    release = asyncio.Event()
    started: list[str] = []

    async def slow(self: PowerControl, node: NodeRef, *_: object) -> str:
        started.append(node.name)
        await release.wait()
        return "sent"

    monkeypatch.setattr(PowerControl, "request", slow)
    control = ShardedPowerControl(scope, cast(Any, None), None, None, lambda: datetime.now(tz=UTC))
    under_way = asyncio.create_task(
        control.request(NodeRef("n0", side_node_spec("n0")), "t", 1, "On")
    )
    await asyncio.sleep(0)
    assert started == ["n0"]
    await asyncio.wait_for(control.drain(1), 1)  # nothing under way for shard 1
    draining = asyncio.create_task(control.drain(0))
    await asyncio.sleep(0.05)
    assert not draining.done()
    release.set()
    await asyncio.wait_for(draining, 1)
    assert await under_way == "sent"
    await asyncio.wait_for(control.drain(0), 1)  # quiet again
