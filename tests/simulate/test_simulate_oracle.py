"""The oracle is a lower bound (hypothesis): below a brute-force optimum and every policy.

Tiny random traces (2-3 containers) on tiny random fleets (one or two VM types, maybe a
side node, fixed delays, per-second or per-hour billing): the bound never exceeds the
exact optimum of the small cost model, nor the cost of any simulated policy (random
PowerPolicy knobs and both baselines) that ran every container. The gap to the optimum
is measured by benchmarks/bench_simulate.py (--oracle-gap) and stated in the docs.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodewarden.api.powerpolicy import PowerPolicySpec
from nodewarden.simulate.engine import Simulation
from nodewarden.simulate.fleet import Fleet, load_fleet
from nodewarden.simulate.oracle import brute_force_optimum, oracle_bound
from nodewarden.simulate.policies import baselines, policy_from_spec
from nodewarden.simulate.results import SimOptions
from nodewarden.simulate.trace import Trace, parse_trace

SETTINGS = settings(
    max_examples=100,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)


@st.composite
def tiny_fleets(draw: st.DrawFn) -> Fleet:
    types = [
        {"name": "a", "vcpus": 2, "ram": "4Gi", "price": draw(st.sampled_from([0.1, 0.5, 1.0]))},
    ]
    if draw(st.booleans()):
        types.append(
            {
                "name": "b",
                "vcpus": 4,
                "ram": "8Gi",
                "price": draw(st.sampled_from([0.15, 0.8, 2.0])),
            }
        )
    side: list[dict[str, Any]] = []
    if draw(st.booleans()):
        side.append(
            {
                "name": "side",
                "capacity": {"vcpus": 4, "ram": "8Gi"},
                "costPerHour": draw(st.sampled_from([0.0, 0.05, 0.3])),
                "initialPower": draw(st.sampled_from(["On", "Off"])),
                "boot": draw(st.sampled_from(["60s", "120s"])),
                "shutdown": "30s",
                "bmc": {"latency": "1s", "pollInterval": "10s"},
            }
        )
    hourly = draw(st.booleans())
    return load_fleet(
        {
            "cloud": {
                "instanceTypes": types,
                "billing": {
                    "period": "1h" if hourly else "0s",
                    "minimum": "0s" if hourly else "60s",
                },
                "createLatency": "0s",
                "boot": draw(st.sampled_from(["60s", "120s"])),
                "shutdown": "30s",
            },
            "sideNodes": side,
            "probe": {"interval": "10s"},
        }
    )


@st.composite
def tiny_traces(draw: st.DrawFn, size: int = 3) -> Trace:
    n = draw(st.integers(min_value=1, max_value=size))
    rows = ["arrival,runtime,vcpus,ram"]
    for _ in range(n):
        arrival = draw(st.integers(min_value=0, max_value=8)) * 60
        runtime = draw(st.integers(min_value=1, max_value=6)) * 60
        vcpus = draw(st.sampled_from([1, 2, 3]))
        ram = draw(st.sampled_from(["1Gi", "2Gi", "5Gi"]))
        rows.append(f"{arrival},{runtime},{vcpus},{ram}")
    return parse_trace("\n".join(rows) + "\n", "csv", name="tiny")


@SETTINGS
@given(fleet=tiny_fleets(), trace=tiny_traces())
def test_oracle_never_exceeds_the_brute_force_optimum(fleet: Fleet, trace: Trace) -> None:
    bound = oracle_bound(trace, fleet)
    if bound.unplaceable:
        return
    optimum = brute_force_optimum(trace, fleet, grid_seconds=60, slack_seconds=360)
    assert bound.cost <= optimum + 1e-9, (bound, optimum)


policy_knobs = st.fixed_dictionaries(
    {
        "idleThreshold": st.sampled_from(["0s", "30s", "2m", "20m"]),
        "minOn": st.sampled_from(["0s", "5m", "30m"]),
        "minOff": st.sampled_from(["0s", "5m"]),
        "cooldown": st.sampled_from(["0s", "2m"]),
        "billing": st.sampled_from(
            [
                {"period": "0s", "windowStart": "0s", "windowEnd": "1s"},
                {"period": "1h", "windowStart": "50m", "windowEnd": "1h"},
            ]
        ),
        "minWarmNodes": st.sampled_from([0, 1]),
        "disruptionBudget": st.sampled_from(
            [{"maxConcurrentTransitions": 1}, {"maxConcurrentTransitions": 5}]
        ),
    }
)


@SETTINGS
@given(fleet=tiny_fleets(), trace=tiny_traces(size=6), knobs=policy_knobs, seed=st.integers(0, 3))
def test_oracle_never_exceeds_any_policys_cost(
    fleet: Fleet, trace: Trace, knobs: dict[str, Any], seed: int
) -> None:
    bound = oracle_bound(trace, fleet)
    policies = [policy_from_spec(PowerPolicySpec.model_validate(knobs), "random"), *baselines()]
    for policy in policies:
        run = Simulation(trace, fleet, policy, seed, SimOptions(max_overrun=6 * 3600 * 10**6)).run()
        if run.figures["notRun"] or run.figures["unfinished"]:
            continue  # a policy that left work undone may cost less than any schedule of it
        assert run.figures["cost"] + 0.005 >= bound.cost, (policy.name, run.figures, bound)


def test_bound_is_tight_when_nothing_but_work_and_one_boot_is_paid() -> None:
    """One container filling a per-second VM exactly: bound = boot + run = optimum."""
    fleet = load_fleet(
        {
            "cloud": {
                "instanceTypes": [{"name": "a", "vcpus": 2, "ram": "8Gi", "price": 3.6}],
                "instanceTypePolicy": {"ram_overhead": 0, "ram_discount_percent": 0},
                "billing": {"period": "0s", "minimum": "0s"},
                "createLatency": "0s",
                "boot": "60s",
                "shutdown": "30s",
            }
        }
    )
    trace = parse_trace("arrival,runtime,vcpus,ram\n0,600,2,8Gi\n", "csv")
    bound = oracle_bound(trace, fleet)
    optimum = brute_force_optimum(trace, fleet, grid_seconds=60, slack_seconds=120)
    assert abs(bound.cost - 0.66) < 1e-9  # 3.6/h x (60 s boot + 600 s run)
    assert abs(optimum - bound.cost) < 1e-9
