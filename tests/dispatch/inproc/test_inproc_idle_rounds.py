"""The dispatcher at rest, in process with a fake clock (`dispatch/replan.py`): once
settled, ten simulated minutes of loop ticks with nothing changing make no plan and no
API write; a new container is planned at the tick that sees it; a lock-flap retry is
planned at its time and not before; worker probes that find nothing new (the real
`WorkerPool` pokes the dispatcher after every probe) plan nothing. Counted, not timed.

Each tick is `Dispatcher.step()`, the loop's round (`Rig.round`: the clock advances one
`tick_interval`, the nodes are probed, the power views published, the step run and what it
spawned waited for). Writes are counted at the in-memory API (`FakeApi`)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from fakes import ME, NS, FakeApi, FakeClock, FakeQueue, Rig, container, uuid_of
from test_inproc_idle_time import NODE, Prober, side_node, side_pool

from nodewarden.config import DispatchSettings
from nodewarden.dispatch.dispatcher import Dispatcher
from nodewarden.dispatch.replan import PlanMarks, PlanTrigger, handover_interval, plan_wanted
from nodewarden.fleet.policies import PolicyBook
from nodewarden.pool.times import iso
from nodewarden.scheduling.views import ContainerView, Plan
from nodewarden.ssh.facts import RunnerProcess

TEN_MINUTES = 600  # ticks of one simulated second (the default tick_interval)


class Handovers:
    """The dispatcher's `planned` calls (what the power controller is handed)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, containers: list[ContainerView], plan: Plan, now: datetime) -> None:
        self.calls += 1


async def tick(rig: Rig) -> int:
    """One loop tick; the plans it made."""
    before = rig.dispatcher.ctx.plans
    await rig.round()
    return rig.dispatcher.ctx.plans - before


async def settle(rig: Rig, limit: int = 20) -> None:
    """Ticks until one plans nothing (what the last change set off has landed)."""
    for _ in range(limit):
        if await tick(rig) == 0:
            return
    raise AssertionError(f"still planning after {limit} ticks")


async def test_ten_idle_minutes_plan_nothing_and_write_nothing() -> None:
    rig = Rig()
    handovers = Handovers()
    rig.dispatcher.planned = handovers
    rig.vm("vm-a")
    rig.vm("vm-b")
    await rig.start()
    rig.api.create(container("c1"))
    rig.api.create(container("c2", vcpus=2))
    await settle(rig)
    assert rig.runners() == {"c1": "vm-a", "c2": "vm-b"}
    rig.cloud.at_capacity = {"small"}  # no create may go: c3 waits
    rig.api.create(container("c3", vcpus=2))
    await settle(rig)
    assert rig.api.phase("c3") == "Queued"
    plans, writes = rig.dispatcher.ctx.plans, len(rig.api.status_writes)
    handed = handovers.calls
    versions = {n: b["metadata"]["resourceVersion"] for n, b in rig.api.objects.items()}

    made = [await tick(rig) for _ in range(TEN_MINUTES)]

    assert sum(made) == 0
    assert rig.dispatcher.ctx.plans == plans
    assert len(rig.api.status_writes) == writes
    assert {n: b["metadata"]["resourceVersion"] for n, b in rig.api.objects.items()} == versions
    # the unchanged plan goes to the power controller again every 30 s (a quarter of the
    # default telemetryMaxAge, 2 min), so its demand and work readings stay fresh
    assert handovers.calls - handed == TEN_MINUTES // 30

    rig.api.create(container("c4"))  # a change: planned at the tick that sees it
    assert await tick(rig) == 1
    assert rig.runners()["c4"] == "vm-a"
    # its start's own writes and the runner now listed are read by one more plan; then
    # nothing again
    assert [await tick(rig) for _ in range(60)] == [1] + [0] * 59


async def test_a_receiver_told_the_plan_is_unchanged_is_not_handed_it_again() -> None:
    """The power controller's wiring (`compose`): at an idle tick it is told the plan
    holds (O(1)) instead of being handed the whole plan again."""
    rig = Rig()
    handovers = Handovers()
    confirmed: list[datetime] = []
    rig.dispatcher.planned = handovers
    rig.dispatcher.unchanged = confirmed.append
    rig.vm("vm-a")
    await rig.start()
    rig.api.create(container("c1"))
    await settle(rig)
    handed, told = handovers.calls, len(confirmed)
    made = [await tick(rig) for _ in range(TEN_MINUTES)]
    assert sum(made) == 0
    assert handovers.calls == handed  # never handed again
    assert len(confirmed) - told == TEN_MINUTES  # told at every idle tick
    assert confirmed == sorted(confirmed)


async def test_a_lock_flap_retry_is_planned_at_its_time() -> None:
    rig = Rig(maxLockFlaps=1)
    rig.vm("vm-a")
    await rig.start()
    await settle(rig)
    locked_at = rig.clock.now
    flapped = {"phase": "Queued", "lockFlaps": 1, "lockedAt": iso(locked_at)}
    rig.api.create(container("c1", status=flapped))  # held back 30 s after its last lock
    await settle(rig)
    assert rig.runners() == {}
    retry_at = locked_at + timedelta(seconds=30)
    waited = 0
    while rig.clock.now + timedelta(seconds=1) < retry_at:
        waited += 1
        assert await tick(rig) == 0, f"planned {waited} s before the retry"
    assert rig.runners() == {}
    assert await tick(rig) == 1  # the retry's time: one plan, which starts it
    assert rig.runners() == {"c1": "vm-a"}


