"""Energy in the live power controller, in process (issue 26): power readings riding on
the BMC polls, the figures in WorkerNode and PowerPolicy status (written with a
transition or every `status_interval`, counted), the saving as Safety Record evidence,
"today" in the policy's time zone, cloud VM hours avoided, a node without a reading, the
live metrics, and the figures surviving a restart."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from harness import POLICY, PowerHarness

from nodewarden.api.kinds import POWER_POLICY
from nodewarden.metrics import REGISTRY
from nodewarden.power.runtime import ControllerSettings, EnergyBook
from nodewarden.rules.savings import EnergyClass

pytestmark = pytest.mark.asyncio

KWH = 3_600_000.0
GPU = EnergyClass(
    idle_watts=300.0, off_watts=15.0, boot_energy_wh=5.0, shutdown_energy_wh=1.0, price_per_kwh=0.4
)
BOOK = EnergyBook(
    classes={"default": GPU}, currency="EUR", status_interval=300.0, idle_measure=300.0
)
SETTINGS = ControllerSettings(energy=BOOK)
ENERGY_POLICY: dict[str, Any] = {**POLICY, "idleThreshold": "20m", "telemetryMaxAge": "2m"}
AT_REST: dict[str, Any] = {**ENERGY_POLICY, "idleThreshold": "6h"}


def energy(h: PowerHarness, node: str) -> dict[str, Any]:
    return dict(h.status(node).get("energy") or {})


def policy_energy(h: PowerHarness, name: str = "default") -> dict[str, Any]:
    return dict(h.kube.status(POWER_POLICY, "ns", name).get("energy") or {})


def sample(name: str, **labels: str) -> float | None:
    value = REGISTRY.get_sample_value(name, labels)
    return None if value is None else float(value)


async def test_an_off_period_is_measured_and_its_saving_is_in_status_and_records() -> None:
    async with PowerHarness(policy=ENERGY_POLICY, settings=SETTINGS) as h:
        host = h.side_node("n1", watts=200.0, off_watts=8.0)
        await h.start()
        await h.run_until(lambda: h.state("n1") == "Off", within=1800, tick=5, what="n1 Off")
        went_off = h.clock()
        await h.run_for(3600, tick=5)
        h.queue("gpu-job", gpus=1, wake="n1")
        await h.run_until(lambda: h.state("n1") in ("Idle", "Active"), within=300, tick=2)
        figures = energy(h, "n1")
        # written with the wake's own patch: the off period is in it
        assert figures["method"] == "Integrated" and figures["currency"] == "EUR"
        assert figures["source"].endswith("#PowerConsumedWatts")
        assert figures["idleWattsBasis"] == "Measured" and figures["idleWatts"] == 200.0
        assert figures["offWattsBasis"] == "Measured" and figures["offWatts"] == 8.0
        assert figures["savedBasis"] == "Measured"
        assert figures["shutdowns"] == 1 and figures["boots"] == 1
        off = figures["offSeconds"]
        assert abs(off - 3600) <= 60, off  # the Off stretch of the state machine
        # the hand computation: time off x (200 - 8) W - one boot (5 Wh) and shutdown (1 Wh)
        hand = (off * 192 - 6 * 3600) / KWH
        assert figures["savedKwh"] == pytest.approx(hand, rel=0.01)
        assert figures["moneySaved"] == pytest.approx(hand * 0.4, rel=0.01)
        assert figures["gaps"] == 0
        # usedKwh: the readings' energy (the host draws exactly 200 W On and 8 W Off)
        host.settle(h.clock())
        assert figures["usedKwh"] <= host.energy_joules / KWH
        assert figures["usedKwh"] == pytest.approx(host.energy_joules / KWH, rel=0.1)
        # the shutdown's record: the expected saving; the wake's: the measured one
        shutdown = next(i for i in h.intents("n1") if i["spec"]["action"] == "Shutdown")
        expected = shutdown["status"]["requestRecord"]["energy"]
        assert expected["kind"] == "Expected" and expected["currency"] == "EUR"
        assert "minOff" in expected["offSecondsBasis"]
        wake = next(i for i in h.intents("n1") if i["spec"]["action"] == "Wake")
        measured = wake["status"]["requestRecord"]["energy"]
        assert measured["kind"] == "Measured"
        assert abs(measured["offSeconds"] - (h.clock() - went_off).total_seconds()) <= 300
        assert measured["idleBasis"] == "Measured" and measured["offBasis"] == "Measured"
        # the live metrics, read at the scrape
        assert sample("nodewarden_node_power_watts", node="n1", policy="default", power="On") == 200
        used = sample("nodewarden_node_energy_joules_total", node="n1", policy="default")
        assert used is not None and used >= (figures["usedKwh"] - 0.0001) * KWH  # 4 decimals
        saved = sample("nodewarden_energy_saved_joules", policy="default", basis="Measured")
        assert saved == pytest.approx(hand * KWH, rel=0.01)
        money = sample("nodewarden_money_saved", policy="default", source="energy", currency="EUR")
        assert money == pytest.approx(hand * 0.4, rel=0.01)


async def test_figures_are_written_every_status_interval_never_per_reading() -> None:
    async with PowerHarness(policy=AT_REST, settings=SETTINGS) as h:
        for i in range(6):
            h.side_node(f"s{i}", power="Off" if i % 2 else "On")
        writes: dict[str, int] = {}
        original = h.kube.patch_status

        async def counting(kind: Any, ns: str, name: str, patch: Any, *a: Any, **kw: Any) -> Any:
            if kind.kind == "WorkerNode":
                writes[name] = writes.get(name, 0) + 1
            return await original(kind, ns, name, patch, *a, **kw)

        h.kube.patch_status = counting  # type: ignore[method-assign]
        await h.start()
        await h.run_for(120, tick=5)  # settled: the first writes done
        writes.clear()
        reads = len(h.control.energy_reads)
        await h.run_for(1200, tick=5)  # twenty minutes at rest, figures every five
        for i in range(6):
            assert 3 <= writes.get(f"s{i}", 0) <= 5, writes
        taken = h.control.energy_reads[reads:]
        assert all(power == "On" for _, _, power in taken)  # Off nodes: read once, before
        assert 3 * 18 <= len(taken) <= 3 * 21  # once a minute per On node
        figures = energy(h, "s1")
        assert figures["offSeconds"] >= 900 and figures["savedBasis"] == "Configured"


async def test_a_node_without_a_reading_counts_its_time_off_and_says_so() -> None:
    async with PowerHarness(policy=AT_REST, settings=SETTINGS) as h:
        h.side_node("sushy", power="Off", reading="none")
        await h.start()
        await h.run_for(700, tick=5)
        figures = energy(h, "sushy")
        assert figures["method"] == "None"
        assert figures["message"].startswith("no reading: the BMC serves no Power")
        assert figures["offSeconds"] >= 300 and figures["idleWattsBasis"] == "Configured"
        assert figures["savedKwh"] > 0  # time off x the class's configured draws
        assert (
            sample("nodewarden_node_power_watts", node="sushy", policy="default", power="Off")
            is None
        )


async def test_today_counts_from_midnight_in_the_policys_time_zone() -> None:
    # the harness starts at 12:00 UTC = 21:00 in Tokyo: Tokyo's day turns at 15:00 UTC
    async with PowerHarness(policy={**AT_REST, "timeZone": "Asia/Tokyo"}, settings=SETTINGS) as h:
        h.side_node("t1", power="Off")
        await h.start()
        await h.run_for(4 * 3600, tick=20)
        sums = policy_energy(h)
        assert sums["timeZone"] == "Asia/Tokyo" and sums["currency"] == "EUR"
        assert sums["day"] == (h.clock() + timedelta(hours=9)).date().isoformat()
        # configured draws: 285 W saved per second off; today = since 15:00 UTC
        today = (h.clock() - h.clock().replace(hour=15, minute=0, second=0)).total_seconds()
        assert sums["savedKwhToday"] == pytest.approx(285 * today / KWH, rel=0.05, abs=0.01)
        assert sums["savedKwh"] > sums["savedKwhToday"] * 3
        assert sums["nodesConfigured"] == 1 and sums["nodesMeasured"] == 0


async def test_cloud_vms_have_no_reading_and_count_vm_hours_avoided() -> None:
    async with PowerHarness(policy=AT_REST, settings=SETTINGS) as h:
        h.cloud_vm("vm-a")
        h.cloud_vm("vm-b")
        await h.start()
        await h.run_for(60, tick=5)
        assert energy(h, "vm-a")["method"] == "None"
        assert "cloud VM" in energy(h, "vm-a")["message"]
        h.delete_node("vm-b")  # its instance is gone: never-off would have kept it
        await h.run_for(3600, tick=20)
        sums = policy_energy(h)
        assert sums["vmHoursAvoided"] == pytest.approx(1.0, abs=0.1)
        assert sample("nodewarden_vm_avoided_seconds", policy="default") == pytest.approx(
            3600, abs=360
        )


async def test_the_figures_survive_a_restart() -> None:
    async with PowerHarness(policy=AT_REST, settings=SETTINGS) as h:
        h.side_node("r1", power="Off")
        h.side_node("r2", watts=250.0)
        h.cloud_vm("vm-a")
        h.cloud_vm("vm-b")
        await h.start()
        await h.run_for(60, tick=5)
        h.delete_node("vm-b")
        await h.run_for(1800, tick=10)
        before = {n: energy(h, n) for n in ("r1", "r2")}
        vms_before = policy_energy(h)["vmHoursAvoided"]
        kube, hosts, clock, vms, pool = h.kube, h.hosts, h.clock, h.vms, h.pool
        await h.ctrl.stop()
    clock.advance(30)  # the operator was away for half a minute
    async with PowerHarness(
        policy=AT_REST, settings=SETTINGS, kube=kube, hosts=hosts, clock=clock
    ) as again:
        again.vms.update(vms)
        again.pool.snapshots.update(pool.snapshots)
        await again.start()
        await again.run_for(1200, tick=10)
        after = {n: energy(again, n) for n in ("r1", "r2")}
        for node in ("r1", "r2"):
            assert after[node]["since"] == before[node]["since"]
            assert after[node]["usedKwh"] > before[node]["usedKwh"]
        # time off went on across the restart (the node stayed Off)
        assert after["r1"]["offSeconds"] >= before["r1"]["offSeconds"] + 1200
        assert after["r2"]["idleWattsBasis"] == "Measured"  # the measurement was kept
        assert policy_energy(again)["vmHoursAvoided"] > vms_before + 0.3


async def test_saved_today_per_node_class_rides_with_the_policys_figures() -> None:
    """PowerPolicy status.energy.classes: each node class's side nodes' saving today, in
    the same writes as the policy's sums (every status interval), never per round."""
    a10 = {"name": "a10", "nodeType": "SideNode", "gpuModel": "a10"}
    l4 = {"name": "l4", "nodeType": "SideNode", "gpuModel": "l4"}
    policy = {**AT_REST, "nodeClasses": [a10, l4]}
    async with PowerHarness(policy=policy, settings=SETTINGS) as h:
        h.side_node("a", power="Off")
        h.side_node("b", power="Off")
        h.side_node("c", power="Off", spec={"capacity": {"vcpus": 4, "ram": "8Gi"}})  # none
        writes: list[dict[str, Any]] = []
        original = h.kube.patch_status

        async def counting(kind: Any, ns: str, name: str, patch: Any, *a: Any, **kw: Any) -> Any:
            if kind is POWER_POLICY:
                writes.append(dict(patch))
            return await original(kind, ns, name, patch, *a, **kw)

        h.kube.patch_status = counting  # type: ignore[method-assign]
        await h.start()
        await h.run_for(120, tick=5)
        writes.clear()
        await h.run_for(1800, tick=5)  # half an hour: figures every five minutes
        energy_writes = [w for w in writes if "energy" in w]
        assert 4 <= len(energy_writes) <= 7, len(energy_writes)
        assert all("classes" not in (w.get("inForce") or {}) for w in writes)
        assert all("energy" not in w for w in writes if "inForce" in w)
        sums = policy_energy(h)
        by = {c["name"]: c for c in sums["classes"]}
        assert list(by) == ["a10", "l4", "(all)"]
        assert by["l4"]["savedKwhToday"] == 0.0
        assert by["a10"]["savedKwhToday"] > 0 and by["(all)"]["savedKwhToday"] > 0
        assert by["a10"]["savedKwhToday"] == pytest.approx(2 * by["(all)"]["savedKwhToday"], 0.01)
        assert sum(c["savedKwhToday"] for c in by.values()) == pytest.approx(
            sums["savedKwhToday"], abs=0.002
        )
        assert by["a10"]["moneySavedToday"] == pytest.approx(
            by["a10"]["savedKwhToday"] * GPU.price_per_kwh, abs=0.01
        )
        assert {c["currency"] for c in by.values()} == {"EUR"}
