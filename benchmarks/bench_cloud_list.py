#!/usr/bin/env python3
"""Benchmark: decoding one cloud list of 8,000 instances, and what it does to the event loop.

The decode is the one a list of the stub cloud's HTTP API goes through: the JSON body
(`json.loads`), each VM into a libcloud `Node` (`wire.vm_from_json` + `to_node`) and each
`Node` into a `CloudInstance` (`LibcloudInstanceSet._to_instance`). It runs four ways
while a ticker task on the event loop wakes every millisecond and records the longest
gap between its wake-ups (the stall the feed, the power controller and the Lease see):

- `loop`: all of it on the event loop, in one go (the cost, and the stall, of doing
  nothing clever);
- `thread`: all of it in a worker thread (`run_in_executor` on a thread pool): the
  thread holds the GIL for most of it, the loop gets it back at each switch interval;
- `process`: all of it in a worker process (`ProcessPoolExecutor`), the `CloudInstance`
  list pickled back (unpickled on the executor's result thread, which takes the GIL);
- `process+diff`: in the worker process, and only the instances that changed since the
  previous list come back (here 1 % of them changed, every other list);
- `product`: what `cloud/listproc.py` does: `process+diff`, then the operator applies
  the changes to its view and re-stamps every instance with the list time (a
  `model_copy` each, yielding to the loop every `RESTAMP_CHUNK`).

Printed per way: wall time of the decode, CPU of this process, the max and p99 loop
stall, then the calibration figure (e2e/calibration.py) and the load average.
Nothing is asserted.

    .venv/bin/python benchmarks/bench_cloud_list.py [--instances 8000] [--runs 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from nodewarden.cloud.libcloudset import LibcloudInstanceSet
from nodewarden.cloud.listproc import RESTAMP_CHUNK
from nodewarden.cloud.model import CloudInstance
from nodewarden.cloud.tags import TagKeys
from nodewarden.scheduling.instancetypes import InstanceType
from nodewarden_doubles.stubcloud import wire
from nodewarden_doubles.stubcloud.driver import StubNodeDriver, to_node

TICK = 0.001
CATALOGUE = [
    InstanceType(name=f"t{i}", provider_type=f"p{i}", vcpus=4, ram=8 * 2**30, price=0.1 * i)
    for i in range(1, 6)
]
_decoder: LibcloudInstanceSet | None = None


def list_body(count: int, changed: int = 0) -> bytes:
    """The stub API's answer to a list of `count` VMs (`changed` of them re-tagged)."""
    keys = TagKeys()
    created = datetime(2026, 12, 1, tzinfo=UTC)
    vms = []
    for i in range(count):
        probe = created + timedelta(minutes=1 if i < changed else 0)
        vms.append(
            {
                "id": f"i-{i:08x}",
                "name": f"node-{i}",
                "size": f"p{1 + i % 5}",
                "image": "img-1",
                "tags": {
                    keys.dispatcher: "dispatcher-a",
                    keys.node: f"node-{i}",
                    keys.instance_type: f"t{1 + i % 5}",
                    keys.secret_digest: "ab" * 32,
                    keys.last_probe: probe.isoformat(),
                    keys.idle_behavior: "run",
                },
                "private_ip": f"198.18.{i // 250}.{i % 250}",
                "created_at": created.isoformat(),
                "state": "running",
                "price": 0.1,
            }
        )
    return json.dumps({"instances": vms}).encode()


def _instance_set() -> LibcloudInstanceSet:
    global _decoder
    if _decoder is None:
        _decoder = LibcloudInstanceSet(
            lambda: StubNodeDriver("key", "secret"),
            image="img-1",
            catalogue=CATALOGUE,
            tag_keys=TagKeys(),
            max_threads=1,
        )
    return _decoder


def decode(body: bytes) -> list[CloudInstance]:
    """The whole decode of one list body (module docstring)."""
    decoder = _instance_set()
    driver = decoder._driver()
    now = datetime.now(UTC)
    answer = json.loads(body)
    nodes = [to_node(driver, wire.vm_from_json(vm)) for vm in answer["instances"]]
    return [decoder._to_instance(node, now) for node in nodes]


