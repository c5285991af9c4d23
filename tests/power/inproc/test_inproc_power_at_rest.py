"""Work at rest is proportional to change (issue 23): a fleet where nothing changes for
ten fake minutes costs no step, no write and no plan; what still arrives (probes, BMC
reads, the cloud list) only confirms, and a node whose evidence stops is stepped at the
due time its telemetry expires. Counted, not timed."""

from __future__ import annotations

import itertools
from datetime import timedelta
from typing import Any

import pytest
from harness import POLICY, PowerHarness

from nodewarden.power.runtime import ControllerSettings, EnergyBook

pytestmark = pytest.mark.asyncio

REST_POLICY: dict[str, Any] = {**POLICY, "idleThreshold": "2h"}
"""Idle nodes stay on for the whole test (their shutdown is a due time two hours out)."""

TEN_MINUTES = 600.0
TICK = 5.0
PROBE_INTERVAL = 5.0
HOURLY_FIGURES = EnergyBook(status_interval=3600.0)
"""Energy figures are written with a transition or every `status_interval` (issue 26):
an hour here, so the ten minutes at rest hold none (`test_inproc_energy.py` counts them)."""


async def _fleet(h: PowerHarness, n: int) -> list[str]:
    """n nodes: a quarter idle side nodes, a quarter busy ones, a quarter switched off
    (no demand: they stay off), a quarter busy cloud VMs; settled (every first decision
    made, every first write done)."""
    names = []
    for i in range(n):
        name = f"n{i:04d}"
        names.append(name)
        kind = i % 4
        if kind == 0:
            h.side_node(name)
        elif kind == 1:
            h.side_node(name, runners=1)
        elif kind == 2:
            h.side_node(name, power="Off")
        else:
            h.cloud_vm(name)
            h.hosts[name].runners = 1
    await h.start()

    def settled() -> bool:
        return all(h.state(name) in ("Active", "Idle", "Off") for name in names)

    await h.run_until(settled, within=300.0, tick=TICK, what="the fleet settles")
    await h.run_for(120.0, tick=TICK)  # the writes of the first decisions are done
    return names


@pytest.mark.parametrize("n", [50, 500])
async def test_nothing_changing_for_ten_minutes_costs_no_step_write_or_plan(n: int) -> None:
    settings = ControllerSettings(
        power_poll_interval=15.0, power_poll_interval_at_rest=15.0, energy=HOURLY_FIGURES
    )
    async with PowerHarness(
        policy=REST_POLICY, settings=settings, probe_interval=PROBE_INTERVAL
    ) as h:
        h.plan_changes = True
        names = await _fleet(h, n)
        steps, writes, plans = h.ctrl.steps, h.kube.writes, h.plans
        quiet, reads = h.ctrl.quiet, len(h.control.reads)
        energy_reads = len(h.control.energy_reads)
        events = len(h.kube.events)
        await h.run_for(TEN_MINUTES, tick=TICK)
        assert h.ctrl.steps - steps == 0, "a node was evaluated with nothing due"
        assert h.kube.writes - writes == 0, "an API write with nothing changed"
        assert h.plans - plans == 0, "a re-plan with nothing changed"
        assert len(h.kube.events) - events == 0
        # what still arrives only confirms: every probe of an On node and every BMC read
        rounds = TEN_MINUTES / PROBE_INTERVAL
        on_nodes = sum(1 for name in names if h.state(name) != "Off")
        confirmations = h.ctrl.quiet - quiet
        assert confirmations >= on_nodes * rounds * 0.9, (confirmations, on_nodes * rounds)
        bmc_nodes = sum(1 for i in range(n) if i % 4 != 3)
        polls = len(h.control.reads) - reads
        # 15 s at rest: 40 reads per BMC node in ten minutes (a round's tick apart)
        assert bmc_nodes * 30 <= polls <= bmc_nodes * 41, (polls, bmc_nodes)
        # the power readings (one more GET each) ride on those polls: at most one a
        # minute per node that is On, none for a node Off (read once when it went Off)
        taken = h.control.energy_reads[energy_reads:]
        on_bmc = sum(1 for i in range(n) if i % 4 in (0, 1))
        assert all(power == "On" for _, _, power in taken), "an Off node read again"
        assert on_bmc * 8 <= len(taken) <= on_bmc * 11, (len(taken), on_bmc)
        for name in names[:8]:
            times = [at for node, at, _ in taken if node == name]
            assert all(b - a >= timedelta(minutes=1) for a, b in itertools.pairwise(times))


async def test_the_bmc_is_read_less_often_at_rest_than_while_the_node_moves() -> None:
    settings = ControllerSettings(
        power_poll_interval=5.0, power_poll_interval_at_rest=60.0, energy=HOURLY_FIGURES
    )
    policy = {**REST_POLICY, "telemetryMaxAge": "150s"}
    async with PowerHarness(policy=policy, settings=settings, probe_interval=PROBE_INTERVAL) as h:
        h.plan_changes = True
        await _fleet(h, 4)
        reads = len(h.control.reads)
        await h.run_for(TEN_MINUTES, tick=TICK)
        per_node = (len(h.control.reads) - reads) / 3  # three BMC nodes
        assert 9 <= per_node <= 11, per_node  # every 60 s at rest (≤ max age / 2 = 75 s)
        steps = h.ctrl.steps
        assert steps > 0
        h.hosts["n0000"].power = "Off"  # someone switched it off: seen at the next read
        await h.run_until(lambda: h.state("n0000") == "Off", within=75.0, tick=TICK)


