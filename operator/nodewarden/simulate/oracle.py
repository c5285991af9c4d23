"""The oracle lower bound on cost, and a brute-force optimum for tiny traces.

The oracle knows every arrival and run time in advance and may run any container on any
node that can hold it, delay it as long as it likes and pack nodes perfectly. Its bound
(docs/simulation.md "The oracle") is

    bound = work + boots

* work: every container must occupy a node that fits it for its whole run time. While a
  node of kind k (a VM instance type, or one side node) runs, the containers on it use at
  most all of it in every resource dimension, so the node's price covers, for any fixed
  dimension d_k, the sum of the containers' shares need_d / capacity_d. Charging each
  container runtime x price_k x share_{d_k} on its cheapest fitting kind therefore never
  exceeds what any schedule pays while nodes run work. The dimension per kind is fixed
  (not chosen per container, which would not be a bound); the bound is the largest over
  a few choices (vCPUs, RAM, their mean; GPUs or a mean with GPUs on GPU kinds).
* boots: a container no initially-on node can hold needs a node that booted at least
  once, billed for at least its shortest possible boot. Containers whose fitting kinds
  are pairwise disjoint need different nodes, so the boot bound sums the cheapest boot of
  each container in a greedily chosen set of containers with pairwise disjoint fitting
  kinds. Boot time and run time of one node never overlap, so the two parts add.

Everything else any real controller pays is left out: idle time before or after work,
the shutdown delay, billing round-up and minimum charges, packing losses (a container
using 51 % of a node), a boot per node actually used, waiting. Hence nothing can cost
less, and the bound can fall far below the optimum when those dominate (a one-minute job
on a VM billed per hour: bound 1 minute, optimum 60 minutes).

`brute_force_optimum(trace, fleet, grid)` computes the exact optimum of a small cost
model (start times on a grid, any grouping of containers on nodes, every choice of
switching a node off between its busy periods) for traces of a few containers; tests and
the benchmark compare the bound with it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass

from nodewarden.api.containerdispatch import ContainerResources
from nodewarden.scheduling.instancetypes import (
    InstanceTypePolicy,
    Requirements,
    effective_requirements,
)
from nodewarden.simulate.accounting import billed_us
from nodewarden.simulate.distributions import to_us
from nodewarden.simulate.fleet import Fleet, side_capacity_bytes
from nodewarden.simulate.trace import Trace

_HOUR = 3600 * 1_000_000
_DIMS = ("vcpus", "ram", "scratch", "gpus")


@dataclass(frozen=True, slots=True)
class Kind:
    """A kind of node the oracle may use: a VM instance type or one side node."""

    name: str
    price: float
    capacity: tuple[int, int, int, int]
    gpu_model: str | None
    preemptible: bool
    boot: int
    shutdown: int
    initially_on: bool
    vm: bool

    def fits(self, need: Requirements) -> bool:
        cap = self.capacity
        return (
            need.vcpus <= cap[0]
            and need.ram <= cap[1]
            and need.scratch <= cap[2]
            and need.gpus <= cap[3]
            and need.preemptible == self.preemptible
            and (need.gpus == 0 or not need.gpu_model or need.gpu_model == self.gpu_model)
        )

    def share(self, need: Requirements, weights: tuple[float, float, float, float]) -> float:
        values = (need.vcpus, need.ram, need.scratch, need.gpus)
        return sum(
            w * v / c for w, v, c in zip(weights, values, self.capacity, strict=True) if w and c
        )


def kinds(fleet: Fleet) -> list[Kind]:
    out: list[Kind] = []
    cloud = fleet.cloud
    vm_boot = cloud.create_latency.lower_bound() + cloud.boot.lower_bound()
    for t in cloud.instance_types:
        out.append(
            Kind(
                name=t.name,
                price=t.price,
                capacity=(t.vcpus, t.ram, t.scratch, t.gpus),
                gpu_model=t.gpu_model,
                preemptible=t.preemptible,
                boot=vm_boot,
                shutdown=cloud.shutdown.lower_bound(),
                initially_on=False,
                vm=True,
            )
        )
    for group in fleet.side_nodes:
        ram, scratch = side_capacity_bytes(group.capacity)
        for name in group.names():
            out.append(
                Kind(
                    name=name,
                    price=group.cost_per_hour,
                    capacity=(group.capacity.vcpus, ram, scratch, group.capacity.gpus),
                    gpu_model=group.capacity.gpu_model,
                    preemptible=False,
                    boot=group.boot.lower_bound(),
                    shutdown=group.shutdown.lower_bound(),
                    initially_on=group.initial_power == "On",
                    vm=False,
                )
            )
    return out


_CPU_WEIGHTS = ((1.0, 0, 0, 0), (0, 1.0, 0, 0), (0.5, 0.5, 0, 0))
_GPU_WEIGHTS = ((0, 0, 0, 1.0), (1.0, 0, 0, 0), (0, 1.0, 0, 0), (0.5, 0, 0, 0.5), (0, 0.5, 0, 0.5))


@dataclass(frozen=True, slots=True)
class OracleBound:
    cost: float
    work: float
    boots: float
    unplaceable: int
    """Containers no node of the fleet can hold (left out of the bound)."""


def oracle_bound(trace: Trace, fleet: Fleet) -> OracleBound:
    """The lower bound of the module docstring for `trace` on `fleet`."""
    policy: InstanceTypePolicy = fleet.cloud.instance_type_policy
    all_kinds = kinds(fleet)
    runtime: dict[tuple[object, ...], int] = {}
    needs: dict[tuple[object, ...], Requirements] = {}
    for c in trace.containers:
        if c.priority <= 0:
            continue  # held: no controller runs it
        key = _key(c.resources)
        if key not in needs:
            needs[key] = effective_requirements(c.resources, policy)
        runtime[key] = runtime.get(key, 0) + c.runtime
    fitting = {key: [k for k in all_kinds if k.fits(need)] for key, need in needs.items()}
    unplaceable = sum(
        1 for c in trace.containers if c.priority > 0 and not fitting[_key(c.resources)]
    )
    best_work = 0.0
    for cpu_w, gpu_w in itertools.product(_CPU_WEIGHTS, _GPU_WEIGHTS):
        total = 0.0
        for key, fits in fitting.items():
            if not fits:
                continue
            rate = min(
                k.price * k.share(needs[key], gpu_w if k.capacity[3] else cpu_w) for k in fits
            )
            total += rate * runtime[key] / _HOUR
        best_work = max(best_work, total)
    boots = 0.0
    claimed: set[str] = set()
    candidates = []
    for key, fits in fitting.items():
        if not fits or any(k.initially_on for k in fits):
            continue
        cheapest = min(k.price * k.boot for k in fits) / _HOUR
        candidates.append((cheapest, key, {k.name for k in fits}))
    candidates.sort(key=lambda item: (-item[0], repr(item[1])))
    for cheapest, _, names in candidates:
        if claimed.isdisjoint(names):
            claimed |= names
            boots += cheapest
    return OracleBound(cost=best_work + boots, work=best_work, boots=boots, unplaceable=unplaceable)


def _key(r: ContainerResources) -> tuple[object, ...]:
    return (r.vcpus, r.ram, r.scratch, r.gpus, r.gpu_model, r.preemptible)


# -- brute force ----------------------------------------------------------------------------


def _partitions(items: list[int]) -> Iterator[list[list[int]]]:
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in _partitions(rest):
        for i in range(len(part)):
            yield [*part[:i], [first, *part[i]], *part[i + 1 :]]
        yield [[first], *part]


def _block_cost(
    kind: Kind,
    jobs: list[tuple[int, int, Requirements]],
    period: int,
    minimum: int,
) -> float | None:
    """Cheapest way one node of `kind` runs `jobs` (start, end, need); None if infeasible."""
    for start, _, _ in jobs:
        active = [need for s, e, need in jobs if s <= start < e]
        if (
            sum(n.vcpus for n in active) > kind.capacity[0]
            or sum(n.ram for n in active) > kind.capacity[1]
            or sum(n.scratch for n in active) > kind.capacity[2]
            or sum(n.gpus for n in active) > kind.capacity[3]
        ):
            return None
    busy: list[list[int]] = []
    for s, e, _ in sorted(jobs, key=lambda j: j[0]):
        if busy and s <= busy[-1][1]:
            busy[-1][1] = max(busy[-1][1], e)
        else:
            busy.append([s, e])
    best: float | None = None
    for cuts in itertools.product((False, True), repeat=len(busy) - 1):
        periods: list[tuple[int, int]] = []
        begin = busy[0][0]
        for i, cut in enumerate(cuts):
            if cut:
                periods.append((begin, busy[i][1]))
                begin = busy[i + 1][0]
        periods.append((begin, busy[-1][1]))
        cost = _periods_cost(kind, periods, period, minimum)
        if cost is not None and (best is None or cost < best):
            best = cost
    return best


def _periods_cost(
    kind: Kind, periods: list[tuple[int, int]], period: int, minimum: int
) -> float | None:
    total = 0
    free_from = 0  # the node is off (and may boot) from here
    for index, (first, last) in enumerate(periods):
        final = index == len(periods) - 1
        on_at = first - kind.boot
        if index == 0 and kind.initially_on:
            on_at = 0  # already on: no boot, on since the start
        elif on_at < free_from:
            return None
        off_at = last if final else last + kind.shutdown
        life = off_at - on_at
        total += billed_us(life, period, minimum) if kind.vm else life
        free_from = off_at
    return kind.price * total / _HOUR


def brute_force_optimum(
    trace: Trace, fleet: Fleet, grid_seconds: float, slack_seconds: float
) -> float:
    """The exact optimum of the small cost model for a tiny trace (a few containers).

    Containers start at arrival + i x grid (up to `slack_seconds` late); any grouping of
    containers on nodes (VM types any number of times, each side node once); each node's
    busy periods are joined or separated by a switch-off in every possible way (a
    switch-off costs the shutdown delay and a new boot). Initially-on side nodes cost
    their shutdown delay when unused (switched off at once). A node's last period ends
    with its last container. Billing as in the simulation (VMs: period and minimum).
    """
    policy = fleet.cloud.instance_type_policy
    period = to_us(fleet.cloud.billing.period)
    minimum = to_us(fleet.cloud.billing.minimum)
    all_kinds = kinds(fleet)
    jobs = [
        (c.arrival, c.runtime, effective_requirements(c.resources, policy))
        for c in trace.containers
        if c.priority > 0
    ]
    unused_on = {k.name: k.price * k.shutdown / _HOUR for k in all_kinds if k.initially_on}
    grid = round(grid_seconds * 1_000_000)
    steps = int(slack_seconds // grid_seconds) + 1
    options = [[a + i * grid for i in range(steps)] for a, _, _ in jobs]
    best = math.inf
    for starts in itertools.product(*options):
        placed = [(s, s + jobs[i][1], jobs[i][2]) for i, s in enumerate(starts)]
        for blocks in _partitions(list(range(len(placed)))):
            best = min(best, _assign(blocks, placed, all_kinds, period, minimum, unused_on))
    return best


def _assign(
    blocks: list[list[int]],
    placed: list[tuple[int, int, Requirements]],
    all_kinds: list[Kind],
    period: int,
    minimum: int,
    unused_on: dict[str, float],
) -> float:
    """Cheapest kind for each block (side nodes at most once)."""
    costs: list[dict[str, float]] = []
    for block in blocks:
        jobs = [placed[i] for i in block]
        options: dict[str, float] = {}
        for kind in all_kinds:
            if all(kind.fits(need) for _, _, need in jobs):
                cost = _block_cost(kind, jobs, period, minimum)
                if cost is not None:
                    options[kind.name] = cost
        if not options:
            return math.inf
        costs.append(options)
    side = {k.name for k in all_kinds if not k.vm}
    best = math.inf
    for choice in itertools.product(*[sorted(o.items()) for o in costs]):
        names = [n for n, _ in choice]
        used_side = [n for n in names if n in side]
        if len(used_side) != len(set(used_side)):
            continue
        total = sum(c for _, c in choice)
        total += sum(v for n, v in unused_on.items() if n not in used_side)
        best = min(best, total)
    return best
