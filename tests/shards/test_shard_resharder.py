"""The resharder's decision per node (`resharding.next_step`), its label patches, and the
owner's side in the scope (`ShardScope.draining`): in process, no API server."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any, cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodewarden.fence import Leadership
from nodewarden.kube.client import Conflict, Kube
from nodewarden.power.control import NodeRef, PowerControl
from nodewarden.shards.keys import DRAIN_LABEL, SHARD_LABEL, shard_of
from nodewarden.shards.release import release_drained
from nodewarden.shards.resharder import Pass, labels_patch, reshard
from nodewarden.shards.resharding import Step, StepKind, apply, next_step
from nodewarden.shards.scope import ShardedPowerControl, ShardScope
from nodewarden_doubles.hollow import side_node_spec

ALL = frozenset(range(8))


def key_moving(old: int, new: int) -> str:
    return next(
        k for k in (f"ns/n{i}" for i in range(1000)) if shard_of(k, old) != shard_of(k, new)
    )


def test_next_step_drains_assigns_and_otherwise_waits() -> None:
    key = key_moving(2, 3)
    source, target = shard_of(key, 2), shard_of(key, 3)
    assert next_step(key, {SHARD_LABEL: str(source)}, 3, ALL) == Step(StepKind.DRAIN, key, source)
    assert next_step(key, {}, 3, ALL) == Step(StepKind.ASSIGN, key, target)
    # draining: only its owner writes next (RELEASE)
    assert next_step(key, {SHARD_LABEL: str(source), DRAIN_LABEL: str(source)}, 3, ALL) is None
    # in place; malformed; labelled beyond the count (an old resharder): left alone
    assert next_step(key, {SHARD_LABEL: str(target)}, 3, ALL) is None
    assert next_step(key, {SHARD_LABEL: "x"}, 3, ALL) is None
    assert next_step(key, {SHARD_LABEL: str(target)}, 2, ALL) is None
    # never towards a shard whose Lease nobody holds yet
    assert next_step(key, {SHARD_LABEL: str(source)}, 3, ALL - {target}) is None
    assert next_step(key, {}, 3, ALL - {target}) is None


@given(st.integers(1, 6), st.integers(1, 6), st.integers(0, 200))
def test_walking_the_steps_ends_every_node_in_its_shard(old: int, new: int, i: int) -> None:
    """DRAIN (resharder), RELEASE (owner), ASSIGN (resharder): never a step the labels
    refuse, and at the end the node sits in `shard_of(key, new)` (growing; a shrink
    leaves nodes of removed shards alone, not built)."""
    if new < old:
        old, new = new, old
    key = f"ns/node-{i}"
    labels: dict[str, str] = {SHARD_LABEL: str(shard_of(key, old))}
    for _ in range(4):
        step = next_step(key, labels, new, ALL)
        if step is None and DRAIN_LABEL in labels:
            step = Step(StepKind.RELEASE, key, int(labels[DRAIN_LABEL]))
        if step is None:
            break
        labels = apply(labels, step)
    assert labels == {SHARD_LABEL: str(shard_of(key, new))}


def test_labels_patch_removes_what_the_step_drops_and_carries_the_version() -> None:
    release = Step(StepKind.RELEASE, "ns/a", 1)
    assert labels_patch("7", release.before(), release.after()) == {
        "metadata": {"resourceVersion": "7", "labels": {SHARD_LABEL: None, DRAIN_LABEL: None}}
    }
    drain = Step(StepKind.DRAIN, "ns/a", 1)
    assert labels_patch("8", drain.before(), drain.after())["metadata"]["labels"] == {
        SHARD_LABEL: "1",
        DRAIN_LABEL: "1",
    }
    assert Pass().settled and not Pass(pending=1).settled


def body(name: str, rv: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": rv, "labels": labels}}


def test_the_scope_stops_acting_on_a_draining_node_and_lists_it_for_release() -> None:
    leads: dict[int, Leadership] = {}
    scope = ShardScope(leads.get)
    scope.acquired(0)
    scope.observe(body("a", "1", **{SHARD_LABEL: "0"}))
    scope.observe(body("b", "1", **{SHARD_LABEL: "1", DRAIN_LABEL: "1"}))  # not ours
    assert scope.acts_on("a") and scope.draining() == [] and not scope.drain_seen.is_set()
    scope.observe(body("a", "2", **{SHARD_LABEL: "0", DRAIN_LABEL: "0"}))
    assert not scope.acts_on("a")
    assert scope.draining() == [("a", 0, "2")] and scope.drain_seen.is_set()
    scope.observe(body("a", "3"))  # released
    assert scope.draining() == [] and not scope.acts_on("a")


class FakeKube:
    """The one call `release_drained` makes: a merge patch (a Conflict when asked)."""

    def __init__(self) -> None:
        self.patches: list[tuple[str, dict[str, Any]]] = []
        self.conflict = False

    async def patch(self, kind: object, namespace: str, name: str, patch: dict[str, Any]) -> Any:
        if self.conflict:
            raise Conflict("changed")
        self.patches.append((name, patch))
        return body(name, "9")


async def test_the_owner_releases_a_drained_node_only_when_idle_and_while_it_holds_the_shard(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [100.0]
    lead = Leadership("nw-shard-0", 15.0, 5.0, clock=lambda: clock[0])
    lead.renewed(clock[0], 3)
    leads = {0: lead}
    scope = ShardScope(leads.get)
    scope.acquired(0)
    scope.observe(body("a", "4", **{SHARD_LABEL: "0", DRAIN_LABEL: "0"}))
    gate = asyncio.Event()

    async def slow(self: PowerControl, node: NodeRef, *_: object) -> str:
        await gate.wait()
        return "sent"

    monkeypatch.setattr(PowerControl, "request", slow)
    control = ShardedPowerControl(scope, cast(Any, None), None, None, lambda: datetime.now(tz=UTC))
    kube = FakeKube()
    # a request that started before the drain was seen is under way: no release yet
    scope.observe(body("a", "3", **{SHARD_LABEL: "0"}))
    under_way = asyncio.create_task(
        control.request(NodeRef("a", side_node_spec("a")), "t", 1, "On")
    )
    await asyncio.sleep(0)
    scope.observe(body("a", "4", **{SHARD_LABEL: "0", DRAIN_LABEL: "0"}))
    assert control.busy("a")
    assert await release_drained(cast(Kube, kube), "ns", scope, control) == 0
    gate.set()
    await under_way
    # a 409 (changed since observed): nothing released, tried again later
    kube.conflict = True
    assert await release_drained(cast(Kube, kube), "ns", scope, control) == 0
    kube.conflict = False
    # no valid Leadership of the shard (never renewed, as after a lapse): nothing written
    leads[0] = Leadership("nw-shard-0", 15.0, 5.0, clock=lambda: clock[0])
    assert await release_drained(cast(Kube, kube), "ns", scope, control) == 0
    leads[0] = lead
    assert await release_drained(cast(Kube, kube), "ns", scope, control) == 1
    assert kube.patches == [
        (
            "a",
            {
                "metadata": {
                    "resourceVersion": "4",
                    "labels": {SHARD_LABEL: None, DRAIN_LABEL: None},
                }
            },
        )
    ]
    assert scope.draining() == [] and scope.shard_of("a") is None  # the written body observed


class ListingKube:
    """`reshard`'s calls: the Leases (all held), the nodes, patches recorded."""

    def __init__(self, nodes: list[dict[str, Any]]) -> None:
        self.nodes = nodes
        self.patches: list[str] = []
        leases = [
            SimpleNamespace(
                metadata=SimpleNamespace(name=f"nw-shard-{s}"),
                spec=SimpleNamespace(holder_identity="pod-a"),
            )
            for s in range(3)
        ]
        listing = SimpleNamespace(items=leases)

        async def list_namespaced_lease(*_: object, **__: object) -> Any:
            return listing

        self.coordination = SimpleNamespace(list_namespaced_lease=list_namespaced_lease)

    async def list(self, *_: object, **__: object) -> list[dict[str, Any]]:
        return self.nodes

    async def patch(self, kind: object, namespace: str, name: str, patch: Any) -> Any:
        self.patches.append(name)
        return {}