async def test_a_node_that_goes_silent_is_stepped_when_its_telemetry_expires() -> None:
    async with PowerHarness(policy=REST_POLICY, probe_interval=PROBE_INTERVAL) as h:
        h.plan_changes = True
        await _fleet(h, 8)
        h.silent.add("n0001")  # a busy side node: its probes stop (its BMC still answers)
        steps = h.ctrl.steps
        last = h.clock()
        max_age = timedelta(seconds=30)  # the harness policy's telemetryMaxAge

        def stale() -> bool:
            return "TELEMETRY_STALE" in h.reasons("n0001")

        took = await h.run_until(stale, within=120.0, tick=1.0, what="stale on time")
        # judged at its expiry (the last probe + max age), not at a later scan
        assert took <= (max_age + timedelta(seconds=PROBE_INTERVAL + 2)).total_seconds()
        assert h.clock() - last >= max_age
        stepped = h.ctrl.steps - steps
        assert 1 <= stepped <= 3, stepped  # that node alone; nobody else was evaluated
        assert h.decision("n0001") != "SHUTDOWN"  # stale evidence never acts
        for name in ("n0000", "n0002", "n0003"):
            assert "TELEMETRY_STALE" not in h.reasons(name)


async def test_a_change_at_rest_is_stepped_at_once() -> None:
    async with PowerHarness(policy=REST_POLICY, probe_interval=PROBE_INTERVAL) as h:
        h.plan_changes = True
        await _fleet(h, 8)
        steps = h.ctrl.steps
        h.hosts["n0001"].runners = 0  # its work ended: the next probe shows it
        await h.run_until(lambda: h.state("n0001") == "Idle", within=15.0, tick=1.0)
        h.queue("job", gpus=1)  # demand: a plan, the nodes it fits are stepped
        assert h.ctrl.steps > steps


async def test_no_node_is_idle_before_the_dispatchers_first_plan() -> None:
    """Start-up in parallel: the controller decides while the dispatcher recovers, but a
    node whose runner list is empty may hold a start in flight that only the ledger knows:
    until the first plan its work is unknown (DEFER), never idle."""
    policy = {**POLICY, "idleThreshold": "30s"}
    async with PowerHarness(policy=policy, probe_interval=PROBE_INTERVAL) as h:
        h.recovering = True
        h.ctrl.await_ledger()
        for i in range(6):
            h.side_node(f"s{i}", runners=i % 2)
        await h.start()
        await h.run_for(300.0, tick=TICK)  # five minutes of recovery: ten idle thresholds
        assert h.control.requests == []
        for i in range(6):
            assert h.state(f"s{i}") != "Off"
            assert "TELEMETRY_MISSING" in h.reasons(f"s{i}"), h.reasons(f"s{i}")
        h.recovering = False  # the first plan: s0, s2, s4 hold nothing and list nothing
        await h.run_until(lambda: h.state("s0") == "Off", within=300.0, tick=TICK)
        assert h.state("s1") == "Active"


async def test_status_writes_per_node_from_start_to_settled_are_at_most_two() -> None:
    """A first start and a restart on the stored statuses: each WorkerNode is written at
    most twice until the fleet settles (the first decision; the settled one)."""
    n = 40
    async with PowerHarness(policy=REST_POLICY, probe_interval=PROBE_INTERVAL) as h:
        h.plan_changes = True
        per_node = _count_status_writes(h.kube)
        names = await _fleet(h, n)
        assert max(per_node.get(name, 0) for name in names) <= 2, per_node
        kube, hosts, clock, vms, pool = h.kube, h.hosts, h.clock, h.vms, h.pool
        await h.ctrl.stop()
    async with PowerHarness(
        policy=REST_POLICY, probe_interval=PROBE_INTERVAL, kube=kube, hosts=hosts, clock=clock
    ) as again:
        again.plan_changes = True
        again.vms.update(vms)
        again.pool.snapshots.update(pool.snapshots)
        per_node.clear()
        await again.start()
        await again.run_for(180.0, tick=TICK)
        assert all(again.state(name) in ("Active", "Idle", "Off") for name in names)
        assert max(per_node.get(name, 0) for name in names) <= 2, per_node


def _count_status_writes(kube: Any) -> dict[str, int]:
    """Count the WorkerNode status writes `kube` takes from now on, per node."""
    counts: dict[str, int] = {}
    original = kube.patch_status

    async def patch_status(kind: Any, namespace: str, name: str, *args: Any, **kw: Any) -> Any:
        if kind.kind == "WorkerNode":
            counts[name] = counts.get(name, 0) + 1
        return await original(kind, namespace, name, *args, **kw)

    kube.patch_status = patch_status
    return counts
