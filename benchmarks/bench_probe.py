"""Probe-sweep benchmark: one SshProber probing N stub VMs (default 1,000) over real SSH on 127.0.0.1.

The stub workers run in a child process so the figures for the operator side (this
process) are not mixed with the fake nodes' CPU. Sweeps:

1. unthrottled, cold — every probe opens its connection (TCP + SSH handshake + login);
2. unthrottled, warm — the kept-alive connections are reused;
3. unthrottled, warm, full probe — ready + runners + inhibitors + telemetry;
4. at the default throttle (10 probes/s, as Arvados), warm.

Prints seconds per sweep, probes/s, operator CPU seconds (and cores used) and RSS.
Usage: .venv/bin/python benchmarks/bench_probe.py [--nodes 1000] [--rate 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))

from nodewarden.ssh import (
    DEFAULT_MAX_PROBES_PER_SECOND,
    KnownHostKeys,
    ProbeThrottle,
    SshClientKey,
    SshProber,
    SshTarget,
)
from nodewarden_doubles.stubworker import StubWorker, StubWorkerConfig


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


# ------------------------------------------------------------------ child: the fake fleet


async def serve(nodes: int, public_key: str) -> None:
    workers = [
        StubWorker(StubWorkerConfig(authorized_keys=(public_key,), name=f"vm-{i}", seed=i))
        for i in range(nodes)
    ]
    ports = await asyncio.gather(*(w.start() for w in workers))
    keys = [w.host_public_key for w in workers]
    print(json.dumps({"ports": ports, "host_keys": keys}), flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)  # until the parent closes our stdin
    await asyncio.gather(*(w.stop() for w in workers))
    cpu = time.process_time()
    print(json.dumps({"child_cpu_s": cpu, "child_maxrss_mb": _status_kb("VmHWM") / 1024}))


# ------------------------------------------------------------------ parent: the operator


@dataclass
class Sweep:
    name: str
    probes: int
    seconds: float
    cpu_seconds: float
    rss_mb: float
    failures: int

    def row(self) -> str:
        return (
            f"{self.name:<34} {self.probes:>6} {self.seconds:>8.2f} "
            f"{self.probes / self.seconds:>9.1f} {self.cpu_seconds:>8.2f} "
            f"{self.cpu_seconds / self.seconds:>6.2f} {self.rss_mb:>8.1f} {self.failures:>5}"
        )


async def sweep(name: str, prober: SshProber, targets: list[SshTarget], **probe_args: Any) -> Sweep:
    cpu0, t0 = time.process_time(), time.perf_counter()
    results = await asyncio.gather(
        *(prober.probe(t, **probe_args) for t in targets), return_exceptions=True
    )
    seconds = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    failures = [r for r in results if isinstance(r, BaseException)]
    if failures:
        print(f"  {name}: {len(failures)} failures, first: {failures[0]!r}", file=sys.stderr)
    return Sweep(name, len(targets), seconds, cpu, _status_kb("VmRSS") / 1024, len(failures))


async def run(nodes: int, rate: float, throttled_nodes: int) -> None:
    logging.basicConfig(level=logging.WARNING)
    client_key = SshClientKey.generate()
    child = subprocess.Popen(  # noqa: ASYNC220 - started once, before any probing
        [sys.executable, __file__, "--serve", str(nodes), "--pubkey", client_key.public_key],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdin is not None and child.stdout is not None
    fleet = json.loads(child.stdout.readline())
    targets = [
        SshTarget(
            node=f"vm-{i}",
            host="127.0.0.1",
            port=port,
            client_key=client_key,
            trust=KnownHostKeys.for_key("127.0.0.1", port, key),
        )
        for i, (port, key) in enumerate(zip(fleet["ports"], fleet["host_keys"], strict=True))
    ]
    rss_start = _status_kb("VmRSS") / 1024
    prober = SshProber(throttle=ProbeThrottle(0))
    results = [
        await sweep("unthrottled, cold (connect+login)", prober, targets),
        await sweep("unthrottled, warm", prober, targets),
        await sweep(
            "unthrottled, warm, full probe", prober, targets, inhibitors=True, telemetry=True
        ),
    ]
    prober.throttle = ProbeThrottle(rate)
    results.append(await sweep(f"throttled {rate:g}/s, warm", prober, targets[:throttled_nodes]))
    stats = prober.stats
    await prober.aclose()
    child.stdin.close()
    child_figures = json.loads(child.stdout.readline() or "{}")
    child.wait(timeout=60)

    print(f"\nprobe sweep over {nodes} stub VMs (real SSH on 127.0.0.1, fleet in a child process)")
    print(
        f"{'sweep':<34} {'probes':>6} {'seconds':>8} {'probes/s':>9} {'cpu s':>8} {'cores':>6} {'rss MB':>8} {'fail':>5}"
    )
    for result in results:
        print(result.row())
    print(
        f"\noperator RSS: {rss_start:.1f} MB before connecting, "
        f"peak {_status_kb('VmHWM') / 1024:.1f} MB; "
        f"ru_maxrss {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.1f} MB"
    )
    print(
        f"prober: {stats.connects} connects, {stats.commands} commands, "
        f"{stats.command_timeouts} timeouts, {stats.stale_reconnects} stale reconnects"
    )
    if child_figures:
        print(
            f"stub fleet (child): {child_figures['child_cpu_s']:.1f} s CPU in total, "
            f"peak RSS {child_figures['child_maxrss_mb']:.1f} MB"
        )
    print(
        f"target: {nodes} nodes probed in <= 10 s -> unthrottled warm sweep "
        f"{results[1].seconds:.2f} s, cold {results[0].seconds:.2f} s; at the default "
        f"throttle one sweep takes at least {nodes / rate:.0f} s by design"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=DEFAULT_MAX_PROBES_PER_SECOND)
    parser.add_argument(
        "--throttled-nodes",
        type=int,
        default=None,
        help="how many nodes the throttled sweep probes (default: all)",
    )
    parser.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--pubkey", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        asyncio.run(serve(args.serve, args.pubkey))
        return
    throttled = args.throttled_nodes if args.throttled_nodes is not None else args.nodes
    asyncio.run(run(args.nodes, args.rate, throttled))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
    from calibration import summary  # the machine figure this run compares through

    print(summary(), flush=True)
    main()