async def test_a_pass_counts_what_it_wrote_and_what_waits_and_settles_when_nothing_does() -> None:
    key = key_moving(2, 3)
    name = key.removeprefix("ns/")
    source, target = str(shard_of(key, 2)), str(shard_of(key, 3))
    kube = ListingKube(
        [
            body(name, "1", **{SHARD_LABEL: source}),  # drained
            body("new", "1"),  # assigned
            body("gone", "1", **{SHARD_LABEL: "7"}),  # beyond the count: left alone
            body("odd", "1", **{SHARD_LABEL: "x"}),  # malformed: left alone
        ]
    )
    done = await reshard(cast(Kube, kube), "ns", 3, "nw")
    assert (done.drained, done.assigned, done.beyond, done.malformed) == (1, 1, 1, 1)
    assert kube.patches == [name, "new"] and not done.settled
    kube.nodes = [body(name, "2", **{SHARD_LABEL: source, DRAIN_LABEL: source})]
    waiting = await reshard(cast(Kube, kube), "ns", 3, "nw")
    assert waiting.pending == 1 and not waiting.settled  # its owner's RELEASE is next
    kube.nodes = [body(name, "3", **{SHARD_LABEL: target}), body("odd", "1", **{SHARD_LABEL: "x"})]
    assert (await reshard(cast(Kube, kube), "ns", 3, "nw")).settled
