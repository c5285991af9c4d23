"""Issue 24's takeover acceptance on the real control plane: two replicas, four shard
Leases, 20 WorkerNodes labelled by the labeller, actions counted at the hollow BMCs.

Each replica is an in-process composition with its own API client (its own connection
pool), its own `ShardElector` (real Leases, real `LeaderElector`s and `Leadership`s) and
its own `ShardedPowerControl` (the real Redfish client over the hollow fleet's BMC
transport), so both act on one shared hollow fleet (docs/sharding.md §4: the model is
not yet shared across processes). Replica A reaches the API server through a loopback TCP
proxy; the test black-holes it (a partition: A keeps running and keeps trying to act on
the nodes it believes are its own, only its fence stops it).
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from shardkit import (
    DISPATCHER,
    DURATION,
    NODES,
    SHARDS,
    Replica,
    api_client,
    electors,
    lease_holders,
    power_control,
    proxied,
    side_node_body,
    until,
    workernodes,
)

from calibration import scaled
from clusterkit import ClusterHandle, start_operator, wait_for
from nodewarden.check.runner import CheckOptions, run_checks
from nodewarden.fence import Leadership
from nodewarden.ownership import DISPATCHER_LABEL
from nodewarden.power.control import NodeRef
from nodewarden.shards.balance import decide
from nodewarden.shards.keys import SHARD_LABEL, node_key, shard_of
from nodewarden.shards.labeller import label_unassigned
from nodewarden_doubles.hollow import HollowFleet, side_node_spec

pytestmark = pytest.mark.cluster


async def test_two_replicas_split_four_shards_and_a_clean_stop_hands_over_at_once(
    cluster: ClusterHandle, namespace: str
) -> None:
    api_a, api_b = await api_client(cluster.kubeconfig), await api_client(cluster.kubeconfig)
    a, b = electors(api_a, namespace, "a"), electors(api_b, namespace, "b")
    stop_a, stop_b = asyncio.Event(), asyncio.Event()
    drained: list[tuple[int, bool]] = []
    leads: dict[int, Leadership] = {}

    async def drain(shard: int) -> None:  # told while the Leadership is still valid
        # only the clean stop's releases: a shard a gives up while the two first balance
        # is not counted (a KeyError here used to end a's rounds: a flaky 2 + 2 wait)
        if shard in leads:
            drained.append((shard, leads[shard].valid))

    a.drain = drain
    running = [asyncio.create_task(a.run(stop_a)), asyncio.create_task(b.run(stop_b))]
    try:
        await until(lambda: len(a.held) == 2 and len(b.held) == 2, 10, "2 + 2 shards")
        assert set(a.held).isdisjoint(b.held)
        # every nodewarden Lease is labelled: kubectl shows who holds which shard
        holders = lease_holders(cluster, namespace)
        shard_leases = {f"{DISPATCHER}-shard-{s}" for s in range(SHARDS)}
        assert shard_leases <= set(holders)
        assert {holders[f"{DISPATCHER}-shard-{s}"] for s in a.held} == {"a"}
        assert {holders[f"{DISPATCHER}-member-{r}"] for r in "ab"} == {"a", "b"}
        # a clean stop releases: b takes every shard well before a Lease duration
        held_by_a = set(a.held)
        leads.update(a.held)
        stopped = time.monotonic()
        stop_a.set()
        await running[0]
        assert not a.held
        assert sorted(drained) == [(s, True) for s in sorted(held_by_a)]
        await until(lambda: len(b.held) == SHARDS, DURATION / 2, "b holds 4")
        assert time.monotonic() - stopped < DURATION
    finally:
        stop_a.set()
        stop_b.set()
        await asyncio.gather(*running, return_exceptions=True)
        await api_a.close()
        await api_b.close()


async def test_a_standby_that_watched_takes_a_dead_holders_shards_in_its_first_round(
    cluster: ClusterHandle, namespace: str
) -> None:
    """`ShardElector.watch` (a standby reads, writes nothing): when it may act, a dead
    holder's Leases are already expired by its own clock; a replica that did not watch
    (the canary) sees them live for a whole duration more."""
    async with proxied(cluster.kubeconfig) as proxy:
        apis = [await api_client(cluster.kubeconfig, via=proxy)]
        apis += [await api_client(cluster.kubeconfig) for _ in range(2)]
        a, b, c = (electors(api, namespace, r) for api, r in zip(apis, "abc", strict=True))
        stop_a, stop_b = asyncio.Event(), asyncio.Event()
        tasks = [asyncio.create_task(a.run(stop_a)), asyncio.create_task(b.watch(stop_b))]
        try:
            await until(lambda: len(a.held) == SHARDS, 10, "a holds all 4")
            proxy.stall()  # a is gone for everyone
            names = [f"{DISPATCHER}-shard-{s}" for s in range(SHARDS)]
            await until(
                lambda: all(n in b._watches and b._watches[n].expired(DURATION) for n in names),
                DURATION + 5,
                "b sees a's Leases unchanged for a duration",
            )
            view = await c._view()  # the canary: first sight, so a is live to c
            assert view is not None and decide(view).acquire == ()
            stop_b.set()
            await b.round()
            assert set(b.held) == set(range(SHARDS))
        finally:
            stop_a.set()
            stop_b.set()
            proxy.unstall()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await b.close()
            for api in apis:
                await api.close()


async def test_a_partitioned_replica_loses_its_shards_and_no_node_has_two_owners(
    cluster: ClusterHandle, namespace: str
) -> None:
    workernodes(cluster, namespace)
    fleet = HollowFleet()
    fleet.add(NODES)
    async with proxied(cluster.kubeconfig) as proxy:
        a = Replica("a", await api_client(cluster.kubeconfig, via=proxy), namespace, fleet)
        b = Replica("b", await api_client(cluster.kubeconfig), namespace, fleet)
        # the labeller gives every node its shard (conditional writes; a second pass: none;
        # another dispatcher's node: never)
        foreign = {
            **side_node_body("other-install"),
            "metadata": {"name": "foreign", "labels": {DISPATCHER_LABEL: "other"}},
        }
        cluster.kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(foreign))
        assert await label_unassigned(b.kube, namespace, SHARDS, DISPATCHER) == len(NODES)
        assert await label_unassigned(b.kube, namespace, SHARDS, DISPATCHER) == 0
        labels = cluster.get_json(namespace, "workernode", "foreign")["metadata"]["labels"]
        assert SHARD_LABEL not in labels
        stop = asyncio.Event()
        a.start(stop)
        b.start(stop)
        try:
            shard_of_node = {n: shard_of(node_key(namespace, n), SHARDS) for n in NODES}
            await until(lambda: [len(r.elector.held) for r in (a, b)] == [2, 2], 15, "2 + 2")
            # a window in which every node is decided and no shard moved (a lone first
            # replica may take all, then hand 2 over; a loop stall on a loaded machine may
            # cost a renewal and move a shard, fenced: then the window is taken again)
            for _ in range(3):
                moves = a.moves + b.moves
                since = len(fleet.actions)
                await until(
                    lambda: {x.node for x in fleet.actions[since:]} >= set(NODES),  # noqa: B023
                    10,
                    "every node",
                )
                if a.moves + b.moves == moves and [len(a.believed), len(b.believed)] == [2, 2]:
                    break
            else:
                raise AssertionError("shards kept moving: no stable window of ownership")
            # before the cut: every node decided by exactly one replica, its shard's holder
            actors: dict[str, set[str | None]] = {}
            for x in fleet.actions[since:]:
                actors.setdefault(x.node, set()).add(x.actor)
            held = [set(r.elector.held) for r in (a, b)]
            for node in NODES:
                (actor,) = actors[node]
                assert shard_of_node[node] in held[0 if actor == "a" else 1], (node, actor, held)
            a_nodes = {n for n in NODES if shard_of_node[n] in a.elector.held}

            cut = time.monotonic()
            cut_at = len(fleet.actions)
            a.deaf = True
            proxy.stall()  # A is partitioned: its requests hang, it keeps running
            taken = await until(lambda: len(b.elector.held) == SHARDS, DURATION + 10, "b: 4") - cut
            resumed = await until(
                lambda: {x.node for x in fleet.actions[cut_at:] if x.actor == "b"} >= a_nodes,
                DURATION + 10,
                "b decides a's former nodes",
            )
            print(f"takeover {taken:.1f}s, decisions resumed {resumed - cut:.1f}s after the cut")
            assert resumed - cut <= scaled(DURATION + 10)
            # A kept trying; its fence refused it once its own Leadership ran out
            await until(lambda: a.fenced_out > 0, 5, "a refused by its fence")
            last_a = max(x.at for x in fleet.actions if x.actor == "a")
            first_b = min(
                x.at for x in fleet.actions[cut_at:] if x.node in a_nodes and x.actor == "b"
            )
            assert last_a < first_b
            # never after the Lease duration from its last renewal (before the cut): the
            # fence ends its validity MARGIN before that; a request that passed the fence
            # just in time may still be on its way
            assert last_a < cut + DURATION
            assert fleet.interleaved(since=since) == {}
        finally:
            stop.set()
            proxy.unstall()
            await a.stop()
            await b.stop()
            await a.api.close()
            await b.api.close()
        # the canary: the same evidence catches a second owner that is not fenced
        ghost, owner = power_control(fleet, "a", None), power_control(fleet, "b", None)
        node = sorted(a_nodes)[0]
        await ghost.request(NodeRef(node, side_node_spec(node)), "ghost", 1, "On")
        await owner.request(NodeRef(node, side_node_spec(node)), "again", 1, "On")
        await ghost.close()
        await owner.close()
        assert node in fleet.interleaved(since=since)


def test_the_operator_with_sharding_on_labels_its_nodes_and_holds_every_shard(
    cluster: ClusterHandle, namespace: str, tmp_path: Path
) -> None:
    """The service wiring (`sharding.shards: 2`): one replica takes both shard Leases
    and a membership Lease (all labelled), labels every WorkerNode, reports the shards
    held in its metrics, and releases the Leases on a clean stop; cross-process admission
    is on (composed into the dispatcher and the controller). The admin kubeconfig:
    the chart's Role does not grant the shard Leases yet (docs/sharding.md §5)."""
    names = NODES[:6]
    conf = tmp_path / "config.yaml"
    sharding = {"shards": 2, "labeller_interval": 0.5, "cross_process_admission": True}
    conf.write_text(json.dumps({"sharding": sharding}))
    items = [side_node_body(name) for name in names]
    cluster.kubectl(
        "-n", namespace, "apply", "-f", "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}),
    )  # fmt: skip
    op = start_operator(
        cluster, namespace, tmp_path, f"--config={conf}", f"--kubeconfig={cluster.kubeconfig}"
    )
    dispatcher = "nodewarden"
    try:

        def labelled() -> bool:
            nodes = cluster.get_json(namespace, "workernodes")["items"]
            got = {n["metadata"]["name"]: n["metadata"].get("labels", {}) for n in nodes}
            return all(
                got[n].get(SHARD_LABEL) == str(shard_of(node_key(namespace, n), 2)) for n in names
            )

        wait_for(labelled, 15, what="every WorkerNode labelled with its shard")

        def holders() -> dict[str, str]:
            leases = cluster.get_json(namespace, "lease", "-l", f"{DISPATCHER_LABEL}={dispatcher}")
            return {
                x["metadata"]["name"]: x["spec"].get("holderIdentity") or ""
                for x in leases["items"]
            }

        def all_held() -> dict[str, str] | None:
            seen = holders()
            shards = [seen.get(f"{dispatcher}-shard-{s}") for s in range(2)]
            return seen if shards[0] and shards[0] == shards[1] else None

        seen = wait_for(all_held, 15, what="both shard Leases held")
        identity = seen[f"{dispatcher}-shard-0"]
        assert seen[f"{dispatcher}-member-{identity}"] == identity
        assert seen[f"nodewarden-{dispatcher}"] == identity  # the dispatcher Lease, labelled
        # `nodewarden check` lists each shard's holder
        report = asyncio.run(
            run_checks(
                CheckOptions(
                    kubeconfig=cluster.kubeconfig, namespace=namespace, config=conf, timeout=2
                )
            )
        )
        lines = [r for r in report.results if r.check == "shards"]
        assert [r.status.value for r in lines] == ["pass"] * 3, lines
        assert f"held by {identity}" in lines[0].message
        status, text = op.get("/metrics")
        assert status == 200
        assert f'nodewarden_shards_held{{dispatcher_id="{dispatcher}"}} 2.0' in text
        assert op.stop() == 0
        after = holders()
        assert not after[f"{dispatcher}-shard-0"] and not after[f"{dispatcher}-shard-1"]
    finally:
        op.stop()
