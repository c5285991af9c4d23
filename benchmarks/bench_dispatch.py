#!/usr/bin/env python3
"""Benchmark: 1,000 containers from Queued to Running on the real control plane + stub cloud.

Creates N ContainerDispatches (operator not yet running), starts the operator against a
stub cloud with zero boot delay, and measures until every container is Running:
wall time, operator CPU seconds, operator peak RSS, and Kubernetes API requests made by
nodewarden per container (its own counter; kopf's few watch streams are not included).
Issue 5 targets: <= 90 s, RSS <= 300 MB.

    .venv/bin/python benchmarks/bench_dispatch.py [--containers 1000] [--kubeconfig F]

Without --kubeconfig a local control plane is started in a temporary directory.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO / "e2e")]

from clusterkit import ClusterHandle  # noqa: E402
from dispatchkit import DispatchEnv, container  # noqa: E402
from localcluster import LocalCluster  # noqa: E402
from nodewarden.api.kinds import CONTAINER_DISPATCH  # noqa: E402
from nodewarden.kube.client import Kube, api_client_from  # noqa: E402

CLK_TCK = 100


def proc_sample(pid: int) -> tuple[float, int]:
    """(cpu seconds, rss bytes) of a process."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / CLK_TCK
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
    return cpu, rss


async def create_all(kubeconfig: Path, namespace: str, n: int) -> float:
    api = await api_client_from(kubeconfig)
    kube = Kube(api)
    sem = asyncio.Semaphore(32)
    t0 = time.monotonic()

    async def one(i: int) -> None:
        body = container(f"b{i:05d}", 800_000 + i, vcpus=1, ram="1Gi", duration=3600)
        body.pop("apiVersion")
        body.pop("kind")
        async with sem:
            await kube.create(CONTAINER_DISPATCH, namespace, body)

    await asyncio.gather(*(one(i) for i in range(n)))
    await kube.close()
    return time.monotonic() - t0


def requests_made(metrics: str) -> float:
    return sum(
        float(v)
        for v in re.findall(r"^nodewarden_kube_requests_total\{[^}]*\} (\S+)$", metrics, re.M)
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--containers", type=int, default=1000)
    parser.add_argument("--kubeconfig", type=Path)
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="nw-bench-"))
    local = None
    if args.kubeconfig is None:
        local = LocalCluster(state_dir=work / "cluster").up()
        kubeconfig = local.kubeconfig
    else:
        kubeconfig = args.kubeconfig
    cluster = ClusterHandle(kubeconfig, local)
    namespace = f"bench-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", namespace)
    env = DispatchEnv.create(
        cluster,
        namespace,
        work,
        policy={"maxNodes": 1000, "idleThreshold": "10m"},
        dispatch={
            "max_new_nodes_per_round": 300,
            "max_concurrent_starts": 64,
            "max_concurrent_writes": 16,
            "probe_interval": 10,
            "boot_probe_interval": 0.5,
            "tick_interval": 1,
        },
        cloud={"max_concurrent_creates": 32, "max_threads": 16},
    )
    cfg = env.config_path.read_text().replace("lease_duration: 8", "lease_duration: 15")
    env.config_path.write_text(cfg)
    try:
        created = asyncio.run(create_all(kubeconfig, namespace, args.containers))
        print(
            f"created {args.containers} ContainerDispatches in {created:.1f}s (operator not running)"
        )
        t0 = time.monotonic()
        op = env.start_operator(name="bench")
        pid = op.proc.pid
        cpu0, _ = proc_sample(pid)
        peak = 0
        first_running = None
        while time.monotonic() - t0 < args.timeout:
            _, rss = proc_sample(pid)
            peak = max(peak, rss)
            # read the operator's own gauge: listing 1,000 objects every second would load
            # the API server the benchmark is measuring
            code, metrics = op.get("/metrics")
            found = re.search(r'^nodewarden_containers\{phase="Running"\} (\S+)$', metrics, re.M)
            running = int(float(found.group(1))) if code == 200 and found else 0
            if running and first_running is None:
                first_running = time.monotonic() - t0
            if running >= args.containers:
                break
            time.sleep(1)
        wall = time.monotonic() - t0
        cpu1, rss = proc_sample(pid)
        peak = max(peak, rss)
        code, metrics = op.get("/metrics")
        reqs = requests_made(metrics) if code == 200 else float("nan")
        items = cluster.get_json(namespace, "cd")["items"]
        confirmed = sum(1 for c in items if (c.get("status") or {}).get("phase") == "Running")
        nodes = len(cluster.get_json(namespace, "wn")["items"])
        print(
            json.dumps(
                {
                    "containers": args.containers,
                    "all_running": running >= args.containers,
                    "running_in_api": confirmed,
                    "wall_seconds_to_all_running": round(wall, 1),
                    "seconds_to_first_running": round(first_running or -1, 1),
                    "operator_cpu_seconds": round(cpu1 - cpu0, 1),
                    "operator_peak_rss_mb": round(peak / 2**20, 1),
                    "worker_nodes": nodes,
                    "kube_requests_by_nodewarden": int(reqs),
                    "kube_requests_per_container": round(reqs / args.containers, 2),
                    "stub_cloud_rss_mb": round(env.stub.admin.stats()["rss_bytes"] / 2**20, 1),
                },
                indent=2,
            )
        )
        print("targets: <= 90 s to all Running, operator RSS <= 300 MB")
        return 0 if running >= args.containers else 1
    finally:
        env.close()
        if local is not None:
            local.down()


if __name__ == "__main__":
    raise SystemExit(main())