_previous: dict[str, tuple[Any, ...]] = {}


def decode_changes(body: bytes) -> list[CloudInstance]:
    """`decode`, returning only instances new or changed since this process's last call."""
    out = []
    for inst in decode(body):
        key = (inst.state, tuple(sorted(inst.tags.items())), inst.private_ips)
        if _previous.get(inst.id) != key:
            _previous[inst.id] = key
            out.append(inst)
    return out


async def ticker(stop: asyncio.Event, gaps: list[float]) -> None:
    loop = asyncio.get_running_loop()
    last = loop.time()
    while not stop.is_set():
        await asyncio.sleep(TICK)
        now = loop.time()
        gaps.append(now - last - TICK)
        last = now


async def measure(
    name: str, run: Callable[[], Any], runs: int
) -> tuple[str, float, float, float, float, int]:
    walls, cpus, worst, p99s = [], [], [], []
    count = 0
    for _ in range(runs):
        stop = asyncio.Event()
        gaps: list[float] = []
        tick = asyncio.ensure_future(ticker(stop, gaps))
        await asyncio.sleep(0.05)
        gaps.clear()
        cpu0, t0 = time.process_time(), time.perf_counter()
        result = await run()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - cpu0)
        count = len(result)
        await asyncio.sleep(0.02)
        stop.set()
        await tick
        worst.append(max(gaps))
        p99s.append(sorted(gaps)[int(0.99 * (len(gaps) - 1))])
    return (
        name,
        statistics.median(walls),
        statistics.median(cpus),
        statistics.median(worst),
        statistics.median(p99s),
        count,
    )


async def main_async(args: argparse.Namespace) -> None:
    body = list_body(args.instances)
    changed_body = list_body(args.instances, changed=args.instances // 100)
    print(f"list body: {args.instances} instances, {len(body) / 1e6:.1f} MB of JSON")
    loop = asyncio.get_running_loop()
    threads: Executor = ThreadPoolExecutor(max_workers=1)
    processes: Executor = ProcessPoolExecutor(max_workers=1)
    await loop.run_in_executor(processes, decode, body)  # start the worker, warm it
    await loop.run_in_executor(processes, decode_changes, body)
    decode(body)  # warm this process too

    async def on_loop() -> list[CloudInstance]:
        return decode(body)

    async def in_thread() -> list[CloudInstance]:
        return await loop.run_in_executor(threads, decode, body)

    async def in_process() -> list[CloudInstance]:
        return await loop.run_in_executor(processes, decode, body)

    flip = [False]

    async def in_process_diff() -> list[CloudInstance]:
        flip[0] = not flip[0]
        return await loop.run_in_executor(
            processes, decode_changes, changed_body if flip[0] else body
        )

    view: dict[str, CloudInstance] = {i.id: i for i in decode(body)}  # the operator's view

    async def product() -> list[CloudInstance]:
        changes = await in_process_diff()
        for inst in changes:
            view[inst.id] = inst
        stamp = {"observed_at": datetime.now(UTC)}
        out = []
        for n, inst in enumerate(list(view.values()), 1):
            out.append(inst.model_copy(update=stamp))
            if n % RESTAMP_CHUNK == 0:
                await asyncio.sleep(0)
        return out

    rows = [
        await measure("loop", on_loop, args.runs),
        await measure("thread", in_thread, args.runs),
        await measure("process", in_process, args.runs),
        await measure("process+diff", in_process_diff, args.runs),
        await measure("product", product, args.runs),
    ]
    print(
        f"{'way':<14}{'wall ms':>9}{'cpu ms':>9}{'max stall ms':>14}{'p99 stall ms':>14}{'back':>7}"
    )
    for name, wall, cpu, worst, p99, count in rows:
        print(
            f"{name:<14}{wall * 1e3:>9.0f}{cpu * 1e3:>9.0f}{worst * 1e3:>14.1f}"
            f"{p99 * 1e3:>14.1f}{count:>7}"
        )
    threads.shutdown()
    processes.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=8000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(main_async(args))
    print(load())


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
    from calibration import load, summary  # the machine figure this run compares through

    print(summary(), flush=True)
    main()
