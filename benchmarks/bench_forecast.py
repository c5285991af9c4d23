"""Benchmark of forecast wake (issue 25 item 6) in `nodewarden simulate`: the forecast is
trained on a trace's first days and every row is judged on the days after them only.

Scenarios (seed from --seed):
  * the built-in bursty week (7 days, Monday to Sunday): trained Monday-Wednesday, judged
    Thursday-Sunday -- the weekend was never seen, so it has no forecast there;
  * the bursty-week preset over 14 days: trained on the first week, judged on the second
    (--skip-two-weeks leaves it out).

Rows: the built-in default PowerPolicy, and the same plus forecast wake
(examples/simulate/policy-forecast.yaml). Prints, per row: cost and its ratio to the
default, the p95 wait of all containers, the p50 / p95 wait of the non-burst containers
(the burst class is priority 300; bursts start at random times and cannot be forecast),
split by judged weekdays and weekend, against the target median boot + 30 s, power
cycles, idle spend by cause, and CPU seconds per row; with the calibration figure and
the load average. Figures, not assertions.

Run: .venv/bin/python benchmarks/bench_forecast.py [--seed N] [--confidence Q]
[--skip-two-weeks]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import yaml

from nodewarden.api.powerpolicy import PowerPolicySpec
from nodewarden.simulate.accounting import percentile
from nodewarden.simulate.engine import Simulation
from nodewarden.simulate.generate import PRESETS, generate
from nodewarden.simulate.policies import SimPolicy, load_policy, policy_from_spec
from nodewarden.simulate.presets import builtin_fleet
from nodewarden.simulate.trace import Trace
from nodewarden.simulate.warmth import split_trace, train

ROOT = Path(__file__).resolve().parents[1]
BURST_PRIORITY = 300
WAIT_MARGIN_S = 30.0
COST_LIMIT = 1.10
"""The forecast row's cost may be at most this many times the default's (issue 25)."""


def _forecast_policy(confidence: float | None) -> SimPolicy:
    doc = yaml.safe_load((ROOT / "examples/simulate/policy-forecast.yaml").read_text())
    if confidence is not None:
        doc["spec"]["forecastWake"]["confidence"] = confidence
    return load_policy(doc, "default-forecast")


def _waits(sim: Simulation, weekend: bool | None) -> list[float]:
    out = []
    for c in sim.containers:
        if c.started is None or c.spec.priority == BURST_PRIORITY:
            continue
        day = sim.at(c.spec.arrival).weekday()
        if weekend is None or (day >= 5) == weekend:
            out.append((c.started - c.spec.arrival) / 1e6)
    return sorted(out)


def scenario(
    title: str, trace: Trace, train_days: float, seed: int, confidence: float | None
) -> None:
    fleet = builtin_fleet()
    first, judged = split_trace(trace, train_days)
    forecast = _forecast_policy(confidence)
    t0 = time.process_time()
    trained = train(
        first, forecast.spec, fleet, fleet.cloud.catalogue, fleet.cloud.instance_type_policy
    )
    train_cpu = time.process_time() - t0
    print(
        f"\n{title}: trained on days 0-{train_days:g} ({len(first.containers)} containers, "
        f"{trained.days_observed:.1f} days watched, {sum(trained.bursts.values()):.0f} arrivals "
        f"counted apart as bursts, {train_cpu:.1f} s CPU); judged from "
        f"{judged.start:%a %Y-%m-%d} ({len(judged.containers)} containers)"
    )
    rows = [
        policy_from_spec(PowerPolicySpec(), "default"),
        replace(forecast, name="default + forecast wake", forecast=trained),
    ]
    base_cost = None
    print(
        f"  {'POLICY':26s} {'COST':>8s} {'xDEF':>5s} {'P95':>6s} {'NB-P50':>7s} {'NB-P95':>7s} "
        f"{'WKDAY':>6s} {'WKEND':>6s} {'BOOT':>5s} {'TARGET':>6s} {'CYCLES':>6s} {'CPU':>5s}"
    )
    for policy in rows:
        sim = Simulation(judged, fleet, policy, seed)
        t0 = time.process_time()
        result = sim.run()
        cpu = time.process_time() - t0
        f = result.figures
        cost = f["cost"]
        base_cost = base_cost or cost
        nb = _waits(sim, None)
        boot = f["medianBootSeconds"]
        target = boot + WAIT_MARGIN_S
        p95 = percentile(nb, 95)
        met = f"p95 {'met' if p95 <= target else 'MISSED'}"
        if cost != base_cost:
            met += f", cost {'met' if cost <= COST_LIMIT * base_cost else 'MISSED'}"
        print(
            f"  {policy.name:26s} {cost:8.2f} {cost / base_cost:5.3f} "
            f"{f['waitSeconds']['p95']:6.0f} {percentile(nb, 50):7.1f} {p95:7.1f} "
            f"{percentile(_waits(sim, False), 95):6.0f} {percentile(_waits(sim, True), 95):6.0f} "
            f"{boot:5.0f} {target:6.0f} {f['powerCycles']:6d} {cpu:5.1f}  {met}"
        )
        causes = ", ".join(f"{k} {v}" for k, v in list(f["idleSpendByCause"].items())[:5])
        print(f"  {'':26s} idle spend by cause: {causes}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--confidence", type=float, help="forecastWake.confidence (default: 0.8)")
    p.add_argument("--skip-two-weeks", action="store_true")
    args = p.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f}; seed {args.seed}")
    week = generate(PRESETS["bursty-week"], args.seed)
    scenario("bursty week (built-in, 7 days)", week, 3, args.seed, args.confidence)
    if not args.skip_two_weeks:
        two = generate(PRESETS["bursty-week"].scaled(days=14), args.seed)
        scenario("bursty-week preset over 14 days", two, 7, args.seed, args.confidence)
    print(
        "\nNB-P50/NB-P95: waits of the non-burst containers (priority != 300), WKDAY/WKEND their "
        "p95 on judged weekdays / weekend days; TARGET = median boot + 30 s (issue 25); xDEF = "
        "cost / the default's on the same judged days (target <= 1.10)"
    )
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "e2e"))
    from calibration import summary  # the machine figure this run compares through

    print(summary(), flush=True)
    main()
