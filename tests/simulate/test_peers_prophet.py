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

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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
