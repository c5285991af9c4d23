"""Issue 25's figures for benchmarks/bench_simulate.py: the peers, their knob sweeps, the
prophet, price-weighted utilisation, on the bursty week and the dense day.

For each trace (seeded): the default policy and the fixed-timeout baseline, every peer at
its documented defaults, the prophet of each of those runs, the oracle (one table); every
peer at every value of its main knob (the sweep); then, side by side for both traces, the
figures the issue's target table names. Then the prophet's property on random small
traces (`peers.sweep.prophet_check`). CPU seconds are per row, with the calibration
figure and the load average beside them. Figures, not assertions.
"""

from __future__ import annotations

import os
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from nodewarden.api.powerpolicy import PowerPolicySpec
from nodewarden.simulate.accounting import percentile
from nodewarden.simulate.engine import Simulation
from nodewarden.simulate.generate import PRESETS, generate
from nodewarden.simulate.oracle import oracle_bound
from nodewarden.simulate.peers import PEERS, run_peer_and_prophet
from nodewarden.simulate.peers.prophet import prophet_of_simulation
from nodewarden.simulate.peers.sweep import (
    EQUAL_SERVICE,
    SweepRow,
    cheapest_at_equal_service,
    prophet_check,
    random_small_case,
)
from nodewarden.simulate.peers.world import PeerRun
from nodewarden.simulate.policies import baselines, policy_from_spec
from nodewarden.simulate.presets import builtin_fleet
from nodewarden.simulate.report import Comparison, render_table
from nodewarden.simulate.results import RunResult

TRACES = ("bursty-week", "dense-day")
BURST_PRIORITY = 300  # the presets' burst jobs


@dataclass
class TraceFigures:
    """What one trace contributes to the side-by-side figures."""

    name: str
    seed: int
    default: RunResult
    default_cost: float
    prophet: PeerRun
    prompt: PeerRun
    non_burst_p95: float
    best: SweepRow | None
    cpu: dict[str, float] = field(default_factory=dict)
    peer_cpu: list[float] = field(default_factory=list)


def _timed_policy(
    trace: Any, fleet: Any, name: str, spec: PowerPolicySpec | None, seed: int
) -> tuple[Simulation, RunResult, float]:
    policy = policy_from_spec(spec, name) if spec is not None else baselines()[1]
    sim = Simulation(trace, fleet, policy, seed)
    cpu = time.process_time()
    result = sim.run()
    return sim, result, time.process_time() - cpu


def _non_burst_p95(sim: Simulation) -> float:
    waits = sorted(
        (c.started - c.spec.arrival) / 1e6
        for c in sim.containers
        if c.finished is not None and c.started is not None and c.spec.priority != BURST_PRIORITY
    )
    return percentile(waits, 95)


def _sweep_table(rows: list[SweepRow], cpu: list[float], p95: float) -> str:
    header = [
        "PEER",
        "KNOB",
        "VALUE",
        "COST",
        "P95",
        "P-UTIL",
        "/NODE",
        "EVICTED",
        "DOWN",
        "CPU-S",
        "",
    ]
    lines = [header]
    for row, seconds in zip(rows, cpu, strict=True):
        f = row.run.figures
        mark = []
        if row.value == row.spec.default:
            mark.append("default")
        if row.complete and f["waitSeconds"]["p95"] <= EQUAL_SERVICE * p95:
            mark.append("equal service")
        lines.append(
            [
                row.spec.name,
                row.spec.knob,
                f"{row.value:g}{row.spec.unit}",
                f"{row.run.cost:.2f}",
                f"{f['waitSeconds']['p95']:.0f}s",
                f"{f['priceWeightedUtilisation']:.2f}",
                f"{f['cyclesPerNode']:.2f}",
                str(row.run.evicted),
                str(row.run.down),
                f"{seconds:.1f}",
                ", ".join(mark),
            ]
        )
    widths = [max(len(r[i]) for r in lines) for i in range(len(header))]
    return "\n".join(
        "  ".join(
            c.rjust(w) if 2 < i < 10 else c.ljust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ).rstrip()
        for r in lines
    )


def one_trace(name: str, seed: int) -> TraceFigures:
    trace = generate(PRESETS[name], seed)
    fleet = builtin_fleet()
    gpu = sum(1 for c in trace.containers if c.resources.gpus)
    print(
        f"\n=== {name}, seed {seed}: {len(trace.containers)} containers ({gpu} GPU, "
        f"{100 * gpu / len(trace.containers):.1f} %), {trace.end / 3.6e9:.1f} h ===",
        flush=True,
    )
    cpu: dict[str, float] = {}
    sim, default, cpu["default"] = _timed_policy(trace, fleet, "default", PowerPolicySpec(), seed)
    fixed_sim, fixed, cpu["fixed-timeout-1m"] = _timed_policy(trace, fleet, "fixed", None, seed)
    t0 = time.process_time()
    prophets = [prophet_of_simulation(sim, default), prophet_of_simulation(fixed_sim, fixed)]
    prompt = prophet_of_simulation(sim, default, prompt_only=True)
    cpu["prophet (default)"] = (time.process_time() - t0) / 3
    rows: list[SweepRow] = []
    peer_cpu: list[float] = []
    defaults: list[PeerRun] = []
    for spec in PEERS:
        for value in spec.sweep:
            t0 = time.process_time()
            run, prophet = run_peer_and_prophet(trace, fleet, spec.build(value), seed)
            peer_cpu.append(time.process_time() - t0)
            rows.append(SweepRow(spec, value, run))
            if value == spec.default:
                defaults.append(run)
                prophets.append(prophet)
    prophets.append(prompt)
    cmp = Comparison(
        trace,
        fleet,
        seed,
        (default, fixed),
        oracle_bound(trace, fleet),
        tuple(defaults),
        tuple(prophets),
    )
    print(render_table(cmp).split("\nIdle spend by cause")[0])
    p95 = default.figures["waitSeconds"]["p95"]
    print(f"\nKnob sweep (equal service: p95 <= {EQUAL_SERVICE:.2f} x the default's {p95:.0f} s):")
    print(_sweep_table(rows, peer_cpu, p95))
    return TraceFigures(
        name,
        seed,
        default,
        sim.ledger.cost,
        prophets[0],
        prompt,
        _non_burst_p95(sim),
        cheapest_at_equal_service(rows, p95),
        cpu,
        peer_cpu,
    )


