#!/usr/bin/env python3
"""Benchmark: one node step of the power controller with 20,000 PowerIntents in its book.

The live `PowerController` (in-process, with an API-server stand-in that answers every
write at once, no BMC: Wake-on-LAN side nodes whose power is not observed) holds
`--nodes` WorkerNodes and `--per-node` finished PowerIntents per node (7 of 10 a
person's, the audit records, 3 policy-made), delivered the way the watch delivers them.
Each timed node step is `PowerController._process` of one node with an Evaluate event:
the state machine's step, the intent lookups (`IntentBook.active` / `waiting`) and what
the step applies. Before issue 19 each lookup scanned every intent of the book.

Printed: node-step time p50 / p99 / mean (wall and CPU of this thread) over `--steps`
steps spread over the fleet, the time one full scan of the book takes for comparison
(what each of a step's three lookups cost before), the calibration figure (e2e/calibration.py) and the load average.
Target (issue 19): a node step <= 1 ms. Figures are printed; nothing is asserted.

    .venv/bin/python benchmarks/bench_intents.py [--nodes 2000] [--per-node 10] [--steps 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from nodewarden.credentials.bmcidentity import BmcRegistry
from nodewarden.fleet.board import PowerBoard
from nodewarden.fleet.policies import PolicyBook
from nodewarden.fleet.status import NodeStatusWriter
from nodewarden.ownership import DISPATCHER_LABEL
from nodewarden.policy.events import Evaluate
from nodewarden.power.control import PowerControl
from nodewarden.power.controller import PowerController
from nodewarden.power.runtime import ControllerSettings

NOW = datetime.now(UTC)


class InstantApi:
    """Stands in for the API server: every write succeeds at once."""

    async def patch_status(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {}

    async def patch(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {}

    async def create(self, kind: Any, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return body

    async def delete(self, *args: Any, **kwargs: Any) -> bool:
        return True

    async def list(self, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        return []

    async def emit_event(self, *args: Any, **kwargs: Any) -> None:
        return None


class NoRefusals:
    """The credential resolver's answer for nodes whose endpoints are all admitted (and
    its BMC claim registry, which a Wake-on-LAN node never enters)."""

    def __init__(self) -> None:
        self.bmc_claims = BmcRegistry()

    async def check(self, name: str, spec: Any) -> list[Any]:
        return []


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f} ({os.cpu_count()} cpus)"


def node_body(name: str) -> dict[str, Any]:
    return {
        # labelled as this dispatcher's: an unlabelled side node is only claimed (a label
        # write), never stepped, until the label comes back through the watch
        "metadata": {
            "name": name,
            "namespace": "ns",
            "generation": 1,
            "labels": {DISPATCHER_LABEL: "bench"},
        },
        "spec": {
            "nodeType": "SideNode",
            "controlMethod": "WakeOnLan",
            "capacity": {"vcpus": 4, "ram": "8Gi"},
            "wakeOnLan": {"mac": "0a:1b:2c:3d:4e:5f", "broadcastAddress": "127.0.0.1"},
        },
    }


def intent_body(name: str, node: str, source: str, at: datetime) -> dict[str, Any]:
    stamp = at.isoformat().replace("+00:00", "Z")
    return {
        "metadata": {"name": name, "creationTimestamp": stamp},
        "spec": {
            "nodeName": node,
            "action": "Shutdown",
            "source": source,
            "requestedBy": "alice" if source == "Manual" else "nodewarden/bench",
            "reason": "bench",
        },
        "status": {"phase": "Succeeded", "finishedAt": stamp},
    }


def build(nodes: int, per_node: int) -> PowerController:
    api: Any = InstantApi()
    controller = PowerController(
        kube=api,
        namespace="ns",
        dispatcher_id="bench",
        default_policy="default",
        credentials=NoRefusals(),  # type: ignore[arg-type]
        policies=PolicyBook(namespace="ns", default_name="default"),
        pool=None,
        board=PowerBoard(),
        status=NodeStatusWriter(api, "ns"),
        control=PowerControl(None, None, None, lambda: datetime.now(UTC)),  # type: ignore[arg-type]
        settings=ControllerSettings(keep_finished_intents=per_node),
        clock=lambda: datetime.now(UTC),
    )
    for n in range(nodes):
        node = f"node-{n}"
        controller.observe_node(node_body(node))
        for k in range(per_node):
            source = "Manual" if k < per_node * 7 // 10 else "Policy"
            at = NOW - timedelta(days=30, minutes=k)
            controller.observe_intent(intent_body(f"{node}-{k}", node, source, at))
    return controller


async def run(args: argparse.Namespace) -> None:
    controller = build(args.nodes, args.per_node)
    names = list(controller.nodes)
    for name in names:  # the first step of every node (loads its state), untimed
        await controller._process(controller.nodes[name], datetime.now(UTC))
    await asyncio.sleep(0)
    walls: list[float] = []
    cpus: list[float] = []
    for i in range(args.steps):
        rt = controller.nodes[names[(i * 7919) % len(names)]]
        rt.events.append(Evaluate())
        now = datetime.now(UTC)
        wall, cpu = time.perf_counter(), time.thread_time()
        await controller._process(rt, now)
        cpus.append(time.thread_time() - cpu)
        walls.append(time.perf_counter() - wall)
        if i % 100 == 0:
            await asyncio.sleep(0)  # let the spawned writes finish
    book = controller.intents
    scan_start = time.perf_counter()
    for name in names[:200]:
        [i for i in book.intents.values() if i.node == name and i.source == "Manual"]
    scan = (time.perf_counter() - scan_start) / 200

    def ms(values: list[float], q: float) -> float:
        return statistics.quantiles(values, n=100)[int(q) - 1] * 1000

    print(
        f"{len(names)} WorkerNodes, {len(book.intents)} PowerIntents in the book, "
        f"{args.steps} node steps"
    )
    print(
        f"node step wall: p50 {ms(walls, 50):.3f} ms, p99 {ms(walls, 99):.3f} ms, "
        f"mean {statistics.fmean(walls) * 1000:.3f} ms"
    )
    print(
        f"node step CPU:  p50 {ms(cpus, 50):.3f} ms, p99 {ms(cpus, 99):.3f} ms, "
        f"mean {statistics.fmean(cpus) * 1000:.3f} ms"
    )
    print(f"one full scan of the book (each of a step's 3 lookups before): {scan * 1000:.3f} ms")
    verdict = "met" if ms(walls, 50) <= 1.0 else "NOT met"
    print(f"target node step <= 1 ms (p50 wall): {verdict}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--per-node", type=int, default=10)
    parser.add_argument("--steps", type=int, default=2000)
    args = parser.parse_args()
    asyncio.run(run(args))
    print(load())


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
    from calibration import summary  # the machine figure this run compares through

    print(summary(), flush=True)
    main()