async def test_a_round_that_failed_is_planned_again() -> None:
    rig = Rig()
    rig.vm("vm-a")
    await rig.start()
    await settle(rig)
    rig.api.create(container("c1"))
    execute = rig.dispatcher.planner.execute

    async def fails(result: Plan, now: datetime) -> None:
        raise RuntimeError("the round fails")

    rig.dispatcher.planner.execute = fails  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        await rig.round()
    rig.dispatcher.planner.execute = execute  # type: ignore[method-assign]
    assert await tick(rig) == 1  # nothing changed since, but that plan never landed
    assert rig.runners() == {"c1": "vm-a"}


async def test_probes_that_find_nothing_new_plan_nothing() -> None:
    clock = FakeClock()
    prober = Prober(clock)
    api = FakeApi()
    dispatcher: Dispatcher | None = None

    def poke() -> None:
        assert dispatcher is not None
        dispatcher.poke()

    pool = side_pool(clock, prober, on_change=poke)
    dispatcher = Dispatcher(
        namespace=NS,
        dispatcher_id=ME,
        settings=DispatchSettings(),
        queue=FakeQueue(api),
        policies=PolicyBook(namespace=NS, default_name="default"),
        pool=pool,
        cloud=None,
        prober=None,
        clock=clock,
    )
    pool.observe_node(side_node())
    await pool.close()  # no probe loop: this test probes when it wants to
    worker = pool.workers[NODE]
    dispatcher.ctx.recovered = True
    prober.ready = True

    async def probed_tick(**change: Any) -> int:
        for key, value in change.items():
            setattr(prober, key, value)
        clock.advance(1)
        await pool.probe_once(worker)  # folds the report and pokes the dispatcher
        assert dispatcher is not None and dispatcher.ctx.poked
        before = dispatcher.ctx.plans
        await dispatcher.step()
        return dispatcher.ctx.plans - before

    assert await probed_tick() == 1  # the first plan
    assert await probed_tick() == 0
    assert [await probed_tick() for _ in range(120)] == [0] * 120
    runner = RunnerProcess(pid=7, uuid=uuid_of("gone"), dispatcher_id=ME)
    assert await probed_tick(runners=(runner,)) == 1  # a runner listed: capacity changed
    assert api.status_writes == []


def test_plan_wanted_plans_on_a_change_work_under_way_a_due_time_or_the_backstop() -> None:
    t0 = datetime(2026, 1, 1)
    marks = PlanMarks(1, 1, 1, 1, (), None, None, True)
    backstop = timedelta(seconds=900)

    def wanted(
        now: datetime,
        current: PlanMarks = marks,
        due: datetime | None = None,
        outstanding: bool = False,
        last: PlanMarks | None = marks,
    ) -> PlanTrigger | None:
        return plan_wanted(
            current,
            last,
            now,
            planned_at=t0,
            due_at=due,
            backstop=backstop,
            outstanding=outstanding,
        )

    at = t0 + timedelta(seconds=5)
    assert wanted(at) is None  # an idle tick
    assert wanted(at, last=None) is PlanTrigger.FIRST
    for moved in (
        PlanMarks(2, 1, 1, 1, (), None, None, True),  # a container observed
        PlanMarks(1, 2, 1, 1, (), None, None, True),  # a node's facts
        PlanMarks(1, 1, 2, 1, (), None, None, True),  # the power board
        PlanMarks(1, 1, 1, 2, (), None, None, True),  # a start or write ended
        PlanMarks(1, 1, 1, 1, ("blocked",), None, None, True),  # a create permission
        PlanMarks(1, 1, 1, 1, (), "policy", None, True),
        PlanMarks(1, 1, 1, 1, (), None, "settings", True),
        PlanMarks(1, 1, 1, 1, (), None, None, False),
    ):
        assert wanted(at, moved) is PlanTrigger.CHANGE
    assert wanted(at, outstanding=True) is PlanTrigger.OUTSTANDING
    assert wanted(at, due=at + timedelta(seconds=1)) is None
    assert wanted(at, due=at) is PlanTrigger.DUE
    assert wanted(t0 + backstop - timedelta(seconds=1)) is None
    assert wanted(t0 + backstop) is PlanTrigger.BACKSTOP


def test_an_unchanged_plan_is_handed_over_at_a_quarter_of_the_shortest_max_age() -> None:
    minutes = [timedelta(minutes=m) for m in (2, 10)]
    backstop = timedelta(seconds=900)
    assert handover_interval(minutes, backstop) == timedelta(seconds=30)
    assert handover_interval([timedelta(0), *minutes], backstop) == timedelta(seconds=30)
    assert handover_interval([timedelta(hours=2)], backstop) == backstop
    assert handover_interval([], backstop) == backstop
