"""The prophet (hypothesis): never dearer than a policy using its placement at equal or
lower wait, never below the oracle bound.

Random small traces (1-4 containers within 20 minutes) on random small fleets (one or two
VM types billed per second or per hour, maybe a CPU side node on or off at the start;
`peers.sweep.random_small_case`): for every placement -- nodewarden's scheduler (the
default policy, a random idle threshold and both baselines), Arvados', Karpenter's,
cluster-autoscaler's, SLURM's (each peer at a random value of its knob) -- the prophet
using it costs no more than each policy using it at equal or lower wait (p95 and max no
longer than the prophet's), and no less than the oracle lower bound. 50 examples here;
benchmarks/bench_simulate.py runs 200.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from peer_builders import SMALL, fleet, trace

from nodewarden.simulate.peers import run_peer_and_prophet
from nodewarden.simulate.peers.arvados import DispatchCloud
from nodewarden.simulate.peers.sweep import prophet_check, random_small_case

SETTINGS = settings(
    max_examples=50,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)


@SETTINGS
@given(st.integers(min_value=0, max_value=2**32))
def test_prophet_bounds(case_seed: int) -> None:
    trace, fleet, knobs = random_small_case(random.Random(case_seed))
    check = prophet_check(trace, fleet, knobs, seed=1)
    assert not check.violations, check.violations


def test_prophet_of_a_run_by_hand() -> None:
    """The dispatch-cloud run of test_peers_rows (A 600 s and B 300 s at 0, each on its own
    small VM; a tail container at 2000): its prophet keeps the placement, boots each VM
    ahead with the shortest boot (60 s: A and B still start at 62, no boot could begin
    before the trace), starts the tail at its arrival (2002), and switches each VM off
    after the shortest shutdown (20 s), without the idle timeout; its run ends with the
    tail (2062), which is billed to then."""
    run, prophet = run_peer_and_prophet(
        trace("0,600,1,1Gi", "0,300,1,1Gi", "2000,60,1,1Gi"), fleet(), DispatchCloud(60), seed=1
    )
    a = 62 + 600 + 20
    b = 62 + 300 + 20
    tail = (2002 + 60) - (2000 - 60)
    assert prophet.cost == pytest.approx(SMALL * (a + b + tail), abs=1e-9)
    assert prophet.cost < run.cost
    assert [prophet.figures["waitSeconds"][k] for k in ("p50", "max")] == [62, 62]
    assert prophet.figures["powerCycles"] == 3 and prophet.placement == "arvados"
