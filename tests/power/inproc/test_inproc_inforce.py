"""Why not yet, in status (issue 27), in process with a fake clock: PowerPolicy
`status.inForce` changes exactly at its due times (a weekday window's boundaries, a
transition under a budget of 1) and names the next change, with no write in between
(counted); WorkerNode `status.eligibility` says what holds each node, and its `heldBy` is
the first blocking reason of `explain` for every node of a mixed fleet
(`policy.eligibility`, `rules.inforce`, `power.inforce`). A node changing class or policy
without moving is rendered; writes are coalesced while many nodes move; a new leader does
not rewrite an equal inForce."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import pairwise
from typing import Any

from harness import POLICY, PowerHarness
from powerfakes import NS, FakeClock, Host

from nodewarden.api.kinds import POWER_POLICY, WORKER_NODE
from nodewarden.power.inforce import WRITE_GAP
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
        # the counts follow within the write gap (writes are coalesced)
        await h.run_until(
            lambda: (_in_force(h).get("nodes") or {}).get("off") == 2,
            within=WRITE_GAP.total_seconds() + 5,
            tick=5,
            what="counted",
        )
        shown = _in_force(h)
        assert shown["window"] == "none"
        assert shown["nextChangeAt"] == "2027-03-01T08:00:00Z"
        assert shown["nextChange"] == "window opens (a10)"
        assert shown["nodes"] == {"total": 2, "on": 0, "off": 2, "transitioning": 0, "unknown": 0}
        assert shown["disruptionBudget"] == {"max": 1, "inUse": 0, "left": 1}
        assert shown["thresholds"]["idleThreshold"] == "1m"
        assert shown["forecast"] == "Off"
        # consolidation by drain in Shadow (its default): its own budget, none in use
        assert shown.get("consolidationBudget") == {"max": 1, "inUse": 0, "left": 1}
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


def _shown_class(h: PowerHarness, policy: str, name: str) -> dict[str, Any] | None:
    shown = h.kube.status(POWER_POLICY, NS, policy).get("inForce") or {}
    return next((c for c in shown.get("classes") or () if c["name"] == name), None)


async def test_a_node_changing_class_without_moving_is_rendered() -> None:
    policy = {**POLICY, "nodeClasses": [A10]}
    async with PowerHarness(policy=policy) as h:
        writes = _count_policy_writes(h)
        h.side_node("g0", power="Off")
        h.side_node("g1", power="Off")
        await h.start()
        await h.run_until(
            lambda: (_shown_class(h, "default", "a10") or {}).get("nodes", {}).get("off") == 2,
            within=60,
            tick=5,
            what="both off, class a10",
        )
        await h.run_for(30, tick=5)
        settled = len(writes)
        old = h.kube.objects[(WORKER_NODE.kind, NS, "g1")]["spec"]["capacity"]
        h.edit_node("g1", capacity={**old, "gpuModel": "l4"})  # no class now; still Off
        await h.run_until(
            lambda: _shown_class(h, "default", "(all)") is not None,
            within=WRITE_GAP.total_seconds() + 10,
            tick=5,
            what="g1 counted in no class",
        )
        assert h.state("g1") == "Off"
        assert (_shown_class(h, "default", "a10") or {})["nodes"]["off"] == 1
        assert len(writes) == settled + 1, writes[settled:]


async def test_a_policy_ref_edit_renders_both_policies() -> None:
    async with PowerHarness() as h:
        h.set_policy("other", **POLICY)
        writes = _count_policy_writes(h)
        h.side_node("n0", power="Off", spec={"policyRef": {"name": "other"}})
        h.side_node("n1", power="Off")
        await h.start()

        def total(policy: str) -> int | None:
            shown = h.kube.status(POWER_POLICY, NS, policy).get("inForce") or {}
            return (shown.get("nodes") or {}).get("total")

        await h.run_until(lambda: total("other") == 1 and total("default") == 1, within=60, tick=5)
        await h.run_for(30, tick=5)
        settled = len(writes)
        spec = dict(h.kube.objects[(WORKER_NODE.kind, NS, "n0")]["spec"])
        del spec["policyRef"]  # n0 moves to the default policy
        h.put_node("n0", spec)
        await h.run_until(
            lambda: total("other") == 0 and total("default") == 2,
            within=WRITE_GAP.total_seconds() + 10,
            tick=5,
            what="n0 counted under default only",
        )
        assert h.state("n0") == "Off"
        assert len(writes) == settled + 2, writes[settled:]


async def test_writes_are_coalesced_while_many_nodes_move() -> None:
    """40 nodes shut down one after another (their min-on ends 2 s apart), a round every
    fake second: the policy's counts change almost every round, its inForce is written at
    most once per WRITE_GAP, and ends right."""
    n = 40
    policy = {**POLICY, "minOn": "5m", "disruptionBudget": {"maxConcurrentTransitions": n}}
    async with PowerHarness(policy=policy) as h:
        writes = _count_policy_writes(h)
        names = [f"m{i:02}" for i in range(n)]
        start = h.clock()
        for i, name in enumerate(names):
            h.side_node(name, booted_at=start - timedelta(minutes=5) + timedelta(seconds=2 * i))
        moves: list[datetime] = []
        states = {name: h.state(name) for name in names}
        original = h.round

        async def round_and_count() -> None:
            await original()
            for name in names:
                now = h.state(name)
                if now != states[name]:
                    states[name] = now
                    moves.append(h.clock())

        h.round = round_and_count  # type: ignore[method-assign]
        await h.start()
        await h.run_until(
            lambda: all(h.state(x) == "Off" for x in names), within=600, tick=1, what="all off"
        )
        await h.run_for(WRITE_GAP.total_seconds() + 2, tick=1)
        busy = len(set(moves))
        assert busy >= 15, busy  # the counts changed in that many rounds
        assert len(writes) < busy, (len(writes), busy)
        times = [at for at, _ in writes]
        gaps = [(b - a) for a, b in pairwise(times)]
        assert all(g >= WRITE_GAP for g in gaps), gaps
        span = (times[-1] - times[0]).total_seconds()
        assert len(writes) <= span / WRITE_GAP.total_seconds() + 1, len(writes)
        assert _in_force(h)["nodes"]["off"] == n


async def test_a_new_leader_does_not_rewrite_an_equal_in_force() -> None:
    async with PowerHarness() as a:
        a.side_node("s0", power="Off")
        a.side_node("s1")
        await a.start()
        await a.run_until(lambda: a.state("s1") == "Off", within=300, tick=5, what="off")
        await a.run_for(WRITE_GAP.total_seconds() + 10, tick=5)
        shown = _in_force(a)
        assert shown["nodes"]["off"] == 2
        kube, hosts, clock = a.kube, a.hosts, a.clock
        await a.ctrl.stop()
    async with PowerHarness(kube=kube, hosts=hosts, clock=clock) as b:
        writes = _count_policy_writes(b)
        await b.start()
        await b.run_for(60, tick=5)
        assert writes == [], writes
        assert _in_force(b) == shown
        # a real change is still written
        b.side_node("s2", power="Off")
        await b.run_until(
            lambda: _in_force(b)["nodes"]["total"] == 3,
            within=WRITE_GAP.total_seconds() + 10,
            tick=5,
        )
        assert len(writes) == 1, writes
