#!/usr/bin/env python3
"""Benchmark: the pure scheduler plans 10,000 queued containers over 2,000 nodes and 50 types.

Prints the median and best wall time of `plan()` over several runs (one core; nothing else
in the process). Target from issue 5: <= 500 ms.

    .venv/bin/python benchmarks/bench_scheduler.py [--containers N] [--nodes N] [--types N]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from nodewarden.api.containerdispatch import ContainerResources
from nodewarden.scheduling.instancetypes import Catalogue, InstanceType, InstanceTypePolicy
from nodewarden.scheduling.scheduler import plan
from nodewarden.scheduling.views import (
    Capacity,
    CloudState,
    ContainerView,
    Limits,
    NodeState,
    NodeView,
    Phase,
)

GI = 2**30


def build(n_containers: int, n_nodes: int, n_types: int, seed: int = 7):  # type: ignore[no-untyped-def]
    rng = random.Random(seed)
    types = []
    for i in range(n_types):
        vcpus = 2 ** rng.randint(1, 6)
        gpus = rng.choice([0, 0, 0, 1, 4])
        types.append(
            InstanceType(
                name=f"type-{i:02d}",
                provider_type=f"p{i}",
                vcpus=vcpus,
                ram=vcpus * rng.choice([2, 4, 8]) * GI,
                scratch=rng.choice([0, 100, 500]) * GI,
                gpus=gpus,
                gpu_model="a10" if gpus else None,
                price=round(vcpus * 0.04 + gpus * 0.9 + rng.random() * 0.05, 4),
                preemptible=rng.random() < 0.2,
            )
        )
    catalogue = Catalogue(types=tuple(types))
    now = datetime(2026, 11, 30, tzinfo=UTC)
    nodes = []
    states = [NodeState.IDLE, NodeState.ACTIVE, NodeState.ACTIVE, NodeState.BOOTING]
    for i in range(n_nodes):
        t = rng.choice(types)
        state = rng.choice(states)
        nodes.append(
            NodeView(
                name=f"node-{i:05d}",
                state=state,
                capacity=Capacity.of(t),
                instance_type=t.name,
                price=t.price,
                ready=state in (NodeState.IDLE, NodeState.ACTIVE),
            )
        )
    shapes = [
        ContainerResources(vcpus=v, ram=f"{r}Gi", scratch=f"{s}Gi", gpus=g, preemptible=p)
        for v, r, s, g, p in [
            (1, 1, 0, 0, False),
            (2, 4, 10, 0, False),
            (4, 8, 50, 0, False),
            (8, 30, 0, 0, False),
            (2, 8, 0, 1, False),
            (1, 2, 0, 0, True),
            (16, 60, 100, 0, False),
            (4, 16, 0, 0, True),
        ]
    ]
    containers = [
        ContainerView(
            uuid=f"zzzzz-dz642-{i:015d}",
            phase=Phase.QUEUED,
            priority=rng.randint(1, 1000),
            first_seen=now - timedelta(seconds=rng.randint(0, 3600)),
            resources=rng.choice(shapes),
        )
        for i in range(n_containers)
    ]
    return containers, nodes, catalogue, now


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--containers", type=int, default=10_000)
    parser.add_argument("--nodes", type=int, default=2_000)
    parser.add_argument("--types", type=int, default=50)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    containers, nodes, catalogue, now = build(args.containers, args.nodes, args.types)
    policy = InstanceTypePolicy()
    limits = Limits(max_nodes=5_000)
    times = []
    result = None
    for _ in range(args.runs):
        t0 = time.perf_counter()
        result = plan(containers, nodes, catalogue, policy, limits, CloudState(), now)
        times.append(time.perf_counter() - t0)
    assert result is not None
    print(f"scheduler: {args.containers} queued containers, {args.nodes} nodes, {args.types} types")
    print(
        f"  plan() median {statistics.median(times) * 1000:.0f} ms, best {min(times) * 1000:.0f} ms "
        f"over {args.runs} runs (target <= 500 ms)"
    )
    print(
        f"  outcome: {len(result.starts)} starts, {len(result.creates)} creates, "
        f"{len(result.waits)} waiting, {len(result.unsatisfiable)} unsatisfiable"
    )


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
    from calibration import summary  # the machine figure this run compares through

    print(summary(), flush=True)
    main()
