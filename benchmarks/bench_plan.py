#!/usr/bin/env python3
"""Benchmark: the dispatcher's plan of 5,000 waiting containers on 1,000 nodes, and its
idle tick, in process (the in-memory fakes of tests/dispatch/inproc, fake clock).

Every node (a 2-vCPU VM) runs one container that fills it and no create may go, so every
queued container waits: the plan still reads the whole queue. Prints CPU milliseconds
(median and best over `--runs`) of

- `Planner.plan()`: the capacity ledger, the node views and the pure scheduler;
- a planning tick (`Dispatcher.step()` forced to plan: reconcile, cancellations, plan,
  execute with nothing new to write, statuses, metrics, the hand-over);
- an idle tick (`Dispatcher.step()` with nothing changed: what stays per tick -- the
  reconcile of runners with containers, the cancellation scan, the plan marks);

with the calibration figure and the load average next to them.

    .venv/bin/python benchmarks/bench_plan.py [--containers 5000] [--nodes 1000] [--runs 7]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests" / "dispatch" / "inproc"), str(REPO / "e2e")]

from fakes import ME, SMALL, Rig, container, uuid_of  # noqa: E402

from nodewarden.dispatch.replan import PlanMarks  # noqa: E402


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f} ({os.cpu_count()} cpus)"


async def build(n_containers: int, n_nodes: int) -> Rig:
    """`n_nodes` VMs each full with a Running container, `n_containers` queued behind them,
    creates blocked; settled (the waits written) before anything is measured."""
    rig = Rig([SMALL])
    for i in range(n_nodes):
        vm = rig.vm(f"vm-{i:05d}")
        name = f"r{i}"
        vm.runners[uuid_of(name)] = 1000 + i
        vm.runner_vcpus[uuid_of(name)] = 2
        running = {"phase": "Running", "node": vm.name, "lockedBy": ME, "attempts": 1}
        rig.api.create(container(name, vcpus=2, ram="2Gi", status=running))
    for i in range(n_containers):
        rig.api.create(container(f"q{i}", priority=1 + i % 500))
    rig.cloud.at_capacity = {SMALL.name}
    await rig.start()
    for _ in range(10):
        before = rig.dispatcher.ctx.plans
        await rig.round()
        if rig.dispatcher.ctx.plans == before:
            break
    return rig


async def cpu_ms(runs: int, once: Callable[[], Awaitable[object]]) -> tuple[float, float]:
    """Median and best CPU milliseconds of `once()`."""
    times = []
    for _ in range(runs):
        t0 = time.process_time()
        await once()
        times.append((time.process_time() - t0) * 1000)
    return statistics.median(times), min(times)


async def run(n_containers: int, n_nodes: int, runs: int) -> None:
    t0 = time.process_time()
    rig = await build(n_containers, n_nodes)
    built = time.process_time() - t0
    d = rig.dispatcher
    planner = d.planner

    async def plan_only() -> object:
        return planner.plan(rig.clock())

    async def planning_tick() -> None:
        d.ctx.marks = PlanMarks(-1, -1, -1, -1, (), None, None, False)  # forces a plan
        rig.clock.advance(1)
        await d.step()
        await rig.settle()

    async def idle_tick() -> None:
        rig.clock.advance(1)
        await d.step()
        await rig.settle()

    result = planner.plan(rig.clock())
    waiting = len(result.waits) + len(d.ctx.held_back)
    plan_med, plan_best = await cpu_ms(runs, plan_only)
    writes = len(rig.api.status_writes)
    tick_med, tick_best = await cpu_ms(runs, planning_tick)
    plans = d.ctx.plans
    idle_med, idle_best = await cpu_ms(runs, idle_tick)
    assert d.ctx.plans == plans, "an idle tick planned"
    assert len(rig.api.status_writes) == writes, "a tick wrote"
    print(
        f"dispatcher plan: {n_containers:,} queued containers ({waiting:,} waiting), "
        f"{n_nodes:,} nodes each running one container; set-up {built:.1f} s CPU"
    )
    print(f"  Planner.plan()  median {plan_med:.0f} ms, best {plan_best:.0f} ms CPU ({runs} runs)")
    print(f"  planning tick   median {tick_med:.0f} ms, best {tick_best:.0f} ms CPU")
    print(f"  idle tick       median {idle_med:.1f} ms, best {idle_best:.1f} ms CPU (no plan)")
    print(f"  {load()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--containers", type=int, default=5_000)
    parser.add_argument("--nodes", type=int, default=1_000)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    asyncio.run(run(args.containers, args.nodes, args.runs))


if __name__ == "__main__":
    from calibration import measure, summary  # the machine figure this run compares through

    print(summary(), flush=True)
    # the figure above is cached per boot; the machine's speed now may differ
    print(f"calibration measured now: {measure():.2f} s", flush=True)
    main()
