"""The sweep behind the PowerPolicy defaults: candidate policies on the built-in bursty week.

Each candidate is the built-in defaults (`PowerPolicySpec()`) with a few knobs changed;
each runs on the same trace, fleet and seed(s) as `nodewarden simulate --trace
builtin:bursty-week`, and the script prints one row per candidate and seed:

  cost, cost / oracle, busy cost (price x busy time: what would remain with zero idle
  spend), p50 / p95 queue wait, p95 of the burst containers, power cycles, and whether
  the three targets of issue 11 are met (cost <= 1.10 x oracle; p95 wait <= the run's
  median boot + 30 s; fewer power cycles than the fixed-timeout baseline).

Figures, not assertions. Run:
  .venv/bin/python benchmarks/tune_simulate.py [--seeds 1,2,3] [--jobs 2] [--only 'NAME;...']
  .venv/bin/python benchmarks/tune_simulate.py --list
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from nodewarden.api.powerpolicy import PowerPolicySpec
from nodewarden.simulate.accounting import percentile
from nodewarden.simulate.engine import Simulation
from nodewarden.simulate.generate import PRESETS, generate
from nodewarden.simulate.oracle import oracle_bound
from nodewarden.simulate.policies import baselines, policy_from_spec
from nodewarden.simulate.presets import builtin_fleet


def _budget(n: int) -> dict[str, Any]:
    return {"disruptionBudget": {"maxConcurrentTransitions": n}}


HOURLY = {"billing": {"period": "1h", "windowStart": "50m", "windowEnd": "1h"}}
OLD_DEFAULTS: dict[str, Any] = {"idleThreshold": "20m", **HOURLY, **_budget(1)}
"""The defaults before the tuning (idle 20m, hourly billing window, one transition)."""

CANDIDATES: dict[str, dict[str, Any]] = {
    "old-defaults": OLD_DEFAULTS,
    "old, per-second billing": {**OLD_DEFAULTS, "billing": {"period": "0s"}},
    "old, per-second, budget 6": {"idleThreshold": "20m"},
    "defaults": {},
    "idle 2m": {"idleThreshold": "2m"},
    "idle 3m": {"idleThreshold": "3m"},
    "idle 10m": {"idleThreshold": "10m"},
    "budget 1": _budget(1),
    "budget 3": _budget(3),
    "budget 12": _budget(12),
    "minOn 10m": {"minOn": "10m"},
    "minOn 1h": {"minOn": "1h"},
    "minOff 2m, cooldown 2m": {"minOff": "2m", "cooldown": "2m"},
    "minWarmNodes 4": {"minWarmNodes": 4},
    "hourly billing window": HOURLY,
}
"""Knobs changed from the built-in defaults (`PowerPolicySpec()`)."""


def _row(name: str, knobs: dict[str, Any], seed: int) -> dict[str, Any]:
    trace = generate(PRESETS["bursty-week"], seed)
    fleet = builtin_fleet()
    if name == "fixed-timeout-1m (baseline)":
        policy = baselines()[1]
    else:
        policy = policy_from_spec(PowerPolicySpec.model_validate(knobs), name)
    sim = Simulation(trace, fleet, policy, seed)
    t0 = time.process_time()
    result = sim.run()
    cpu = time.process_time() - t0
    bursts = sorted(
        (c.started - c.spec.arrival) / 1e6
        for c in sim.containers
        if c.started is not None and c.spec.priority == 300
    )
    f = result.figures
    return {
        "name": name,
        "seed": seed,
        "cost": f["cost"],
        "busy": f["busyCost"],
        "p50": f["waitSeconds"]["p50"],
        "p95": f["waitSeconds"]["p95"],
        "burst95": percentile(bursts, 95),
        "boot": f["medianBootSeconds"],
        "cycles": f["powerCycles"],
        "notRun": f["notRun"],
        "cpu": cpu,
        "oracle": oracle_bound(trace, fleet).cost,
        "causes": list(f["idleSpendByCause"].items())[:3],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", default="1")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--only", default="")
    parser.add_argument("--list", action="store_true")
    args = parser.parse_args()
    if args.list:
        for name, knobs in CANDIDATES.items():
            print(f"{name:24s} {knobs}")
        return
    seeds = [int(s) for s in args.seeds.split(",")]
    names = [n for n in args.only.split(";") if n] or list(CANDIDATES)
    jobs = [("fixed-timeout-1m (baseline)", {}, s) for s in seeds]
    jobs += [(n, CANDIDATES[n], s) for n in names for s in seeds]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        rows = list(pool.map(_row, *zip(*jobs, strict=True)))
    fixed = {r["seed"]: r["cycles"] for r in rows if r["name"].startswith("fixed-timeout")}
    print(
        f"{'CANDIDATE':28s} {'SEED':>4s} {'COST':>8s} {'/ORACLE':>7s} {'BUSY':>8s} "
        f"{'P50':>5s} {'P95':>5s} {'BURST95':>7s} {'BOOT':>5s} {'CYCLES':>6s} "
        f"{'COST':>4s} {'WAIT':>4s} {'CYC':>3s} {'CPU':>5s}  IDLE SPEND: TOP CAUSES"
    )
    for r in rows:
        ratio = r["cost"] / r["oracle"]
        wait_ok = r["p95"] <= r["boot"] + 30
        cycles_ok = r["cycles"] < fixed[r["seed"]]
        print(
            f"{r['name']:28s} {r['seed']:4d} {r['cost']:8.2f} {ratio:7.2f} {r['busy']:8.2f} "
            f"{r['p50']:5.0f} {r['p95']:5.0f} {r['burst95']:7.0f} {r['boot']:5.0f} "
            f"{r['cycles']:6d} {'ok' if ratio <= 1.10 else '-':>4s} "
            f"{'ok' if wait_ok else '-':>4s} {'ok' if cycles_ok else '-':>3s} {r['cpu']:5.1f}  "
            + ", ".join(f"{cause} {cost:.0f}" for cause, cost in r["causes"])
        )


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
    from calibration import summary  # the machine figure this run compares through

    print(summary(), flush=True)
    main()
