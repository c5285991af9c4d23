"""Warm capacity in the live power controller, in process with a fake clock: warm windows
by the Berlin clock across a daylight-saving change, minimum warm nodes per node class,
and the forecast learning from arrivals -> Shadow -> On, kept across a restart
(`rules.warm`, `rules.forecast`, `power.warming`)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from harness import POLICY, PowerHarness
from powerfakes import NS, FakeClock

from nodewarden.api.kinds import POWER_POLICY
from nodewarden.metrics import REGISTRY
from nodewarden.power.runtime import ControllerSettings, EnergyBook

A10 = {"name": "a10", "nodeType": "SideNode", "gpuModel": "a10", "bootTime": "2m"}
OFFICE = {
    "name": "office",
    "nodeClass": "a10",
    "minWarm": 2,
    "start": "08:00",
    "end": "20:00",
    "timeZone": "Europe/Berlin",
}
WINDOW_POLICY: dict[str, Any] = {
    **POLICY,
    "nodeClasses": [A10],
    "warmCapacity": {"windows": [OFFICE]},
}


def _utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def _wakes(h: PowerHarness) -> list[Any]:
    return [r for r in h.control.requests if r.action == "On"]


def _wake_record(h: PowerHarness, node: str) -> dict[str, Any]:
    (intent,) = [i for i in h.intents(node) if i["spec"]["action"] == "Wake"][-1:]
    return dict(intent["status"]["requestRecord"])


def _evidence(record: dict[str, Any], gate: str) -> dict[str, Any]:
    for g in record["gates"]:
        if g["gate"] == gate:
            return {e["name"]: e["value"] for e in g["evidence"]}
    raise AssertionError(f"no {gate} gate in {record['gates']}")


async def _off_fleet(h: PowerHarness, names: list[str]) -> None:
    for name in names:
        h.side_node(name, power="Off")
    await h.start()
    await h.run_until(
        lambda: all(h.state(n) == "Off" for n in names), within=120, tick=5, what="all Off"
    )


async def test_a_warm_window_wakes_and_holds_by_the_berlin_clock_across_the_spring_change() -> None:
    clock = FakeClock(_utc(2027, 3, 26, 6, 45))  # Friday 07:45 CET (UTC+1)
    async with PowerHarness(policy=WINDOW_POLICY, clock=clock) as h:
        names = ["g0", "g1", "g2"]
        await _off_fleet(h, names)
        assert _wakes(h) == []
        await h.run_until(lambda: len(_wakes(h)) >= 2, within=1800, tick=5, what="two wakes")
        first, second = _wakes(h)
        # 08:00 in Berlin is 07:00 UTC that Friday: woken at the window's due time
        assert _utc(2027, 3, 26, 7, 0) <= first.at < _utc(2027, 3, 26, 7, 0, 30)
        assert second.at < _utc(2027, 3, 26, 7, 1)
        woken = sorted({first.node, second.node})
        record = _wake_record(h, woken[0])
        assert record["decision"] == "START"
        assert record["reasons"] == ["GATES_PASSED", "WARM_WINDOW"]
        demand = _evidence(record, "demand")
        assert demand["queued"] == 0 and "window office" in demand["warmTarget"]
        assert demand["nodeClass"] == "a10"
        # the window keeps the two on while they idle (idleThreshold 60 s); the third
        # stays off: two are wanted, not three
        await h.run_until(
            lambda: all(h.state(n) == "Idle" for n in woken), within=300, tick=5, what="up"
        )
        await h.run_for(900, tick=15)
        for n in woken:
            assert h.state(n) == "Idle"
            assert h.decision(n) == "NONE" and "WARM_WINDOW" in h.reasons(n), h.reasons(n)
        (left,) = set(names) - set(woken)
        assert h.state(left) == "Off" and len(_wakes(h)) == 2
        # 20:00 CET: the window closes at 19:00 UTC and the idle nodes go the usual way
        clock.now = _utc(2027, 3, 26, 18, 55)
        await h.run_for(240, tick=30)
        assert all(h.state(n) == "Idle" for n in woken)
        await h.run_until(
            lambda: all(h.state(n) == "Off" for n in names), within=900, tick=5, what="off"
        )
        # Monday after the change to CEST (UTC+2): 08:00 in Berlin is 06:00 UTC
        clock.now = _utc(2027, 3, 29, 5, 50)
        await h.run_until(lambda: len(_wakes(h)) >= 4, within=1800, tick=5, what="monday")
        monday = _wakes(h)[2:]
        assert all(_utc(2027, 3, 29, 6, 0) <= r.at < _utc(2027, 3, 29, 6, 1) for r in monday)


async def test_each_node_class_keeps_its_own_minimum_and_a_window_holds_a_cloud_vm() -> None:
    policy = {
        **POLICY,
        "nodeClasses": [
            A10,
            {"name": "cpu", "nodeType": "SideNode", "namePrefix": "cpu-"},
            {"name": "small", "nodeType": "CloudVM", "instanceType": "small"},
        ],
        "warmCapacity": {
            "windows": [
                {**OFFICE, "minWarm": 1, "days": ["Mon", "Tue"]},
                {**OFFICE, "name": "cpu-day", "nodeClass": "cpu", "minWarm": 2, "days": ["Mon"]},
                {**OFFICE, "name": "vm-day", "nodeClass": "small", "minWarm": 1, "days": ["Mon"]},
            ]
        },
    }
    clock = FakeClock(_utc(2027, 3, 1, 8, 0))  # Monday 09:00 in Berlin: every window open
    async with PowerHarness(policy=policy, clock=clock) as h:
        gpus, cpus = ["g0", "g1"], ["cpu-0", "cpu-1", "cpu-2"]
        for name in gpus + cpus:
            h.side_node(name, power="Off", spec={"capacity": _capacity(name)})
        h.cloud_vm("vm-0")
        h.cloud_vm("vm-1")
        await h.start()
        await h.run_until(lambda: len(_wakes(h)) >= 3, within=600, tick=5, what="wakes")
        await h.run_for(600, tick=10)
        on = {r.node for r in _wakes(h)}
        assert len(on & set(gpus)) == 1 and len(on & set(cpus)) == 2, on
        # one idle VM is kept, the other one is destroyed the usual way
        destroyed = [r.node for r in h.control.requests if r.action == "GracefulShutdown"]
        assert len([n for n in destroyed if n.startswith("vm-")]) == 1, destroyed
        kept = ({"vm-0", "vm-1"} - set(destroyed)).pop()
        assert "WARM_WINDOW" in h.reasons(kept), h.reasons(kept)
        target = _gauge(
            "nodewarden_warm_target_nodes", policy="default", node_class="cpu", mode="On"
        )
        assert target == 2
        # the lever switched Off: nothing holds the idle nodes any more
        h.set_policy(
            "default", **{**policy, "warmCapacity": {**policy["warmCapacity"], "mode": "Off"}}
        )
        await h.run_until(
            lambda: all(h.state(n) == "Off" for n in [*on, kept] if n in h.hosts),
            within=600,
            tick=5,
            what="released",
        )
        assert (
            _gauge("nodewarden_warm_target_nodes", policy="default", node_class="cpu", mode="On")
            == 0
        )


def _capacity(name: str) -> dict[str, Any]:
    if name.startswith("cpu-"):
        return {"vcpus": 64, "ram": "256Gi"}
    return {"vcpus": 16, "ram": "64Gi", "gpus": 1, "gpuModel": "a10"}


def _gauge(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


FORECAST_POLICY: dict[str, Any] = {
    **POLICY,
    "nodeClasses": [{**A10, "bootTime": "5m"}],
    "forecastWake": {"mode": "Shadow", "minDays": 2, "confidence": 0.8, "maxWarmNodes": 3},
}


async def _learn_a_day(h: PowerHarness, day: datetime, per_hour: int = 12) -> None:
    """One day of arrivals: `per_hour` GPU containers between 10:00 and 11:00 UTC, none
    at other hours (each queued and gone at once: no queued demand is left)."""
    h.clock.now = day
    for hour in range(24):
        if hour == 10:
            for i in range(per_hour):
                name = f"{day:%m%d}-{i}"
                h.queue(name, gpus=1)
                h.finish(name)
                await h.round()
                h.clock.advance(3600 / per_hour)
        else:
            await h.round()
            h.clock.advance(3600)


def _forecast_status(h: PowerHarness) -> dict[str, Any]:
    return dict(h.kube.status(POWER_POLICY, NS, "default"))


async def test_the_forecast_learns_then_shadows_then_wakes_and_survives_a_restart() -> None:
    monday = _utc(2027, 1, 4)
    clock = FakeClock(monday)
    async with PowerHarness(policy=FORECAST_POLICY, clock=clock) as h:
        names = ["g0", "g1", "g2", "g3"]
        await _off_fleet(h, names)
        await _learn_a_day(h, monday)
        forecast = _forecast_status(h)["forecast"]
        assert forecast["state"] == "Learning", forecast
        assert "of 2 days observed: no forecast yet" in forecast["message"]
        assert sum(forecast["classes"][0]["weekday"]["arrivals"]) == 12
        await _learn_a_day(h, monday + timedelta(days=1))
        assert _wakes(h) == []  # learning and Shadow never wake anything
        # Wednesday 09:55: the 10 o'clock arrivals are a boot time away
        clock.now = _utc(2027, 1, 6, 9, 50)
        await h.run_for(360, tick=10)
        status = _forecast_status(h)
        assert status["forecast"]["state"] == "Forecasting"
        (a10,) = status["warmCapacity"]["classes"]
        # 12/h over a 5-minute boot is Poisson(1): its 0.8 quantile is 2 nodes
        assert a10["target"] == 0 and a10["shadowTarget"] == 2, a10
        assert "12.0 arrivals/h" in a10["shadowWhy"]
        assert _wakes(h) == []
        # Shadow records what it would have done: the Off nodes' gate tables say so
        explained = [str(h.ctrl.explain(n)) for n in names]
        assert any("shadowWarmWake" in e and "would wake it" in e for e in explained)
        # On: the same forecast wakes two nodes, with the forecast in their records
        h.set_policy("default", **{**FORECAST_POLICY, "forecastWake": {
            **FORECAST_POLICY["forecastWake"], "mode": "On"}})  # fmt: skip
        await h.run_until(lambda: len(_wakes(h)) >= 2, within=120, tick=5, what="wakes")
        await h.run_for(60, tick=5)
        assert len(_wakes(h)) == 2
        record = _wake_record(h, _wakes(h)[0].node)
        assert record["reasons"] == ["GATES_PASSED", "FORECAST_DEMAND"]
        assert "forecast: 12.0 arrivals/h" in _evidence(record, "demand")["warmTarget"]
        days = _forecast_status(h)["forecast"]["daysObserved"]
        kube, hosts = h.kube, h.hosts
        await h.ctrl.stop()
    # a restart (another replica) on the stored objects: the histogram comes back from the
    # PowerPolicy status, so it forecasts at once, without two more days of learning
    async with PowerHarness(kube=kube, hosts=hosts, clock=clock) as again:
        clock.now = _utc(2027, 1, 7, 9, 40)
        await again.start()
        await again.run_for(1200, tick=10)
        status = _forecast_status(again)
        assert status["forecast"]["daysObserved"] >= days
        assert status["forecast"]["state"] == "Forecasting"
        (a10,) = status["warmCapacity"]["classes"]
        assert a10["target"] == 2, a10


async def test_warm_levers_at_rest_cost_nothing_between_their_due_times() -> None:
    """Counted, not timed: with a window open nothing is stepped or written for ten fake
    minutes; at its close the class's nodes alone are stepped (a due time, not a scan)."""
    policy = {**WINDOW_POLICY, "idleThreshold": "2h"}
    clock = FakeClock(_utc(2027, 3, 26, 18, 30))  # Friday 19:30 in Berlin: the window is open
    # energy figures hourly (issue 26): the ten minutes at rest hold none of them
    settings = ControllerSettings(energy=EnergyBook(status_interval=3600.0))
    async with PowerHarness(policy=policy, clock=clock, probe_interval=5.0, settings=settings) as h:
        h.plan_changes = True
        gpus = ["g0", "g1", "g2", "g3"]
        others = [f"cpu-{i}" for i in range(8)]
        for name in gpus:
            h.side_node(name, power="Off")
        for name in others:  # no class: no GPU model
            h.side_node(name, spec={"capacity": {"vcpus": 8, "ram": "32Gi"}})
        await h.start()
        await h.run_until(
            lambda: sum(h.state(n) == "Idle" for n in gpus) == 2, within=600, tick=5, what="2 on"
        )
        await h.run_for(60, tick=5)
        steps, writes = h.ctrl.steps, h.kube.writes
        await h.run_for(600, tick=10)
        assert h.ctrl.steps - steps == 0, "a node was evaluated with nothing due"
        assert h.kube.writes - writes == 0, "an API write with nothing changed"
        left = (_utc(2027, 3, 26, 18, 59, 50) - clock.now).total_seconds()
        await h.run_for(left, tick=10)
        steps = h.ctrl.steps
        await h.run_for(20, tick=5)  # 19:00 UTC (20:00 in Berlin): the window closes
        stepped = h.ctrl.steps - steps
        assert 1 <= stepped <= 2 * len(gpus), stepped  # the class's nodes, not the fleet
        (a10,) = h.kube.status(POWER_POLICY, NS, "default")["warmCapacity"]["classes"] or [None]
        assert a10 is None or a10["target"] == 0
