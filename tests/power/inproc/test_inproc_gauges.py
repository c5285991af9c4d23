"""The power path's gauges, in process: a pass over every node (`gauges.publish`) is made
at a /metrics scrape when a round stepped a node since the last one -- never by the
rounds themselves (issue 23: 37 ms a round at 10,000 nodes, 4 x the event round) -- and
the gauges a scrape shows are those of every node then. Counted, not timed."""

from __future__ import annotations

import pytest
from harness import PowerHarness

from nodewarden.metrics import REGISTRY
from nodewarden.power import gauges
from nodewarden.scraped import scraping


def nodes_in(state: str) -> float:
    value = REGISTRY.get_sample_value("nodewarden_nodes", {"state": state, "node_type": "SideNode"})
    return value or 0.0


async def test_rounds_make_no_gauge_pass_and_a_scrape_makes_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    passes: list[int] = []
    real = gauges.publish

    def counted(nodes, now=None):  # type: ignore[no-untyped-def]
        passes.append(1)
        real(nodes, now)

    monkeypatch.setattr(gauges, "publish", counted)
    a = PowerHarness()
    for i in range(20):
        a.side_node(f"n{i:02d}", runners=1)
    await a.start()
    try:
        await a.run_until(
            lambda: all(a.state(f"n{i:02d}") == "Active" for i in range(20)),
            within=60,
            tick=2.0,
            what="every node Active",
        )
        stepped = a.ctrl.steps
        assert stepped > 0 and passes == [], "a round passed over every node"
        scraping()
        assert len(passes) == 1
        assert nodes_in("Active") == 20
        scraping()  # nothing stepped since: no second pass
        assert len(passes) == 1
        a.hosts["n00"].runners = 0  # its work ends: n00 is stepped again
        await a.run_until(lambda: a.state("n00") == "Idle", within=60, tick=2.0, what="n00 Idle")
        assert len(passes) == 1
        scraping()
        assert len(passes) == 2
        assert (nodes_in("Active"), nodes_in("Idle")) == (19, 1)
        a.hosts["n01"].runners = 0
        await a.run_until(lambda: a.state("n01") == "Idle", within=60, tick=2.0, what="n01 Idle")
    finally:
        await a.ctrl.stop()
        await a.settle()
    scraping()  # a stopped controller's fleet is no longer published
    assert len(passes) == 2
