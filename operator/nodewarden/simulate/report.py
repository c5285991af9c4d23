"""Run several policies on one trace and fleet, and render the side-by-side comparison.

    compare(trace, fleet, policies, seed) -> Comparison
    render_table(comparison) -> str          the human table
    comparison_document(comparison) -> dict  the `-o json` document

Rows: every policy given, then the baselines (never-off, fixed-timeout-1m), then the
peers asked for (`simulate.peers`: other schedulers' rules with their own placement),
then the prophet of each of those runs (`peers.prophet`), then the oracle lower bound.
Columns (definitions in `nodewarden.simulate.accounting`): total cost, cost / oracle,
node-hours, idle node-hours, idle spend %, queue wait p50 / p95 / p99 / max, power
cycles and cycles per node slot, price-weighted utilisation, containers that did not
run, the energy columns (`simulate.energy`): side nodes' kWh, kWh saved and money
saved against never-off, and whose placement the row uses. Below
it, the idle spend by cause (what kept nodes on without work, and what that cost), and
the decisions by reason code: how many decision episodes (a node's decision and
reasons changing) named each code, per policy. Pure: numbers in, text out; floats are
rounded once, so the same inputs give byte-identical output.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from nodewarden.simulate.engine import Simulation
from nodewarden.simulate.fleet import Fleet
from nodewarden.simulate.oracle import OracleBound, oracle_bound
from nodewarden.simulate.peers import run_peer_and_prophet
from nodewarden.simulate.peers.prophet import prophet_of_simulation
from nodewarden.simulate.peers.world import Peer, PeerRun
from nodewarden.simulate.policies import SimPolicy, baselines
from nodewarden.simulate.results import RunResult, SimOptions
from nodewarden.simulate.trace import Trace, describe

ORACLE_NAME = "oracle (lower bound)"
ENERGY_HEADER = ("KWH", "KWH-SAVED", "SAVED")
"""The energy columns (`simulate.energy`): side nodes' kWh, kWh and money saved against
never-off (cloud VM hours avoided included in SAVED)."""


def energy_cells(figures: dict[str, Any]) -> list[str]:
    """The energy cells of a row ("-" for a row whose run counted no energy)."""
    if "kWh" not in figures:
        return ["-"] * len(ENERGY_HEADER)
    return [f"{figures['kWh']:.1f}", f"{figures['kWhSaved']:.1f}", f"{figures['moneySaved']:.2f}"]


@dataclass(frozen=True, slots=True)
class Comparison:
    trace: Trace
    fleet: Fleet
    seed: int
    runs: tuple[RunResult, ...]
    oracle: OracleBound
    peers: tuple[PeerRun, ...] = ()
    prophets: tuple[PeerRun, ...] = ()


def compare(
    trace: Trace,
    fleet: Fleet,
    policies: Sequence[SimPolicy],
    seed: int,
    options: SimOptions | None = None,
    with_baselines: bool = True,
    peers: Sequence[Peer] = (),
    prophets: bool = False,
) -> Comparison:
    """Simulate each policy (and the baselines) and each peer on the same trace, fleet
    and seed; with `prophets`, the prophet of every run too."""
    chosen = list(policies) + (list(baselines()) if with_baselines else [])
    runs: list[RunResult] = []
    seers: list[PeerRun] = []
    for policy in chosen:
        sim = Simulation(trace, fleet, policy, seed, options)
        runs.append(sim.run())
        if prophets:
            seers.append(prophet_of_simulation(sim, runs[-1]))
    peer_runs: list[PeerRun] = []
    for peer in peers:
        run, prophet = run_peer_and_prophet(trace, fleet, peer, seed)
        peer_runs.append(run)
        if prophets:
            seers.append(prophet)
    return Comparison(
        trace,
        fleet,
        seed,
        tuple(runs),
        oracle_bound(trace, fleet),
        tuple(peer_runs),
        tuple(seers),
    )


def _label(run: RunResult | PeerRun) -> str:
    if isinstance(run, PeerRun):
        return run.name if run.name.startswith("prophet") else f"{run.name} (peer)"
    policy = run.policy
    if policy.baseline is not None:
        return f"{policy.name} (baseline)"
    return policy.name


def _placement(run: RunResult | PeerRun) -> str:
    return run.placement if isinstance(run, PeerRun) else "nodewarden"


def rows(cmp: Comparison) -> list[RunResult | PeerRun]:
    """Every row of the table but the oracle, in order."""
    return [*cmp.runs, *cmp.peers, *cmp.prophets]


def _ratio(cost: float, oracle: float) -> str:
    return f"{cost / oracle:.2f}" if oracle > 0 else "-"


def _seconds(value: float) -> str:
    if value >= 3600:
        return f"{value / 3600:.1f}h"
    if value >= 120:
        return f"{value / 60:.1f}m"
    return f"{value:.0f}s"


def _grid(rows: list[list[str]], right: set[int]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines) + "\n"


def render_table(cmp: Comparison) -> str:
    info = describe(cmp.trace)
    out = [
        f"Trace {info['name']}: {info['containers']} containers "
        f"({info['gpuContainers']} GPU), {info['containerHours']} container-hours over "
        f"{info['span']} from {info['start']}; seed {cmp.seed}\n",
        f"Fleet: {len(cmp.fleet.cloud.instance_types)} instance types "
        f"(billing period {cmp.fleet.cloud.billing.period}, minimum "
        f"{cmp.fleet.cloud.billing.minimum}), {cmp.fleet.side_node_count()} side nodes\n\n",
    ]
    header = [
        "POLICY",
        "COST",
        "/ORACLE",
        "NODE-H",
        "IDLE-H",
        "IDLE%",
        "WAIT-P50",
        "P95",
        "P99",
        "MAX",
        "CYCLES",
        "/NODE",
        "P-UTIL",
        "NOT-RUN",
        *ENERGY_HEADER,
        "PLACEMENT",
    ]
    table = [header]
    oracle = cmp.oracle.cost
    for run in rows(cmp):
        f = run.figures
        w = f["waitSeconds"]
        table.append(
            [
                _label(run),
                f"{f['cost']:.2f}",
                _ratio(f["cost"], oracle),
                f"{f['nodeHours']:.1f}",
                f"{f['idleNodeHours']:.1f}",
                f"{f['idleSpendPercent']:.1f}",
                _seconds(w["p50"]),
                _seconds(w["p95"]),
                _seconds(w["p99"]),
                _seconds(w["max"]),
                str(f["powerCycles"]),
                f"{f['cyclesPerNode']:.2f}",
                f"{f['priceWeightedUtilisation']:.2f}",
                str(f["notRun"]),
                *energy_cells(f),
                _placement(run),
            ]
        )
    table.append([ORACLE_NAME, f"{oracle:.2f}", "1.00", *["-"] * (len(header) - 3)])
    out.append(_grid(table, right=set(range(1, len(header) - 1))))
    causes: dict[str, float] = {}
    for run in cmp.runs:
        for cause, cost in run.figures["idleSpendByCause"].items():
            causes[cause] = max(causes.get(cause, 0.0), cost)
    if causes:
        out.append("\nIdle spend by cause (cost of nodes on without work, by what held them on)\n")
        cause_rows = [["CAUSE", *[_label(r) for r in cmp.runs]]]
        for cause in sorted(causes, key=lambda c: (-causes[c], c)):
            cause_rows.append(
                [cause, *[f"{r.figures['idleSpendByCause'].get(cause, 0.0):.2f}" for r in cmp.runs]]
            )
        out.append(_grid(cause_rows, right=set(range(1, len(cmp.runs) + 1))))
    codes = sorted({code for run in cmp.runs for code in run.figures["decisions"]})
    if codes:
        out.append("\nDecisions by reason code (episodes: a node's decision and reasons changed)\n")
        dec_rows = [["DECISION REASON", *[_label(r) for r in cmp.runs]]]
        for code in codes:
            dec_rows.append([code, *[str(r.figures["decisions"].get(code, 0)) for r in cmp.runs]])
        out.append(_grid(dec_rows, right=set(range(1, len(cmp.runs) + 1))))
    return "".join(out)


def comparison_document(cmp: Comparison) -> dict[str, Any]:
    oracle = cmp.oracle
    return {
        "trace": describe(cmp.trace),
        "fleet": {
            "description": cmp.fleet.description,
            "instanceTypes": len(cmp.fleet.cloud.instance_types),
            "billing": cmp.fleet.cloud.billing.model_dump(by_alias=True),
            "sideNodes": cmp.fleet.side_node_count(),
        },
        "seed": cmp.seed,
        "results": [
            {
                "policy": run.policy.name,
                "baseline": run.policy.baseline,
                "version": run.policy.view.version.model_dump(mode="json", by_alias=True),
                "costOverOracle": round(run.figures["cost"] / oracle.cost, 3)
                if oracle.cost > 0
                else None,
                **run.figures,
            }
            for run in cmp.runs
        ],
        "peers": [_peer_document(run, oracle.cost) for run in cmp.peers],
        "prophets": [_peer_document(run, oracle.cost) for run in cmp.prophets],
        "oracle": {
            "cost": round(oracle.cost, 2),
            "work": round(oracle.work, 2),
            "boots": round(oracle.boots, 2),
            "unplaceable": oracle.unplaceable,
        },
    }


def _peer_document(run: PeerRun, oracle: float) -> dict[str, Any]:
    return {
        "name": run.name,
        "placement": run.placement,
        "costOverOracle": round(run.cost / oracle, 3) if oracle > 0 else None,
        "evicted": run.evicted,
        "nodesDown": run.down,
        **run.figures,
    }
