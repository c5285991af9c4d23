"""Benchmark: the stub cloud running N VMs (default 1,000), each a real SSH server.

Creates the VMs through the nodewarden cloud facade (libcloud driver "nodewarden-stub",
thread pool, layers), waits until every VM's StubWorker listens on 127.0.0.1, logs in
to a sample of them over SSH, then destroys them all. Prints creation time, time until
all SSH servers listen, memory (RSS) per VM, CPU time and destroy time.

Default: the stub cloud in this process. `--remote`: the stub cloud as its own process
(`python -m nodewarden_doubles.stubcloud.server`, started with `StubCloudProcess`), reached
over loopback HTTP with signed requests; prints the server's RSS (from its admin API)
and CPU time (from /proc) as well as the client's.

    .venv/bin/python benchmarks/bench_stub_cloud.py [--vms 1000] [--ops-per-second 0]
        [--max-concurrent-creates 0] [--max-threads 8] [--sample 20] [--hold] [--remote]

`--ops-per-second 10 --max-concurrent-creates 1` are the Arvados defaults (the creates
are then paced at 10/s: 1,000 VMs take at least 100 s by design).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import resource
import sys
import time
from pathlib import Path
from typing import Any

import asyncssh

from nodewarden.cloud import CloudConfig, CloudFacade, CloudInstance, build_cloud
from nodewarden.scheduling.instancetypes import InstanceType
from nodewarden.ssh.protocol import DEFAULT_READY_COMMAND
from nodewarden_doubles.stubcloud import RemoteStubResolver, StubCloud, StubFaults, StubServerConfig
from nodewarden_doubles.stubcloud.process import StubCloudProcess


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
                driver_plugin="nodewarden_doubles.stubcloud:plugin",
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


def process_cpu_seconds(pid: int) -> float:
    """utime + stime of another process, from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


