"""What a simulated run cost and how long work waited: the figures of one table row.

Definitions (docs/simulation.md "Reading the table"):

* cost: every cloud VM is billed from launch to termination under the fleet's billing
  (per second, or per started period, with a minimum charge); every side node costs its
  `costPerHour` for the time it draws power (from the moment a power-on is applied to the
  moment it is off, boot and shutdown included).
* node-hours: time nodes were on (VM launch -> termination, side node on -> off).
* busy node-hours: time a node ran at least one container; idle node-hours = node-hours
  - busy node-hours (booting, idle, draining, shutting down).
* idle spend %: the share of the cost not spent while a node ran work: 100 x (cost -
  sum of price x busy time) / cost; billing round-up counts as idle spend.
* queue wait: from arrival to the start of the container (containers that ran).
* idle spend by cause: the price of each stretch a node spent on without work, named by
  what held it there: booting (launch or power-on until it takes work), the reason code
  of the decision that kept it on (IDLE_WINDOW_NOT_MET = idle threshold, BILLING_WINDOW_CLOSED,
  MIN_ON_NOT_MET, MIN_WARM_NODES, DISRUPTION_BUDGET_EXHAUSTED, TELEMETRY_STALE, ...),
  draining / shutting down, BLOCKED; what is left is billing round-up and minimum charges.
* power cycles: switch-ons (VM launches, side-node wakes); per node: divided by the
  node slots used (each side node is a slot; VMs of one type reuse the lowest free slot
  number, so "vm m5.large #3 was launched 40 times" is a cycle count per slot).
* not run: containers that never started (nothing fits them, held at priority 0, or
  still queued when the run stopped).
* price-weighted utilisation: Σ over finished containers of run time x share of the node
  x the node's price ÷ cost (`simulate.utilisation`).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

_US = 1_000_000
_HOUR = 3600 * _US


def billed_us(life: int, period: int, minimum: int) -> int:
    """Billed microseconds for a VM alive `life`: the minimum, then per started period."""
    billed = max(life, minimum)
    if period > 0:
        billed = math.ceil(billed / period) * period
    return billed


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of an ascending list; 0 for an empty one."""
    if not sorted_values:
        return 0.0
    rank = max(1, math.ceil(p / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


@dataclass
class Ledger:
    """Accumulates the figures of one run."""

    cost: float = 0.0
    busy_cost: float = 0.0
    on_us: int = 0
    busy_us: int = 0
    waits: list[float] = field(default_factory=list)
    boots: list[float] = field(default_factory=list)
    cycles: int = 0
    slots: set[str] = field(default_factory=set)
    not_run: int = 0
    unfinished: int = 0
    failed_unsatisfiable: int = 0
    decisions: Counter[str] = field(default_factory=Counter)
    transitions: Counter[str] = field(default_factory=Counter)
    series: list[tuple[int, int, int]] = field(default_factory=list)
    requeued: int = 0
    idle_by_cause: dict[str, float] = field(default_factory=dict)
    useful: float = 0.0
    """Price-weighted work of the finished containers (`simulate.utilisation`)."""

    def on_interval(self, start: int, end: int, price: float, billed: int | None = None) -> None:
        """A node was on from start to end; `billed` overrides the charged duration."""
        self.on_us += end - start
        self.cost += price * (end - start if billed is None else billed) / _HOUR

    def idle_interval(self, cause: str, start: int, end: int, price: float) -> None:
        """A node was on without work from start to end, held there by `cause`."""
        cost = price * (end - start) / _HOUR
        self.idle_by_cause[cause] = self.idle_by_cause.get(cause, 0.0) + cost

    def busy_interval(self, start: int, end: int, price: float) -> None:
        self.busy_us += end - start
        self.busy_cost += price * (end - start) / _HOUR

    def sample(self, t: int, nodes_on: int, queued: int) -> None:
        last = self.series[-1] if self.series else None
        if last is not None and last[1] == nodes_on and last[2] == queued:
            return
        if last is not None and last[0] == t:
            self.series[-1] = (t, nodes_on, queued)
        else:
            self.series.append((t, nodes_on, queued))

    def _idle_causes(self, idle_spend: float) -> dict[str, float]:
        causes = dict(self.idle_by_cause)
        rest = idle_spend - sum(causes.values())
        if rest > 0.005:
            causes["billing round-up and minimum"] = rest
        ranked = sorted(causes.items(), key=lambda kv: (-kv[1], kv[0]))
        return {cause: round(cost, 2) for cause, cost in ranked if round(cost, 2) > 0}

    def figures(self) -> dict[str, Any]:
        waits = sorted(self.waits)
        node_hours = self.on_us / _HOUR
        busy_hours = self.busy_us / _HOUR
        idle_spend = self.cost - self.busy_cost
        return {
            "cost": round(self.cost, 2),
            "busyCost": round(self.busy_cost, 2),
            "nodeHours": round(node_hours, 1),
            "idleNodeHours": round(node_hours - busy_hours, 1),
            "idleSpendPercent": round(100 * idle_spend / self.cost, 1) if self.cost > 0 else 0.0,
            "waitSeconds": {
                "p50": round(percentile(waits, 50), 1),
                "p95": round(percentile(waits, 95), 1),
                "p99": round(percentile(waits, 99), 1),
                "max": round(waits[-1], 1) if waits else 0.0,
            },
            "containersRun": len(waits),
            "powerCycles": self.cycles,
            "nodeSlots": len(self.slots),
            "cyclesPerNode": round(self.cycles / len(self.slots), 2) if self.slots else 0.0,
            "notRun": self.not_run,
            "unfinished": self.unfinished,
            "requeued": self.requeued,
            "priceWeightedUtilisation": round(self.useful / self.cost, 3) if self.cost > 0 else 0.0,
            "medianBootSeconds": round(percentile(sorted(self.boots), 50), 1),
            "idleSpendByCause": self._idle_causes(idle_spend),
            "decisions": dict(sorted(self.decisions.items())),
            "transitions": dict(sorted(self.transitions.items())),
        }
