"""Each peer row on a trace of a few containers whose cost is computed here by hand.

The fleet: two VM types, `small` (2 vCPUs, 4Gi, 3.6/h = 0.001 per second) and `big`
(8 vCPUs, 32Gi, 5.4/h = 0.0015 per second), billed per second without a minimum; create
0 s, boot 60 s, destroy = the API latency 1 s + shutdown 20 s; containers start 2 s after
they are placed; no RAM overhead. Each test writes the timeline the peer's documented rule
gives and prices it: cost = Σ price per second x (off - launch) per node. A container
arriving late (`tail`) keeps each run going until the nodes it is about have shut down.
"""

from __future__ import annotations

import pytest
from peer_builders import BIG, BOOT, OFF, SMALL, START, fleet, trace

from nodewarden.simulate.peers import run_peer
from nodewarden.simulate.peers.arvados import DispatchCloud, NodeManager
from nodewarden.simulate.peers.autoscaler import ClusterAutoscaler
from nodewarden.simulate.peers.karpenter import Karpenter
from nodewarden.simulate.peers.slurm import Slurm
from nodewarden.simulate.peers.world import PeerRun


def check(run: PeerRun, cost: float, waits: list[float], cycles: int, evicted: int = 0) -> None:
    f = run.figures
    assert run.cost == pytest.approx(cost, abs=1e-9), f
    assert f["waitSeconds"]["max"] == pytest.approx(max(waits)), f
    assert f["waitSeconds"]["p50"] == pytest.approx(sorted(waits)[(len(waits) - 1) // 2]), f
    assert f["powerCycles"] == cycles, f
    assert run.evicted == evicted
    assert f["notRun"] == 0 and f["unfinished"] == 0


def test_dispatch_cloud_one_container_per_node_and_idle_timeout() -> None:
    # A (600 s) and B (300 s) would share a small node; Arvados gives each its own: both
    # created at 0, ready at 60, running from 62. Idle for TimeoutIdle (60 s) -> destroyed.
    t = trace("0,600,1,1Gi", "0,300,1,1Gi", "2000,60,1,1Gi")
    run = run_peer(t, fleet(), DispatchCloud(60), seed=1)
    node_b = 62 + 300 + 60 + OFF  # off at 443
    node_a = 62 + 600 + 60 + OFF  # off at 743
    tail = 2000 + BOOT + START + 60 - 2000  # the run stops when the tail container ends
    check(run, SMALL * (node_a + node_b + tail), [62, 62, 62], cycles=3)
    # each container reserves half its node (1 of 2 vCPUs; 1Gi of 4Gi is less)
    useful = SMALL * 0.5 * (600 + 300 + 60)
    assert run.figures["priceWeightedUtilisation"] == round(useful / run.cost, 3)


def test_node_manager_keeps_idle_nodes_to_the_billing_window() -> None:
    # Polls every 60 s: J is seen at 0, its node ready at 60, J runs 62..362. The node is
    # idle from 362 but may shut down only from minute 54 of its hour: the poll at 3240.
    t = trace("0,300,1,1Gi", "4000,60,1,1Gi")
    run = run_peer(t, fleet(), NodeManager(54), seed=1)
    first = 54 * 60 + OFF  # 0 -> 3261
    second = 4020 + BOOT + START + 60 - 4020  # seen at the poll at 4020
    check(run, SMALL * (first + second), [62, 82], cycles=2)


def test_karpenter_when_empty_packs_one_launch_and_waits_consolidate_after() -> None:
    # Three pending pods in one batch (closes 1 s after the last: at 1): first-fit
    # decreasing puts all three on one NodeClaim; only `big` holds them -> one big node,
    # ready at 61, pods from 63. Empty at 663, consolidatable 30 s later: deleted at 693.
    t = trace("0,600,1,1Gi", "0,600,1,1Gi", "0,300,1,1Gi", "1000,60,1,1Gi")
    run = run_peer(t, fleet(), Karpenter(30, underutilized=False), seed=1)
    node = 693 + OFF - 1
    tail = 1000 + 1 + BOOT + START + 60 - (1000 + 1)  # the tail's batch closes at 1001
    check(run, BIG * node + SMALL * tail, [63, 63, 63, 63], cycles=2)


def test_karpenter_underutilized_deletes_a_node_whose_pod_fits_elsewhere() -> None:
    # B (1 vCPU) gets a small node (launched 1, ready 61, B from 63). A (6 vCPUs) arrives
    # at 200: a big node (launched 201, ready 261, A from 263). At 261 the small node has
    # been consolidatable for 200 s and its pod fits on the big one: deleted, B evicted
    # and run again on the big node from 263 (its first 198 s lost). Both end at 2263; the
    # big node is empty then and deleted at 2293.
    t = trace("0,2000,1,1Gi", "200,2000,6,2Gi")
    run = run_peer(t, fleet(), Karpenter(30, underutilized=True), seed=1)
    small = 261 + OFF - 1
    big = 2263 - 201  # the run ends when the last container ends: billed to then
    check(run, SMALL * small + BIG * big, [263, 63], cycles=2, evicted=1)


def test_cluster_autoscaler_least_waste_unneeded_time_and_delay_after_add() -> None:
    # Scan at 0: three 1-vCPU pods; small: 2 nodes (CPU left idle 1/4), big: 1 node (5/8)
    # -> two small nodes, ready 60, pods 62..362. Unneeded from the scan at 370; removable
    # after 10 m unneeded (970) and 10 m after the scale-up (600): both at 970.
    t = trace("0,300,1,1Gi", "0,300,1,1Gi", "0,300,1,1Gi", "1500,60,1,1Gi")
    run = run_peer(t, fleet(), ClusterAutoscaler(600), seed=1)
    nodes = 2 * (970 + OFF)
    tail = 1500 + BOOT + START + 60 - 1500  # the scan at 1500
    check(run, SMALL * (nodes + tail), [62, 62, 62, 62], cycles=3)
    # unneeded for 60 s only: the delay after the scale-up binds (600)
    run = run_peer(t, fleet(), ClusterAutoscaler(60), seed=1)
    check(run, SMALL * (2 * (600 + OFF) + tail), [62, 62, 62, 62], cycles=3)


def test_cluster_autoscaler_drains_an_underused_node() -> None:
    # Scan at 0: A and B (4 vCPUs) fill one big node, C (3 vCPUs) another (3/8 used). B
    # ends at 362: C fits beside A, the second node is unneeded from the scan at 370 and
    # drained at 970: C is evicted and runs again on the first node from 972 to 5972.
    t = trace("0,5000,4,1Gi", "0,300,4,1Gi", "0,5000,3,1Gi")
    run = run_peer(t, fleet(), ClusterAutoscaler(600), seed=1)
    second = 970 + OFF
    first = 972 + 5000  # the run ends when C ends
    check(run, BIG * (first + second), [62, 62, 972], cycles=2, evicted=1)


SIDE = {
    "name": "srv",
    "capacity": {"vcpus": 4, "ram": "8Gi"},
    "costPerHour": 1.8,  # 0.0005 per second: SLURM's lowest weight
    "initialPower": "On",
    "boot": "60s",
    "shutdown": "20s",
}


def test_slurm_suspends_after_suspend_time_and_resumes_for_a_job() -> None:
    # srv (on, idle) is suspended by the power-save pass at 60 (off at 81). J at 200:
    # srv is the lowest-weight powered-down node: resumed (on at 201, registers at 261),
    # J runs 263..563.
    side = {**SIDE, "bmc": {"latency": "1s", "dropRate": 0.0}}
    run = run_peer(trace("200,300,1,1Gi"), fleet([side]), Slurm(60), seed=1)
    srv = (60 + OFF) + (563 - 201)
    check(run, 0.0005 * srv, [63], cycles=1)


def test_slurm_assumes_the_power_state_from_the_program_exit() -> None:
    # Every BMC request is dropped. The suspend at 60 does nothing: srv stays on (and
    # billed) while SLURM takes it for off after SuspendTimeout. J at 200 is allocated
    # to srv and its resume "succeeds" too; srv never reboots, so after ResumeTimeout
    # (the fleet's slowest boot + 1 m = 121 s) it goes DOWN and J is requeued: a small VM
    # from 321, ready 381, J runs 383..683.
    side = {**SIDE, "bmc": {"latency": "1s", "dropRate": 1.0}}
    run = run_peer(trace("200,300,1,1Gi"), fleet([side]), Slurm(60), seed=1)
    srv = 683  # on from the start to the end of the run
    vm = 683 - 321
    check(run, 0.0005 * srv + SMALL * vm, [183], cycles=1)
    assert run.down == 1
