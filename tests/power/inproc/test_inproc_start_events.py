"""Events at start-up, in process, at fleet size: 200 nodes whose stored status already
says what the restarted operator decides create no Event at all; a restart after a real
change (work ended, a machine switched off while the operator was down) creates one per
changed node. Counted at the in-memory API (every Event asked for, before aggregation)."""

from __future__ import annotations

from collections import Counter

from harness import PowerHarness

N = 200


def names() -> list[str]:
    return [f"n{i:03d}" for i in range(N)]


async def settled_fleet() -> PowerHarness:
    """200 busy side nodes, run until each has its settled decision stored, then the
    operator stops (its Events and writes all delivered)."""
    a = PowerHarness()
    for name in names():
        a.side_node(name, runners=1)
    await a.start()
    await a.run_until(
        lambda: all(a.decision(n) == "NONE" and a.state(n) == "Active" for n in names()),
        within=60,
        tick=2.0,
        what="every node settled",
    )
    await a.run_for(10, tick=2.0)
    await a.ctrl.stop()
    await a.settle()
    return a


async def restart(a: PowerHarness) -> tuple[PowerHarness, Counter[str]]:
    """A new operator on the same API, run until every node is decided again; the Events
    it asked for, per node."""
    before = len(a.kube.events)
    b = PowerHarness(kube=a.kube, hosts=a.hosts, clock=a.clock)
    await b.start()
    await b.run_for(30, tick=2.0)
    return b, Counter(str(e["name"]) for e in a.kube.events[before:])


async def test_a_restart_of_200_unchanged_nodes_creates_no_event() -> None:
    a = await settled_fleet()
    stored = {n: (a.decision(n), a.reasons(n), a.state(n)) for n in names()}
    b, events = await restart(a)
    try:
        now = {n: (b.decision(n), b.reasons(n), b.state(n)) for n in names()}
        changed = [n for n in names() if now[n] != stored[n]]
        assert not changed, changed[:5]  # the restart decided what was stored
        assert sum(events.values()) <= len(changed), events.most_common(5)
    finally:
        await b.ctrl.stop()
        await b.settle()


async def test_a_restart_after_a_real_change_creates_one_event_per_changed_node() -> None:
    a = await settled_fleet()
    idle = names()[:10]
    off = names()[10:20]
    for name in idle:
        a.hosts[name].runners = 0  # its job ended while the operator was down
    for name in off:
        a.hosts[name].power = "Off"  # someone at the BMC
    b, events = await restart(a)
    try:
        assert all(b.state(n) == "Idle" for n in idle), b.dump()
        assert all(b.state(n) == "Off" for n in off), b.dump()
        assert events == Counter({n: 1 for n in idle + off}), events
    finally:
        await b.ctrl.stop()
        await b.settle()
