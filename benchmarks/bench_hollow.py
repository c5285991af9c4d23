"""Hollow-fleet benchmark (issue 24 item 4): the operator's real prober and power control over
N hollow nodes (default 5,000) in this process. SSH/TLS EXCLUDED: no TCP, no SSH handshake,
no HTTPS; the hollow model's own CPU is included (it is small: a dict lookup and a string
per command).

Sweeps, each timed in wall seconds and this process's CPU seconds:

1. probe, cold: every node's first probe (ready + runner list; the hollow "connect");
2. probe, warm: the same again over kept connections;
3. BMC read, cold: every side node's first PowerState read (client made, system discovered);
4. BMC read, warm: one more read each (the poll at rest);
5. streams at rest: one ``RUNNER --watch`` per node for `--rest` seconds, nothing changing:
   CPU per node-minute (heartbeats only).

Usage: .venv/bin/python benchmarks/bench_hollow.py [--nodes 5000] [--rest 20] [--heartbeat 10]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))

from pydantic import SecretStr

from nodewarden.api.workernode import WorkerNodeSpec
from nodewarden.credentials import CredentialResolver
from nodewarden.credentials.settings import CredentialsConfig
from nodewarden.power.control import NodeRef, PowerControl
from nodewarden.ssh import ProbeThrottle, SshClientKey, SshProber, SshTarget
from nodewarden.ssh.credentials import InstanceSecretTrust
from nodewarden_doubles.hollow import (
    HollowBmcSecrets,
    HollowDialer,
    HollowFleet,
    side_node_spec,
)
from nodewarden_doubles.hollow.bmc import bmc_transports


def spec(name: str) -> WorkerNodeSpec:
    return side_node_spec(name)


async def timed(
    label: str, count: int, jobs: Callable[[], list[Awaitable[object]]], width: int = 500
) -> None:
    """Run the jobs `width` at a time; print wall s, CPU s and CPU ms per job."""
    wall, cpu = time.perf_counter(), time.process_time()
    batch = jobs()
    for start in range(0, len(batch), width):
        await asyncio.gather(*batch[start : start + width])
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    print(f"{label:<28} {count:>7} {wall:>8.2f} {cpu:>8.2f} {1000 * cpu / count:>10.3f}")


async def run(nodes: int, rest: float, heartbeat: float) -> None:
    logging.basicConfig(level=logging.WARNING)
    names = [f"node-{i:05d}" for i in range(nodes)]
    fleet = HollowFleet()
    fleet.add(names)
    key = SshClientKey.generate()
    trust = InstanceSecretTrust(SecretStr("s" * 16))
    targets = [SshTarget(n, "127.0.0.1", key, trust) for n in names]
    prober = SshProber(throttle=ProbeThrottle(0), dialer=HollowDialer(fleet, actor="bench"))
    resolver = CredentialResolver(
        HollowBmcSecrets(),
        "ns",
        CredentialsConfig(bmc_endpoints=["127.0.0.1:9"], secret_ttl="300s"),
    )
    power = PowerControl(
        resolver,
        None,
        None,
        lambda: datetime.now(tz=UTC),
        observation_concurrency=500,
        user_agent="nodewarden/0.1.0 (power; dispatcher=bench; replica=bench)",
        bmc_transport=bmc_transports(fleet),
    )
    refs = [NodeRef(n, spec(n)) for n in names]
    print(f"\nhollow fleet: {nodes} nodes in this process -- SSH/TLS excluded")
    print(f"{'sweep':<28} {'ops':>7} {'wall s':>8} {'cpu s':>8} {'cpu ms/op':>10}")
    try:
        await timed("probe, cold", nodes, lambda: [prober.probe(t) for t in targets])
        await timed("probe, warm", nodes, lambda: [prober.probe(t) for t in targets])
        await timed("BMC read, cold", nodes, lambda: [power.read_power(r) for r in refs])
        await timed("BMC read, warm", nodes, lambda: [power.read_power(r) for r in refs])

        async def drain(target: SshTarget) -> None:
            async for _ in prober.watch(target, heartbeat=heartbeat):
                pass

        streams = [asyncio.create_task(drain(t)) for t in targets]
        await asyncio.sleep(min(2.0, rest))  # every stream's first state line
        cpu = time.process_time()
        await asyncio.sleep(rest)
        cpu = time.process_time() - cpu
        per_node_minute = 1000 * cpu / nodes / (rest / 60)
        print(
            f"{'streams at rest':<28} {nodes:>7} {rest:>8.2f} {cpu:>8.2f} "
            f"{per_node_minute:>10.3f}  (cpu ms per node-minute; heartbeat {heartbeat:g} s; "
            f"{cpu / rest:.3f} cores)"
        )
        for task in streams:
            task.cancel()
        for task in streams:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
    finally:
        await power.close()
        await prober.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--rest", type=float, default=20.0, help="seconds of streams at rest")
    parser.add_argument("--heartbeat", type=float, default=10.0)
    args = parser.parse_args()
    asyncio.run(run(args.nodes, args.rest, args.heartbeat))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
    from calibration import summary  # the machine figure this run compares through

    print(summary(), flush=True)
    main()
