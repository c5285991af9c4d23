"""Each peer's main knob swept, the cheapest peer setting at equal service, and the
prophet's property on random small traces.

* `sweep` runs every peer of `PEERS` at every value of its knob on one trace, fleet and
  seed;
* `cheapest_at_equal_service` picks, among sweep rows that ran every container, the
  cheapest whose p95 wait is at most `factor` (1.10) times a reference p95 (the default
  policy's): "default cost / the cheapest peer setting at equal service";
* `random_small_case` draws a small trace and fleet (and knob values) from a seeded
  random stream; `prophet_check` checks on it that the prophet of every run (its
  placement, clairvoyant power) waits no longer than the run, costs no more and no less
  than the oracle bound (the test runs it under hypothesis, the benchmark on 200 cases).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from nodewarden.api.powerpolicy import PowerPolicySpec
from nodewarden.simulate.engine import Simulation
from nodewarden.simulate.fleet import Fleet, load_fleet
from nodewarden.simulate.oracle import oracle_bound
from nodewarden.simulate.peers import PEERS, PeerSpec, run_peer, run_peer_and_prophet
from nodewarden.simulate.peers.prophet import prophet_of_simulation
from nodewarden.simulate.peers.world import PeerRun
from nodewarden.simulate.policies import baselines, policy_from_spec
from nodewarden.simulate.trace import Trace, parse_trace

EQUAL_SERVICE = 1.10
"""A peer setting serves equally when its p95 wait is at most this times the default's."""


@dataclass(frozen=True, slots=True)
class SweepRow:
    spec: PeerSpec
    value: float
    run: PeerRun

    @property
    def complete(self) -> bool:
        f = self.run.figures
        return not f["notRun"] and not f["unfinished"]


def sweep(
    trace: Trace, fleet: Fleet, seed: int, specs: Sequence[PeerSpec] = PEERS
) -> list[SweepRow]:
    """Every peer at every value of its knob."""
    return [
        SweepRow(spec, value, run_peer(trace, fleet, spec.build(value), seed))
        for spec in specs
        for value in spec.sweep
    ]


def cheapest_at_equal_service(
    rows: Sequence[SweepRow], p95: float, factor: float = EQUAL_SERVICE
) -> SweepRow | None:
    """The cheapest complete row whose p95 wait is at most `factor` x `p95`."""
    fair = [r for r in rows if r.complete and r.run.figures["waitSeconds"]["p95"] <= factor * p95]
    return min(fair, key=lambda r: (r.run.cost, r.spec.name, r.value), default=None)


# -- the prophet's property -------------------------------------------------------------------


def random_small_case(rng: random.Random) -> tuple[Trace, Fleet, dict[str, float]]:
    """A small trace (1-4 containers within 20 minutes), a small fleet and knob values."""
    types: list[dict[str, Any]] = [
        {"name": "a", "vcpus": 2, "ram": "4Gi", "price": rng.choice([0.1, 0.5, 1.0])}
    ]
    if rng.random() < 0.5:
        types.append({"name": "b", "vcpus": 4, "ram": "8Gi", "price": rng.choice([0.15, 0.8, 2.0])})
    side: list[dict[str, Any]] = []
    if rng.random() < 0.5:
        side.append(
            {
                "name": "side",
                "capacity": {"vcpus": 4, "ram": "8Gi"},
                "costPerHour": rng.choice([0.0, 0.05, 0.3]),
                "initialPower": rng.choice(["On", "Off"]),
                "boot": rng.choice(["60s", "120s"]),
                "shutdown": "30s",
                "bmc": {"latency": "1s", "pollInterval": "10s"},
            }
        )
    hourly = rng.random() < 0.3
    fleet = load_fleet(
        {
            "cloud": {
                "instanceTypes": types,
                "billing": {
                    "period": "1h" if hourly else "0s",
                    "minimum": "0s" if hourly else "60s",
                },
                "createLatency": "0s",
                "boot": rng.choice(["60s", "90s"]),
                "shutdown": "30s",
            },
            "sideNodes": side,
        }
    )
    rows = ["arrival,runtime,vcpus,ram"]
    for _ in range(rng.randint(1, 4)):
        rows.append(
            f"{rng.randint(0, 20) * 60},{rng.randint(1, 30) * 60},{rng.choice([1, 2, 3])},"
            f"{rng.choice(['1Gi', '2Gi', '3Gi'])}"
        )
    trace = parse_trace("\n".join(rows) + "\n", "csv")
    knobs = {spec.name: float(rng.choice(spec.sweep)) for spec in PEERS}
    knobs["idleThreshold"] = float(rng.choice([60, 300, 1200]))
    return trace, fleet, knobs


@dataclass
class ProphetCheck:
    """What `prophet_check` found on one case."""

    violations: list[str] = field(default_factory=list)
    compared: int = 0
    """Runs (a policy or peer that ran every container) compared with their prophet."""
    gaps: list[float] = field(default_factory=list)
    """Each compared run's cost over its prophet's (>= 1)."""


def _check(
    out: ProphetCheck, name: str, cost: float, f: dict[str, Any], prophet: PeerRun, oracle: float
) -> None:
    if f["notRun"] or f["unfinished"]:
        return
    out.compared += 1
    mine, theirs = prophet.figures["waitSeconds"], f["waitSeconds"]
    if prophet.cost < oracle - 1e-9:
        out.violations.append(f"{prophet.name}: {prophet.cost:.6f} below the oracle {oracle:.6f}")
    if any(mine[k] > theirs[k] + 1e-6 for k in ("p50", "p95", "max")):
        out.violations.append(f"{prophet.name} waits {mine} longer than the run's {theirs}")
    if prophet.cost > cost + 1e-9:
        out.violations.append(f"{prophet.name} {prophet.cost:.6f} > {name} {cost:.6f}")
    if prophet.cost > 0:
        out.gaps.append(cost / prophet.cost)


def prophet_check(trace: Trace, fleet: Fleet, knobs: dict[str, float], seed: int) -> ProphetCheck:
    """Every run (nodewarden's default policy, a random idle threshold, both baselines;
    every peer at a random knob value) against its prophet (module docstring)."""
    oracle = oracle_bound(trace, fleet).cost
    out = ProphetCheck()
    tuned = PowerPolicySpec.model_validate({"idleThreshold": f"{knobs['idleThreshold']:g}s"})
    policies = [
        policy_from_spec(PowerPolicySpec(), "default"),
        policy_from_spec(tuned, f"idleThreshold {knobs['idleThreshold']:g}s"),
        *baselines(),
    ]
    for policy in policies:
        sim = Simulation(trace, fleet, policy, seed)
        result = sim.run()
        prophet = prophet_of_simulation(sim, result)
        _check(out, policy.name, sim.ledger.cost, result.figures, prophet, oracle)
    for spec in PEERS:
        run, prophet = run_peer_and_prophet(trace, fleet, spec.build(knobs[spec.name]), seed)
        _check(out, run.name, run.cost, run.figures, prophet, oracle)
    return out