async def run_remote(args: argparse.Namespace) -> None:
    key = asyncssh.generate_private_key("ssh-ed25519")
    public = key.export_public_key().decode().strip()
    itype = InstanceType(name="small", provider_type="t3.small", vcpus=2, ram="2Gi", price=0.02)
    config = StubServerConfig(
        name="bench",
        credentials={"key": "AKIABENCHKEY00000001", "secret": "bench-secret-value-0123456789"},
        faults=StubFaults(seed=1),
        instance_types=[itype],
    )
    rss0, cpu0 = rss_mib(), cpu_seconds()
    with StubCloudProcess(config, log_level="WARNING") as stub:
        assert stub.pid is not None
        admin = stub.admin
        server_rss0 = admin.stats()["rss_bytes"] / 2**20
        server_cpu0 = process_cpu_seconds(stub.pid)
        facade = build_cloud(
            stub.cloud_config(
                ops_per_second=args.ops_per_second,
                max_concurrent_creates=args.max_concurrent_creates,
                max_threads=args.max_threads,
            ),
            stub.cloud_credentials(),
            "bench",
        )
        requests = [
            facade.create_request(name=f"wn-{i:04d}", instance_type=itype, ssh_public_key=public)[0]
            for i in range(args.vms)
        ]
        t0 = time.perf_counter()
        created = await asyncio.gather(*(facade.create(r) for r in requests))
        t_created = time.perf_counter() - t0
        up = await asyncio.to_thread(admin.wait_for_workers, args.vms, 600)
        t_listening = time.perf_counter() - t0
        server_cpu1 = process_cpu_seconds(stub.pid)
        cpu_create = cpu_seconds() - cpu0
        server_rss1 = admin.stats()["rss_bytes"] / 2**20
        rss1 = rss_mib()

        t1 = time.perf_counter()
        listed = await facade.list_instances()
        t_list = time.perf_counter() - t1

        creds = stub.cloud_credentials()
        assert creds is not None and creds.secret is not None
        fresh = RemoteStubResolver(
            stub.url, creds.key.get_secret_value(), creds.secret.get_secret_value()
        )
        address = created[-1].address()
        assert address is not None
        t_miss = time.perf_counter()
        fresh.resolve(address, 22)  # a miss: fetches the endpoint table of every VM
        t_miss = time.perf_counter() - t_miss
        t_hit = time.perf_counter()
        for _ in range(1000):
            fresh.resolve(address, 22)
        t_hit = (time.perf_counter() - t_hit) / 1000

        keys = {vm.id: vm.host_public_key for vm in admin.vms()}
        sample = random.Random(2).sample(created, min(args.sample, len(created)))
        t2 = time.perf_counter()
        ok = 0
        for vm in sample:
            endpoint = facade.ssh_endpoint(vm)  # through the remote resolver
            known = asyncssh.import_known_hosts(
                f"[{endpoint.host}]:{endpoint.port} {keys[vm.id]}\n"
            )
            async with asyncssh.connect(
                endpoint.host, endpoint.port, username="root", client_keys=[key], known_hosts=known
            ) as conn:
                result = await conn.run(DEFAULT_READY_COMMAND, timeout=10)
                ok += result.exit_status == 0
        t_ssh = (time.perf_counter() - t2) / max(1, len(sample))

        t3 = time.perf_counter()
        await asyncio.gather(*(facade.destroy(vm) for vm in created))
        t_destroy = time.perf_counter() - t3
        left = admin.stats()["vms"]
        server_rss2 = admin.stats()["rss_bytes"] / 2**20
        await facade.close()
        server_cpu2 = process_cpu_seconds(stub.pid)
    code_at_stop = stub.process.returncode if stub.process is not None else None

    print(
        f"VMs                       {args.vms} via a stub cloud server over loopback HTTP "
        f"(ops/s cap {args.ops_per_second or 'none'}, concurrent creates "
        f"{args.max_concurrent_creates or 'unlimited'}, {args.max_threads} client threads)"
    )
    print(f"create API calls done     {t_created:8.2f} s  ({args.vms / t_created:.0f} creates/s)")
    print(f"all SSH servers listening {t_listening:8.2f} s  ({up} up)")
    print(
        f"CPU for create+boot       {cpu_create:8.2f} s client, "
        f"{server_cpu1 - server_cpu0:.2f} s server"
    )
    print(
        f"server RSS before / with  {server_rss0:8.1f} / {server_rss1:.1f} MiB  "
        f"({(server_rss1 - server_rss0) * 1024 / args.vms:.0f} KiB per VM); "
        f"after destroy {server_rss2:.1f} MiB"
    )
    print(f"client RSS before / with  {rss0:8.1f} / {rss1:.1f} MiB")
    print(f"list {len(listed)} instances     {t_list * 1000:8.1f} ms")
    print(
        f"resolver miss / hit       {t_miss * 1000:8.1f} ms / {t_hit * 1e6:.1f} us "
        f"(a miss fetches all {args.vms} endpoints, blocking)"
    )
    print(f"SSH login + ready command {t_ssh * 1000:8.1f} ms per VM ({ok}/{len(sample)} ready)")
    print(f"destroy all               {t_destroy:8.2f} s  ({left} VMs left)")
    print(f"server CPU total          {server_cpu2 - server_cpu0:8.2f} s; exit code {code_at_stop}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vms", type=int, default=1000)
    parser.add_argument("--remote", action="store_true", help="stub cloud as its own process")
    parser.add_argument("--max-threads", type=int, default=8, help="client threads (remote)")
    parser.add_argument("--ops-per-second", type=float, default=0.0)
    parser.add_argument("--max-concurrent-creates", type=int, default=0)
    parser.add_argument("--sample", type=int, default=20)
    parser.add_argument(
        "--hold", action="store_true", help="also hold one SSH connection to every VM at once"
    )
    args = parser.parse_args()
    asyncio.run(run_remote(args) if args.remote else run(args))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
    from calibration import summary  # the machine figure this run compares through

    print(summary(), flush=True)
    main()
