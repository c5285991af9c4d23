"""Benchmark: the stub cloud running N VMs (default 1,000) in one process, each a real SSH server.

Creates the VMs through the nodewarden cloud facade (libcloud driver "nodewarden-stub",
thread pool, layers), waits until every VM's StubWorker listens on 127.0.0.1, logs in
to a sample of them over SSH, then destroys them all. Prints creation time, time until
all SSH servers listen, memory (RSS) per VM, CPU time and destroy time.

    .venv/bin/python benchmarks/bench_stub_cloud.py [--vms 1000] [--ops-per-second 0]
        [--max-concurrent-creates 0] [--sample 20] [--hold]

`--ops-per-second 10 --max-concurrent-creates 1` are the Arvados defaults (the creates
are then paced at 10/s: 1,000 VMs take at least 100 s by design).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import resource
import time
from pathlib import Path
from typing import Any

import asyncssh

from nodewarden.cloud import CloudConfig, CloudFacade, CloudInstance, build_cloud
from nodewarden.cloud.stub import StubCloud, StubFaults
from nodewarden.scheduling.instancetypes import InstanceType
from nodewarden.ssh.protocol import DEFAULT_READY_COMMAND


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def run(args: argparse.Namespace) -> None:
    key = asyncssh.generate_private_key("ssh-ed25519")
    public = key.export_public_key().decode().strip()
    itype = InstanceType(name="small", provider_type="t3.small", vcpus=2, ram="2Gi", price=0.02)
    rss0, cpu0, fds0 = rss_mib(), cpu_seconds(), open_fds()
    cloud = StubCloud("bench", faults=StubFaults(seed=1), catalogue=[itype]).start()
    try:
        facade = build_cloud(
            CloudConfig(
                driver="nodewarden-stub",
                driver_params={"cloud": "bench"},
                image="stub-image",
                ops_per_second=args.ops_per_second,
                max_concurrent_creates=args.max_concurrent_creates,
                instance_types=[itype],
            ),
            None,
            "bench",
        )
        requests = [
            facade.create_request(name=f"wn-{i:04d}", instance_type=itype, ssh_public_key=public)[0]
            for i in range(args.vms)
        ]
        t0 = time.perf_counter()
        created = await asyncio.gather(*(facade.create(r) for r in requests))
        t_created = time.perf_counter() - t0
        up = await asyncio.to_thread(cloud.wait_for_workers, args.vms, 600)
        t_listening = time.perf_counter() - t0
        cpu_create = cpu_seconds() - cpu0
        rss1, fds1 = rss_mib(), open_fds()

        t1 = time.perf_counter()
        listed = await facade.list_instances()
        t_list = time.perf_counter() - t1

        sample = random.Random(2).sample(created, min(args.sample, len(created)))
        t2 = time.perf_counter()
        ok = 0
        for vm in sample:
            endpoint = facade.ssh_endpoint(vm)
            worker: Any = cloud.worker(vm.id)
            known = asyncssh.import_known_hosts(
                f"[{endpoint.host}]:{endpoint.port} {worker.host_public_key}\n"
            )
            async with asyncssh.connect(
                endpoint.host,
                endpoint.port,
                username="root",
                client_keys=[key],
                known_hosts=known,
            ) as conn:
                result = await conn.run(DEFAULT_READY_COMMAND, timeout=10)
                ok += result.exit_status == 0
        t_ssh = (time.perf_counter() - t2) / max(1, len(sample))

        held = None
        if args.hold:
            held = await hold_connections(facade, cloud, created, key)

        t3 = time.perf_counter()
        await asyncio.gather(*(facade.destroy(vm) for vm in created))
        await asyncio.to_thread(_wait_empty, cloud, 120)
        t_destroy = time.perf_counter() - t3
        await facade.close()
    finally:
        cloud.close()
    rss2 = rss_mib()

    print(
        f"VMs                       {args.vms} (ops/s cap {args.ops_per_second or 'none'}, "
        f"concurrent creates {args.max_concurrent_creates or 'unlimited'})"
    )
    print(f"create API calls done     {t_created:8.2f} s  ({args.vms / t_created:.0f} creates/s)")
    print(f"all SSH servers listening {t_listening:8.2f} s  ({up} up)")
    print(f"CPU time for create+boot  {cpu_create:8.2f} s")
    print(
        f"RSS before / with VMs     {rss0:8.1f} / {rss1:.1f} MiB  "
        f"({(rss1 - rss0) * 1024 / args.vms:.0f} KiB per VM)"
    )
    print(f"open fds before / with    {fds0} / {fds1}")
    print(f"list {len(listed)} instances     {t_list * 1000:8.1f} ms")
    print(f"SSH login + ready command {t_ssh * 1000:8.1f} ms per VM ({ok}/{len(sample)} ready)")
    if held is not None:
        print(
            f"hold SSH to every VM      {held[0]:8.2f} s to connect all; RSS {held[1]:.1f} MiB "
            f"({(held[1] - rss1) * 1024 / args.vms:.0f} KiB per connection, both ends)"
        )
    print(f"destroy all               {t_destroy:8.2f} s")
    print(f"RSS after close           {rss2:8.1f} MiB")  # fmt: skip


async def hold_connections(
    facade: CloudFacade, cloud: StubCloud, vms: list[CloudInstance], key: asyncssh.SSHKey
) -> tuple[float, float]:
    """Open one SSH connection to every VM at once (50 handshakes in flight); RSS with all."""
    gate = asyncio.Semaphore(50)
    conns: list[asyncssh.SSHClientConnection] = []

    async def connect(vm: CloudInstance) -> None:
        endpoint = facade.ssh_endpoint(vm)
        worker: Any = cloud.worker(vm.id)
        known = asyncssh.import_known_hosts(
            f"[{endpoint.host}]:{endpoint.port} {worker.host_public_key}\n"
        )
        async with gate:
            conns.append(
                await asyncssh.connect(
                    endpoint.host,
                    endpoint.port,
                    username="root",
                    client_keys=[key],
                    known_hosts=known,
                )
            )

    t0 = time.perf_counter()
    await asyncio.gather(*(connect(vm) for vm in vms))
    elapsed = time.perf_counter() - t0
    rss = rss_mib()
    for conn in conns:
        conn.close()
    await asyncio.gather(*(conn.wait_closed() for conn in conns))
    return elapsed, rss


def _wait_empty(cloud: StubCloud, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while cloud.vms() and time.monotonic() < deadline:
        time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vms", type=int, default=1000)
    parser.add_argument("--ops-per-second", type=float, default=0.0)
    parser.add_argument("--max-concurrent-creates", type=int, default=0)
    parser.add_argument("--sample", type=int, default=20)
    parser.add_argument(
        "--hold", action="store_true", help="also hold one SSH connection to every VM at once"
    )
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
