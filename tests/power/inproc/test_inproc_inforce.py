"""Why not yet, in status (issue 27), in process with a fake clock: PowerPolicy
`status.inForce` changes exactly at its due times (a weekday window's boundaries, a
transition under a budget of 1) and names the next change, with no write in between
(counted); WorkerNode `status.eligibility` says what holds each node, and its `heldBy` is
the first blocking reason of `explain` for every node of a mixed fleet
(`policy.eligibility`, `rules.inforce`, `power.inforce`)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from harness import POLICY, PowerHarness
from powerfakes import NS, FakeClock, Host

from nodewarden.api.kinds import POWER_POLICY
from nodewarden.power.runtime import ControllerSettings, EnergyBook

A10 = {"name": "a10", "nodeType": "SideNode", "gpuModel": "a10", "bootTime": "2m"}
WEEKDAYS = {
    "name": "office",
    "nodeClass": "a10",
    "minWarm": 1,
    "days": ["Mon", "Tue", "Wed", "Thu", "Fri"],
    "start": "08:00",
    "end": "20:00",
    "timeZone": "UTC",
}
WINDOW_POLICY: dict[str, Any] = {
    **POLICY,
    "disruptionBudget": {"maxConcurrentTransitions": 1},
    "nodeClasses": [A10],
    "warmCapacity": {"windows": [WEEKDAYS]},
}


def _utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def _count_policy_writes(h: PowerHarness) -> list[tuple[datetime, dict[str, Any]]]:
    """Every `status.inForce` write, with the fake time it was sent at."""
    writes: list[tuple[datetime, dict[str, Any]]] = []
    original = h.kube.patch_status

    async def patch_status(kind: Any, namespace: str, name: str, status: Any, **kw: Any) -> Any:
        if kind is POWER_POLICY and "inForce" in status:
            writes.append((h.clock(), dict(status["inForce"])))
        return await original(kind, namespace, name, status, **kw)

    h.kube.patch_status = patch_status  # type: ignore[method-assign]
    return writes


def _in_force(h: PowerHarness) -> dict[str, Any]:
    return dict(h.kube.status(POWER_POLICY, NS, "default").get("inForce") or {})


async def test_the_policy_in_force_changes_exactly_at_its_due_times() -> None:
    clock = FakeClock(_utc(2027, 3, 1, 7, 0))  # Monday 07:00 UTC: the window opens at 08:00
    settings = ControllerSettings(energy=EnergyBook(status_interval=86400.0))
    async with PowerHarness(policy=WINDOW_POLICY, clock=clock, settings=settings) as h:
        writes = _count_policy_writes(h)
        names = ["g0", "g1"]
        for name in names:
            h.side_node(name, power="Off")
        await h.start()
        await h.run_until(
            lambda: all(h.state(n) == "Off" for n in names), within=120, tick=5, what="Off"
        )
        shown = _in_force(h)
        assert shown["window"] == "none"
        assert shown["nextChangeAt"] == "2027-03-01T08:00:00Z"
        assert shown["nextChange"] == "window opens (a10)"
        assert shown["nodes"] == {"total": 2, "on": 0, "off": 2, "transitioning": 0, "unknown": 0}
        assert shown["disruptionBudget"] == {"max": 1, "inUse": 0, "left": 1}
        assert shown["thresholds"]["idleThreshold"] == "1m"
        assert shown["forecast"] == "Off" and shown.get("consolidationBudget") is None
        # between due times: nothing is written (rounds every 10 fake seconds till 07:59:50)
        settled, every = len(writes), h.kube.writes
        await h.run_for((_utc(2027, 3, 1, 7, 59, 50) - clock()).total_seconds(), tick=10)
        assert len(writes) == settled, writes[settled:]
        assert h.kube.writes == every  # nor any other write (energy figures: daily here)
        off = h.status("g0")["eligibility"]
        assert off["direction"] == "Wake" and off["heldBy"] == "NO_DEMAND", off
        # 08:00: the window opens -- written at its due time, naming the next change
        await h.run_until(lambda: len(writes) > settled, within=60, tick=5, what="opened")
        at, opened = writes[settled]
        assert at == _utc(2027, 3, 1, 8, 0), at
        assert opened["window"] == "office"
        assert opened["nextChangeAt"] == "2027-03-01T20:00:00Z"
        assert opened["nextChange"] == "window closes (a10)"
        (a10,) = opened["classes"]
        assert a10["warmWindow"] == "office" and a10["minWarm"] == 1
        # the window wakes one node: the transition uses the budget of 1, then frees it
        await h.run_until(
            lambda: _in_force(h)["nodes"]["on"] == 1, within=300, tick=5, what="one on"
        )
        seen = [w for _, w in writes[settled:]]
        assert any(
            w["disruptionBudget"] == {"max": 1, "inUse": 1, "left": 0}
            and w["nodes"]["transitioning"] == 1
            for w in seen
        ), seen
        assert _in_force(h)["disruptionBudget"]["left"] == 1
        (woken,) = [n for n in names if h.state(n) == "Idle"]
        (asleep,) = set(names) - {woken}
        # the woken node idles under the window: status says what holds it
        await h.run_for(120, tick=10)
        held = h.status(woken)["eligibility"]
        assert held["direction"] == "Shutdown" and held["heldBy"] == "WARM_WINDOW", held
        assert held["idleThreshold"] == "1m" and held["eligibleAt"] is not None
        explained = h.ctrl.explain(woken)
        assert explained is not None and _set(explained["eligibility"]) == held
        # the day goes by: no write until 20:00
        moved = len(writes)
        clock.now = _utc(2027, 3, 1, 19, 50)
        await h.run_for(60, tick=10)
        every = h.kube.writes
        await h.run_for(530, tick=10)  # to 19:59:50
        assert len(writes) == moved, writes[moved:]
        assert h.kube.writes == every
        await h.run_until(lambda: len(writes) > moved, within=60, tick=5, what="closed")
        at, closed = writes[moved]
        assert at == _utc(2027, 3, 1, 20, 0), at
        assert closed["window"] == "none"
        assert closed["nextChangeAt"] == "2027-03-02T08:00:00Z"  # Tuesday
        assert closed["nextChange"] == "window opens (a10)"
        # nothing holds the woken node now: it goes the usual way
        await h.run_until(lambda: h.state(woken) == "Off", within=600, tick=5, what="off")
        assert h.state(asleep) == "Off"
        last = _in_force(h)
        assert last["nodes"]["off"] == 2 and last["disruptionBudget"]["left"] == 1


def _set(fields: dict[str, Any]) -> dict[str, Any]:
    """The fields a merge patch leaves on the server (a null deletes)."""
    return {k: v for k, v in fields.items() if v is not None}


def _host(h: PowerHarness, name: str) -> Host:
    return h.hosts[name]


async def test_held_by_in_status_is_the_first_blocking_reason_of_explain() -> None:
    """Parity: for every node of a mixed fleet, at several moments."""
    policy = {**POLICY, "minOn": "10m", "cooldown": "2m", "minOff": "5m"}
    async with PowerHarness(policy=policy) as h:
        h.side_node("idle", booted_at=h.clock() - timedelta(minutes=2))  # min-on holds it
        h.side_node("old")  # up an hour: only the idle threshold holds it
        h.side_node("busy", runners=1)
        h.side_node("inhibited", inhibitors=("backup",))
        h.side_node("off", power="Off")
        h.side_node("hold", spec={"idleBehavior": "hold"})
        h.side_node("pinned", spec={"power": "On"})
        names = ["idle", "old", "busy", "inhibited", "off", "hold", "pinned"]
        await h.start()
        seen: set[str] = set()
        for _ in range(6):
            await h.run_for(30, tick=5)
            for name in names:
                status = h.status(name).get("eligibility")
                assert status is not None, name
                doc = h.ctrl.explain(name)
                assert doc is not None and doc["evaluation"] is not None, name
                evaluation = doc["evaluation"]
                acts = evaluation["decision"] in ("SHUTDOWN", "START")
                first = None if acts or not evaluation["reasons"] else evaluation["reasons"][0]
                assert status.get("heldBy") == first, (name, status, evaluation)
                assert _set(doc["eligibility"]) == status, (name, doc["eligibility"], status)
                if first is not None:
                    seen.add(first)
        # the fleet shows the holds the issue names
        assert {"MIN_ON_NOT_MET", "INHIBITOR_ACTIVE", "NO_DEMAND", "IDLE_BEHAVIOR_HOLD"} <= seen, (
            seen
        )
        min_on = h.status("idle")["eligibility"]
        assert min_on["heldBy"] == "MIN_ON_NOT_MET"
        boot = _host(h, "idle").booted_at
        assert min_on["heldUntil"] is not None
        assert min_on["heldUntil"].startswith(
            (boot + timedelta(minutes=10)).strftime("%Y-%m-%dT%H:%M")
        )