def side_by_side(figures: list[TraceFigures], calibration: str) -> None:
    names = [f"{t.name} (seed {t.seed})" for t in figures]
    lines: list[list[str]] = [["figure", *names, "target"]]

    def row(label: str, cells: list[str], target: str) -> None:
        lines.append([label, *cells, target])

    cells = []
    for t in figures:
        if t.best is None:
            cells.append("no peer setting at equal service")
        else:
            b = t.best
            cells.append(
                f"{t.default_cost / b.run.cost:.2f} ({b.spec.name} {b.spec.knob}={b.value:g}{b.spec.unit}: {b.run.cost:.2f})"
            )
    row("default cost / cheapest peer setting at equal service", cells, "<= 0.90 on both")
    row(
        "price-weighted utilisation, default",
        [f"{t.default.figures['priceWeightedUtilisation']:.2f}" for t in figures],
        ">= 0.6",
    )
    row(
        "  / the prophet's",
        [
            f"{t.default.figures['priceWeightedUtilisation'] / t.prophet.figures['priceWeightedUtilisation']:.2f} (prophet {t.prophet.figures['priceWeightedUtilisation']:.2f})"
            for t in figures
        ],
        ">= 0.8",
    )
    row(
        "default cost / prophet",
        [
            f"{t.default_cost / t.prophet.cost:.2f} ({t.default_cost:.2f} / {t.prophet.cost:.2f})"
            for t in figures
        ],
        "<= 1.25, or half of today's gap",
    )
    row(
        "  / prophet, every container prompt",
        [
            f"{t.default_cost / t.prompt.cost:.2f} (p95 {t.prompt.figures['waitSeconds']['p95']:.0f} s)"
            for t in figures
        ],
        "(reference)",
    )
    row(
        "p95 wait, default: all / non-burst (median boot)",
        [
            f"{t.default.figures['waitSeconds']['p95']:.0f} s / {t.non_burst_p95:.0f} s ({t.default.figures['medianBootSeconds']:.0f} s)"
            for t in figures
        ],
        "non-burst with forecast wake <= median boot + 30 s",
    )
    row(
        "power cycles per node slot, default",
        [f"{t.default.figures['cyclesPerNode']:.2f}" for t in figures],
        "no worse than today",
    )
    row(
        "CPU s per row: default / fixed-1m / peer (mean, max) / prophet",
        [
            f"{t.cpu['default']:.1f} / {t.cpu['fixed-timeout-1m']:.1f} / {statistics.mean(t.peer_cpu):.1f}, {max(t.peer_cpu):.1f} / {t.cpu['prophet (default)']:.2f}"
            for t in figures
        ],
        "<= 10 s at calibration 2.34 s",
    )
    total = sum(sum(t.cpu.values()) + sum(t.peer_cpu) for t in figures)
    row(
        "CPU s, both traces in total",
        [f"{total:.0f} (all rows)"] + [""] * (len(figures) - 1),
        calibration,
    )
    widths = [max(len(r[i]) for r in lines) for i in range(len(lines[0]))]
    print("\nTargets of issue 25, side by side (now = the current default policy):")
    for r in lines:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


def prophet_property(samples: int, seed: int) -> None:
    t0 = time.process_time()
    bad: list[tuple[int, list[str]]] = []
    compared = 0
    gaps: list[float] = []
    for i in range(samples):
        trace, fleet, knobs = random_small_case(random.Random(seed * 1_000_003 + i))
        check = prophet_check(trace, fleet, knobs, seed)
        compared += check.compared
        gaps += check.gaps
        if check.violations:
            bad.append((i, check.violations))
    print(
        f"\nProphet property on {samples} random small traces ({compared} runs compared, "
        f"{time.process_time() - t0:.1f} s CPU): violations {len(bad)}; run cost / its "
        f"prophet: median {statistics.median(gaps):.3f}, p90 {percentile(sorted(gaps), 90):.3f}, "
        f"max {max(gaps):.2f}"
    )
    for i, problems in bad[:5]:
        print(f"  case {i}: {problems[:2]}")


def main(seed: int, samples: int, calibration: str) -> None:
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    figures = [one_trace(name, seed) for name in TRACES]
    side_by_side(figures, f"{calibration}; load average {os.getloadavg()[0]:.2f}")
    prophet_property(samples, seed)
    print(f"\nload average after: {os.getloadavg()[0]:.2f}")
