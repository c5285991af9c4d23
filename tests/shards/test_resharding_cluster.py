"""Issue 24's resharding acceptance on the real control plane: 2 -> 3 shards under load.

Two in-process replicas (`shardkit.Replica`: each its own API client, `ShardElector` on
real Leases, `ShardedPowerControl` over one hollow fleet, and the owner's RELEASE step
`shards.release`) act on 20 WorkerNodes continuously; the resharder (`shards.resharder`,
in replica a, as in the replica holding the dispatcher Lease) labels them for 2 shards,
then the count becomes 3 (each elector's `set_shards`, the resharder's count: a rollout
of the new config, at once). The evidence of "never two owners" is counted twice: at the
hollow BMCs (no node's power requests from two replicas interleave) and by a timeline of
who owns each node, sampled every 20 ms (`Replica.owns`: its view puts the node in a
shard whose Leadership it holds). The same timeline bounds each node's time without an
owner. The canary relabels a node a -> b in one write (no DRAIN, no RELEASE) while a's
owner's view lags: the same two pieces of evidence catch it.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from shardkit import (
    DISPATCHER,
    DURATION,
    NODES,
    Replica,
    api_client,
    side_node_body,
    until,
    workernodes,
)

from clusterkit import ClusterHandle, start_operator, wait_for
from nodewarden.api.kinds import WORKER_NODE
from nodewarden.kube.client import Kube
from nodewarden.shards.keys import DRAIN_LABEL, SHARD_LABEL, label_value, node_key, shard_of
from nodewarden.shards.resharder import reshard, run_resharder
from nodewarden_doubles.hollow import HollowFleet

pytestmark = pytest.mark.cluster


@pytest.fixture
def moving_namespace(cluster: ClusterHandle) -> Iterator[str]:
    """A namespace of its own whose nodes include some that move from 2 to 3 shards (the
    shard depends on the namespace: a name where none would move is skipped, not left to
    chance)."""
    while True:
        name = f"t-{uuid.uuid4().hex[:10]}"
        keys = [node_key(name, n) for n in NODES]
        if sum(shard_of(k, 2) != shard_of(k, 3) for k in keys) >= 3:
            break
    cluster.kubectl("create", "namespace", name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@dataclass
class Timeline:
    """Who owns each node, as sampled: the changes, each (monotonic time, owners)."""

    replicas: tuple[Replica, ...]
    changes: dict[str, list[tuple[float, frozenset[str]]]] = field(default_factory=dict)

    async def record(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            now = time.monotonic()
            for node in NODES:
                owners = frozenset(r.name for r in self.replicas if r.owns(node))
                runs = self.changes.setdefault(node, [])
                if not runs or runs[-1][1] != owners:
                    runs.append((now, owners))
            await asyncio.sleep(0.02)

    def two_owners(self, since: float) -> dict[str, set[str]]:
        """Nodes seen with more than one owner at once after `since`."""
        return {
            node: set(owners)
            for node, runs in self.changes.items()
            for at, owners in runs
            if len(owners) > 1 and at >= since
        }

    def longest_ownerless(self, since: float, until_: float) -> dict[str, float]:
        """Per node, its longest span without an owner inside [since, until_]."""
        longest: dict[str, float] = {}
        for node, runs in self.changes.items():
            worst = 0.0
            for i, (at, owners) in enumerate(runs):
                if owners:
                    continue
                end = runs[i + 1][0] if i + 1 < len(runs) else until_
                span = min(end, until_) - max(at, since)
                worst = max(worst, span)
            longest[node] = worst
        return longest


def labels_of(cluster: ClusterHandle, namespace: str) -> dict[str, dict[str, str]]:
    items = cluster.get_json(namespace, "workernodes")["items"]
    return {n["metadata"]["name"]: n["metadata"].get("labels", {}) for n in items}


async def read_labels(
    kube: Kube, namespace: str, into: dict[str, dict[str, str]], stop: asyncio.Event
) -> None:
    """Keep `into` the WorkerNodes' labels, read every 0.1 s (on the loop: a kubectl call
    would stall the replicas)."""
    while not stop.is_set():
        for body in await kube.list(WORKER_NODE, namespace):
            into[body["metadata"]["name"]] = body["metadata"].get("labels", {})
        await asyncio.sleep(0.1)


async def test_resharding_two_to_three_under_load_never_two_owners(
    cluster: ClusterHandle, moving_namespace: str
) -> None:
    namespace = moving_namespace
    workernodes(cluster, namespace)
    fleet = HollowFleet()
    fleet.add(NODES)
    a = Replica("a", await api_client(cluster.kubeconfig), namespace, fleet, shards=2)
    b = Replica("b", await api_client(cluster.kubeconfig), namespace, fleet, shards=2)
    count = [2]
    seen: dict[str, dict[str, str]] = {}
    stop = asyncio.Event()
    timeline = Timeline((a, b))
    a.start(stop)
    b.start(stop)
    side = [
        asyncio.create_task(
            run_resharder(a.kube, namespace, lambda: count[0], DISPATCHER, stop, 0.5)
        ),
        asyncio.create_task(timeline.record(stop)),
        asyncio.create_task(read_labels(b.kube, namespace, seen, stop)),
    ]
    keys = {n: node_key(namespace, n) for n in NODES}
    moving = {n for n in NODES if shard_of(keys[n], 2) != shard_of(keys[n], 3)}
    assert len(moving) >= 3  # (moving_namespace)

    def labelled(shards: int) -> bool:
        got = seen
        want = {n: {SHARD_LABEL: label_value(shard_of(keys[n], shards))} for n in NODES}
        return set(got) >= set(NODES) and all(
            {k: v for k, v in got[n].items() if k in (SHARD_LABEL, DRAIN_LABEL)} == want[n]
            for n in NODES
        )

    def everyone_owned() -> bool:
        return all(a.owns(n) or b.owns(n) for n in NODES)

    def holder(shard: int) -> str | None:
        return next((r.name for r in (a, b) if shard in r.elector.held), None)

    def owned_by_target_holders() -> bool:
        """Every node owned by exactly the holder of its shard under 3, and acted on by
        it since the change (its new owner took over under load)."""
        acted = {(x.node, x.actor) for x in fleet.actions[since:]}
        for n in NODES:
            want = holder(shard_of(keys[n], 3))
            if {r.name for r in (a, b) if r.owns(n)} != {want} or (n, want) not in acted:
                return False
        return True

    try:
        await until(lambda: labelled(2), 15, "every node labelled for 2 shards")
        await until(
            lambda: [len(a.elector.held), len(b.elector.held)] == [1, 1] and everyone_owned(),
            15,
            "1 + 1 shards, every node owned",
        )
        since = len(fleet.actions)  # under load: every node acted on by its owner, then
        await until(
            lambda: (
                {(x.node, x.actor) for x in fleet.actions[since:]}
                >= {(n, holder(shard_of(keys[n], 2))) for n in NODES}
            ),
            10,
            "every node acted on by its shard's holder",
        )
        changed = time.monotonic()
        count[0] = 3  # the rollout of the new count: every replica and the resharder
        a.elector.set_shards(3)
        b.elector.set_shards(3)
        await until(lambda: labelled(3), 20, "every node labelled for 3 shards")
        await until(
            lambda: owned_by_target_holders() or timeline.two_owners(since=changed),
            10,
            "every node owned by its new shard's holder, and acted on by it",
        )
        settled = time.monotonic()
        assert timeline.two_owners(since=changed) == {}
        window = fleet.actions[since:]
        print(
            f"2 -> 3: {len(moving)} of {len(NODES)} nodes moved in {settled - changed:.1f}s, "
            f"{len(window)} power requests meanwhile"
        )
        assert fleet.interleaved(since=since) == {}
        # a node that did not move kept its one owner throughout
        for node in set(NODES) - moving:
            assert len({x.actor for x in window if x.node == node}) == 1, node
        assert timeline.two_owners(since=changed) == {}
        ownerless = timeline.longest_ownerless(changed, settled)
        worst = max(ownerless[n] for n in moving)
        print(f"longest time a moving node had no owner: {worst:.2f}s (Lease {DURATION:.0f}s)")
        assert worst <= DURATION
        assert max(ownerless[n] for n in set(NODES) - moving) == 0.0

        # the canary: a -> b in one write, while the old owner's view lags (its watch has
        # not yet delivered the write): both act, and both pieces of evidence say so. The
        # resharder stops first: it would DRAIN the node back towards its shard
        resharder = side.pop(0)
        resharder.cancel()
        await asyncio.gather(resharder, return_exceptions=True)
        moved_to = {r.name: r for r in (a, b)}
        owner = next(r for r in (a, b) if len(r.elector.held) == 1)
        other = b if owner is a else a
        node = next(n for n in NODES if owner.owns(n))
        target = min(other.elector.held)
        canary_since, canary_at = len(fleet.actions), time.monotonic()
        owner.lagging = True
        patch = {"metadata": {"labels": {SHARD_LABEL: label_value(target)}}}
        await other.kube.patch(WORKER_NODE, namespace, node, patch)
        await until(
            lambda: node in fleet.interleaved(since=canary_since),
            5,
            "the direct relabel's two owners interleave at the BMC",
        )
        assert timeline.two_owners(since=canary_at) == {node: set(moved_to)}
    finally:
        stop.set()
        for task in side:
            task.cancel()
        await asyncio.gather(*side, return_exceptions=True)
        await a.stop()
        await b.stop()
        await a.api.close()
        await b.api.close()


async def test_an_old_resharder_leaves_nodes_of_shards_beyond_its_count_alone(
    cluster: ClusterHandle, namespace: str
) -> None:
    """A resharder whose count is below the labels' (an old replica mid-rollout; a
    shrink, not built) writes nothing on those nodes."""
    workernodes(cluster, namespace)
    api = await api_client(cluster.kubeconfig)
    fleet = HollowFleet()
    r = Replica("r", api, namespace, fleet, shards=3)
    try:
        for _ in range(3):  # hold all three shards
            await r.elector.round()
        assert set(r.elector.held) == {0, 1, 2}
        kube = Kube(api, field_manager="old-resharder")
        first = await reshard(kube, namespace, 3, DISPATCHER)
        assert first.assigned == len(NODES)
        in_two = {n for n in NODES if shard_of(node_key(namespace, n), 3) == 2}
        before = labels_of(cluster, namespace)
        old = await reshard(kube, namespace, 2, DISPATCHER)
        # growing moves nodes only to the new shard: the rest agree under 2 and 3
        assert (old.beyond, old.drained, old.assigned) == (len(in_two), 0, 0)
        after = labels_of(cluster, namespace)
        assert {n: after[n] for n in in_two} == {n: before[n] for n in in_two}
    finally:
        await r.elector.close()
        await r.stop()
        await api.close()


def test_the_operator_started_with_three_shards_moves_nodes_labelled_for_two(
    cluster: ClusterHandle, namespace: str, tmp_path: Path
) -> None:
    """The service wiring: WorkerNodes labelled for 2 shards (as an operator with
    `sharding.shards: 2` left them); an operator process with 3 (the rollout of the new
    count, one replica): its resharder DRAINs the nodes whose shard changes, its power
    path (the feed's scope) RELEASEs them, the resharder ASSIGNs them: every node ends
    labelled for 3, none left draining."""
    keys = {n: node_key(namespace, n) for n in NODES}
    moves = [n for n in NODES if shard_of(keys[n], 2) != shard_of(keys[n], 3)]
    assert moves, "no node moves 2 -> 3 in this namespace (a 3e-4 chance): rerun"
    moving = moves[:3]
    names = moving + [n for n in NODES if n not in moves][:5]
    items = [side_node_body(n, **{SHARD_LABEL: label_value(shard_of(keys[n], 2))}) for n in names]
    cluster.kubectl(
        "-n", namespace, "apply", "-f", "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}),
    )  # fmt: skip

    def labelled() -> bool:
        got = labels_of(cluster, namespace)
        return all(
            got[n].get(SHARD_LABEL) == label_value(shard_of(keys[n], 3))
            and DRAIN_LABEL not in got[n]
            for n in names
        )

    conf = tmp_path / "config.yaml"
    conf.write_text(json.dumps({"sharding": {"shards": 3, "labeller_interval": 0.5}}))
    op = start_operator(
        cluster, namespace, tmp_path, f"--config={conf}", f"--kubeconfig={cluster.kubeconfig}"
    )
    try:
        started = time.monotonic()
        wait_for(labelled, 20, what="every node labelled for 3 shards")
        print(f"operator: {len(moving)} nodes moved 2 -> 3 in {time.monotonic() - started:.1f}s")
        assert op.stop() == 0
    finally:
        op.stop()
    log = op.logs()
    assert log.count("released node from shard") == len(moving), log[-3000:]
