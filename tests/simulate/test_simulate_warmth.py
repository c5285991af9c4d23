"""Warm capacity in the simulator, through the live rules: the forecast is trained on a
trace's first days and judged on the rest only (`--train-days`), then creates cloud VMs
ahead of the demand it learned; a warm window wakes side nodes by the clock."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from sim_builders import simulate, small_fleet

from nodewarden.api.powerpolicy import PowerPolicySpec
from nodewarden.simulate.accounting import percentile
from nodewarden.simulate.engine import Simulation
from nodewarden.simulate.policies import policy_from_spec
from nodewarden.simulate.trace import parse_trace
from nodewarden.simulate.warmth import split_trace, train

DAY = 86_400
SMALL = {"name": "small", "nodeType": "CloudVM", "instanceType": "small", "bootTime": "2m"}


def _trace(days: int, every: int = 600) -> str:
    """One 1-vCPU container every `every` seconds from 10:00 to 16:00 UTC each day,
    running 60 s (sparser than the idle threshold: without warm capacity each one waits
    for a VM to boot)."""
    rows = ["arrival,runtime,vcpus,ram"]
    for day in range(days):
        for t in range(10 * 3600, 16 * 3600, every):
            rows.append(f"{day * DAY + t},60,1,1Gi")
    return "\n".join(rows) + "\n"


def _forecast_spec(mode: str = "On") -> PowerPolicySpec:
    return PowerPolicySpec.model_validate(
        {
            "nodeClasses": [SMALL],
            "forecastWake": {"mode": mode, "minDays": 2, "confidence": 0.9},
        }
    )


def test_the_forecast_is_trained_on_the_first_days_only() -> None:
    trace = parse_trace(_trace(3), "csv")
    first, judged = split_trace(trace, 2)
    assert len(first.containers) == 72 and len(judged.containers) == 36
    assert judged.start == trace.start + (first.at(2 * DAY * 1_000_000) - trace.start)
    assert min(c.arrival for c in judged.containers) == 10 * 3600 * 1_000_000
    fleet = small_fleet()
    h = train(
        first, _forecast_spec(), fleet, fleet.cloud.catalogue, fleet.cloud.instance_type_policy
    )
    # it watched exactly the two training days and counted their arrivals, none later
    assert h.days_observed == 2.0
    assert h.counted_until == judged.start
    assert sum(h.classes["small"]["weekday"].arrivals) == 72
    rate = h.rate("small", "weekday", 12)
    assert rate is not None and rate[0] == 6.0


def test_the_trained_forecast_starts_work_sooner_on_the_judged_day() -> None:
    fleet = small_fleet()
    first, judged = split_trace(parse_trace(_trace(3), "csv"), 2)
    spec = _forecast_spec()
    trained = train(first, spec, fleet, fleet.cloud.catalogue, fleet.cloud.instance_type_policy)
    forecast = replace(policy_from_spec(spec, "forecast"), forecast=trained)
    default = policy_from_spec(PowerPolicySpec(), "default")
    waits = {}
    for policy in (default, forecast):
        sim = Simulation(judged, fleet, policy, seed=3)
        result = sim.run()
        assert result.figures["notRun"] == 0
        waits[policy.name] = sorted(
            (c.started - c.spec.arrival) / 1e6 for c in sim.containers if c.started is not None
        )
    # the default boots a VM for (nearly) every container; the forecast has one warm
    assert percentile(waits["default"], 50) > 60
    assert percentile(waits["forecast"], 90) < 10, waits["forecast"]
    # an untrained forecast (no history) changes nothing
    untrained = Simulation(judged, fleet, policy_from_spec(spec, "untrained"), seed=3)
    untrained.run()
    assert not untrained.warmth.active


def test_a_warm_window_wakes_side_nodes_in_the_simulation() -> None:
    spec = PowerPolicySpec.model_validate(
        {
            "nodeClasses": [{"name": "gpu", "nodeType": "SideNode", "namePrefix": "gpu"}],
            "warmCapacity": {
                "windows": [
                    {"name": "day", "nodeClass": "gpu", "minWarm": 1, "days": ["Mon"],
                     "start": "09:00", "end": "12:00"},
                ]
            },
        }
    )  # fmt: skip
    trace = parse_trace("arrival,runtime,vcpus,ram\n0,60,1,1Gi\n50400,60,1,1Gi\n", "csv")
    sim = Simulation(trace, small_fleet(), policy_from_spec(spec, "window"), seed=1)
    result = sim.run()
    # the GPU side node (off at the start) is woken for the window: one switch-on, and
    # the node costs its price for about the three hours it is held on (plus boot/idle)
    assert result.figures["decisions"].get("START WARM_WINDOW", 0) >= 1, result.figures
    assert result.figures["idleSpendByCause"].get("WARM_WINDOW", 0) > 2.5
    # the policy in force at the end, as PowerPolicy status.inForce shows it (issue 27)
    shown = result.figures["inForce"]
    (gpu, rest) = shown["classes"]
    assert gpu["name"] == "gpu" and rest["name"] == "(all)"
    assert gpu["nextWindowChangeAt"] == shown["nextChangeAt"]
    assert shown["nextChange"] == "window opens (gpu)"  # the run ends after Monday's window
    assert shown["nodes"]["total"] == gpu["nodes"]["total"] + rest["nodes"]["total"]
    assert shown["disruptionBudget"]["max"] == 6 and shown["forecast"] == "Off"


def test_train_days_on_the_cli(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text(_trace(3, every=1200))
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        json.dumps(
            {
                "cloud": {
                    "instanceTypes": [{"name": "small", "vcpus": 2, "ram": "4Gi", "price": 0.1}],
                    "boot": "60s",
                }
            }
        )
    )
    policy = tmp_path / "forecast.yaml"
    policy.write_text(
        json.dumps({"nodeClasses": [SMALL], "forecastWake": {"mode": "On", "minDays": 2}})
    )
    args = ("--trace", str(trace), "--fleet", str(fleet), "--policy", str(policy))
    code, out, err = simulate(
        *args, "--policy", "builtin:default", "--train-days", "2", "-o", "json"
    )
    assert code == 0, err
    doc = json.loads(out)
    forecasts = {r["policy"]: r["inForce"]["forecast"] for r in doc["results"]}
    assert forecasts["forecast"] == "On" and forecasts["default"] == "Off", forecasts
    training = doc["forecastTraining"]
    assert (training["trainedOn"], training["judgedOn"]) == (36, 18)
    assert training["policies"] == ["forecast"]
    code, out, err = simulate(*args, "--train-days", "2")
    assert code == 0 and out.startswith("forecast trained on the first 2 days (36 containers)")
    code, out, err = simulate(*args)
    assert code == 0 and "forecastWake has no history without --train-days" in err
    code, _, err = simulate(*args, "--train-days", "9")
    assert code == 2 and "--train-days" in err
