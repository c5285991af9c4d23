#!/usr/bin/env python3
"""Benchmark: the informer feed holding 5,000 WorkerNodes as a small dataclass, on the real API server.

Creates N WorkerNodes with a realistic status (written through the status subresource)
and a 2 KB annotation, then, in a fresh interpreter (so RSS is the informer's, not the
creator's), measures:

- LIST: time to the first full sync (paged), objects/s, CPU seconds;
- memory: RSS growth per object after the sync, and the store's own size per object
  (deep size of keys, entries and models) next to the deep size of one raw object (what
  a cache of full bodies would hold);
- watch catch-up: the informer's connection is stalled through the loopback proxy while
  N status patches are written, then released: events/s until the store has them all;
- live lag: M patches while the informer streams; p50/p99 from each write's response to
  the handler call carrying it.

    .venv/bin/python benchmarks/bench_informer.py [--nodes 5000] [--live 1000] [--kubeconfig F]

Without --kubeconfig a local control plane is started in a temporary directory.
Figures are printed; nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "e2e")]

from kubernetes_asyncio import client, config  # noqa: E402

from localcluster import LocalCluster, run_kubectl  # noqa: E402
from nodewarden.api.base import GROUP, VERSION  # noqa: E402
from nodewarden.api.kinds import WORKER_NODE  # noqa: E402
from nodewarden.kube.client import Kube, api_client_from  # noqa: E402
from nodewarden.kube.informer import Informer, InformerSettings  # noqa: E402
from nodewarden_doubles.tcpproxy import TcpProxy  # noqa: E402

# --- the compact model the power controller would keep ----------------------------------


@dataclass(frozen=True, slots=True)
class NodeModel:
    namespace: str
    name: str
    node_type: str
    control_method: str
    instance_type: str | None
    power: str
    idle_behavior: str
    policy: str | None
    state: str | None
    observed_power: str | None
    readiness: str | None
    admission: str | None
    running_containers: int
    idle_since: str | None
    probe_time: str | None


def to_model(raw: Mapping[str, Any]) -> NodeModel:
    """Only the fields decisions need; low-cardinality strings interned (shared, not copied)."""
    meta, spec, status = raw["metadata"], raw.get("spec") or {}, raw.get("status") or {}
    return NodeModel(
        namespace=_intern(meta["namespace"]),
        name=meta["name"],
        node_type=_intern(spec.get("nodeType", "CloudVM")),
        control_method=_intern(spec.get("controlMethod", "Cloud")),
        instance_type=_intern(spec.get("instanceType")),
        power=_intern(spec.get("power", "Auto")),
        idle_behavior=_intern(spec.get("idleBehavior", "run")),
        policy=_intern((spec.get("policyRef") or {}).get("name")),
        state=_intern(status.get("state")),
        observed_power=_intern(status.get("observedPower")),
        readiness=_intern(status.get("readiness")),
        admission=_intern(status.get("admission")),
        running_containers=int(status.get("runningContainers") or 0),
        idle_since=status.get("idleSince"),
        probe_time=(status.get("lastProbe") or {}).get("time"),
    )


def _intern(value: Any) -> Any:
    return sys.intern(value) if isinstance(value, str) else value


def deep_size(obj: Any, seen: set[int] | None = None) -> int:
    """Bytes held by `obj` and everything it references (shared objects counted once)."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    size = sys.getsizeof(obj)
    if isinstance(obj, dict):
        size += sum(deep_size(k, seen) + deep_size(v, seen) for k, v in obj.items())
    elif isinstance(obj, list | tuple | set | frozenset):
        size += sum(deep_size(x, seen) for x in obj)
    elif hasattr(obj, "__slots__"):
        size += sum(deep_size(getattr(obj, s), seen) for s in obj.__slots__ if hasattr(obj, s))
    elif hasattr(obj, "__dict__"):
        size += deep_size(vars(obj), seen)
    return size


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# --- objects ------------------------------------------------------------------------------


def status(i: int, probe: str) -> dict[str, Any]:
    return {
        "state": "Idle",
        "observedPower": "On",
        "readiness": "Ready",
        "admission": "Open",
        "instanceId": f"i-{i:017x}",
        "address": "127.0.0.1",
        "hourlyPrice": 0.096,
        "bootedAt": "2026-11-30T10:00:00Z",
        "idleSince": "2026-11-30T10:05:00Z",
        "runningContainers": 0,
        "lastProbe": {"time": probe, "result": "Ready", "lastSuccess": probe},
        "dispatcherId": "bench",
        "conditions": [
            {
                "type": "Valid",
                "status": "True",
                "reason": "Valid",
                "message": "spec is valid",
                "lastTransitionTime": "2026-11-30T10:00:00Z",
            }
        ],
    }


async def bounded(jobs: list[Awaitable[Any]], limit: int = 32) -> list[Any]:
    gate = asyncio.Semaphore(limit)

    async def one(job: Awaitable[Any]) -> Any:
        async with gate:
            return await job

    return await asyncio.gather(*(one(j) for j in jobs))


async def populate(kubeconfig: Path, namespace: str, n: int) -> float:
    kube = Kube(await api_client_from(kubeconfig), field_manager="bench")
    blob = "x" * 2048  # stands in for kubectl's last-applied-configuration and the like
    t0 = time.monotonic()

    async def one(i: int) -> None:
        name = f"wn-{i:05d}"
        body = {
            "metadata": {
                "name": name,
                "labels": {"nodewarden.io/pool": f"pool-{i % 10}"},
                "annotations": {"bench/blob": blob},
            },
            "spec": {
                "nodeType": "CloudVM",
                "controlMethod": "Cloud",
                "instanceType": "m5.large",
                "policyRef": {"name": "default"},
            },
        }
        await kube.create(WORKER_NODE, namespace, body)
        await kube.patch_status(WORKER_NODE, namespace, name, status(i, "2026-11-30T10:06:00Z"))

    await bounded([one(i) for i in range(n)])
    await kube.close()
    return time.monotonic() - t0


# --- the measurement (runs in a fresh interpreter) ----------------------------------------


async def measure(
    kubeconfig: Path, namespace: str, n: int, live: int, page_size: int
) -> dict[str, Any]:
    cfg = client.Configuration()
    await config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    server = urlsplit(cfg.host)
    assert server.hostname and server.port
    proxy = await TcpProxy(server.hostname, server.port).start()
    cfg.host = f"https://127.0.0.1:{proxy.port}"
    api = client.ApiClient(configuration=cfg)
    writer = Kube(await api_client_from(kubeconfig), field_manager="bench")
    settings = InformerSettings(page_size=page_size)
    informer = Informer(api, WORKER_NODE, to_model, namespace=namespace, settings=settings)
    seen_at: dict[tuple[str, str | None], float] = {}
    waiting: dict[str, Any] = {"probe": None, "left": 0, "done": asyncio.Event()}

    def handler(_: str, __: NodeModel | None, new: NodeModel | None) -> None:
        if new is None:
            return
        seen_at[(new.name, new.probe_time)] = time.monotonic()
        if new.probe_time == waiting["probe"]:
            waiting["left"] -= 1
            if waiting["left"] == 0:
                waiting["done"].set()

    def expect(probe: str, count: int) -> asyncio.Event:
        waiting.update(probe=probe, left=count, done=asyncio.Event())
        return waiting["done"]

    informer.add_handler(handler)
    out: dict[str, Any] = {}

    gc.collect()
    rss0, cpu0, t0 = rss_bytes(), cpu_seconds(), time.monotonic()
    informer.start()
    await informer.wait_synced()
    out["list_seconds"] = time.monotonic() - t0
    out["list_cpu_seconds"] = cpu_seconds() - cpu0
    gc.collect()
    out["rss_base_mb"] = rss0 / 2**20
    out["rss_synced_mb"] = rss_bytes() / 2**20
    out["rss_per_object"] = (rss_bytes() - rss0) / n
    out["store_per_object"] = deep_size(informer.store._items) / n
    page = await writer.custom.list_namespaced_custom_object(
        GROUP, VERSION, namespace, WORKER_NODE.plural, limit=100
    )
    raw = page["items"]
    out["raw_per_object"] = deep_size(raw) / len(raw)
    out["objects"] = len(informer.store)
    del raw

    if live > 0:
        out.update(await watch_phases(informer, proxy, writer, namespace, n, live, expect, seen_at))
    gc.collect()
    out["rss_end_mb"] = rss_bytes() / 2**20
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    await informer.stop()
    await api.close()
    await writer.close()
    await proxy.close()
    return out


async def watch_phases(
    informer: Informer[NodeModel],
    proxy: TcpProxy,
    writer: Kube,
    namespace: str,
    n: int,
    live: int,
    expect: Any,
    seen_at: dict[tuple[str, str | None], float],
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    # watch catch-up: writes pile up while the informer's connection is stalled
    proxy.stall()
    probe = "2026-11-30T11:00:00Z"
    caught_up = expect(probe, n)
    t_write = time.monotonic()

    async def touch(i: int) -> int:
        patch = {"lastProbe": {"time": probe}}
        done = await writer.patch_status(WORKER_NODE, namespace, f"wn-{i:05d}", patch)
        return int(done["metadata"]["resourceVersion"])  # keep the version, not the body

    versions = await bounded([touch(i) for i in range(n)])
    out["write_seconds"] = time.monotonic() - t_write
    last_rv = max(versions)
    t1, cpu1 = time.monotonic(), cpu_seconds()
    proxy.unstall()
    await caught_up.wait()
    assert int(informer.resource_version or 0) >= last_rv
    out["catchup_seconds"] = time.monotonic() - t1
    out["catchup_cpu_seconds"] = cpu_seconds() - cpu1
    out["catchup_events"] = sum(1 for key in seen_at if key[1] == probe)

    # live lag: the informer streams while writes go on
    probe = "2026-11-30T12:00:00Z"
    all_seen = expect(probe, live)
    written: dict[str, float] = {}

    async def patch(i: int) -> None:
        name = f"wn-{i:05d}"
        await writer.patch_status(WORKER_NODE, namespace, name, {"lastProbe": {"time": probe}})
        written[name] = time.monotonic()

    t2 = time.monotonic()
    await bounded([patch(i) for i in range(live)], limit=16)
    out["live_write_rate"] = live / (time.monotonic() - t2)
    try:
        async with asyncio.timeout(120):
            await all_seen.wait()
    except TimeoutError:
        pass
    lags = [
        max(0.0, seen_at[(name, probe)] - t)
        for name, t in written.items()
        if (name, probe) in seen_at
    ]
    out["live_seen"] = len(lags)
    out["lag_p50_ms"] = pct(lags, 0.5) * 1000 if lags else None
    out["lag_p99_ms"] = pct(lags, 0.99) * 1000 if lags else None
    return out


def report(n: int, page_size: int, fig: dict[str, Any]) -> None:
    print(
        f"  page size {page_size}: LIST to synced {fig['list_seconds']:.2f} s"
        f" ({n / fig['list_seconds']:.0f} objects/s, CPU {fig['list_cpu_seconds']:.2f} s);"
        f" RSS {fig['rss_base_mb']:.1f} -> {fig['rss_synced_mb']:.1f} MB"
        f" = {fig['rss_per_object']:.0f} B/object; store {fig['store_per_object']:.0f} B/object"
        f" (raw body {fig['raw_per_object']:.0f} B/object)"
    )
    if "catchup_seconds" in fig:
        print(
            f"    watch catch-up: {fig['catchup_events']} events in {fig['catchup_seconds']:.2f} s"
            f" ({fig['catchup_events'] / fig['catchup_seconds']:.0f} events/s,"
            f" CPU {fig['catchup_cpu_seconds']:.2f} s; the stalled writes took"
            f" {fig['write_seconds']:.1f} s)"
        )
        if fig["lag_p50_ms"] is not None:
            print(
                f"    live lag write->handler: p50 {fig['lag_p50_ms']:.0f} ms,"
                f" p99 {fig['lag_p99_ms']:.0f} ms ({fig['live_seen']} patches"
                f" at {fig['live_write_rate']:.0f}/s)"
            )
    print(f"    RSS at end {fig['rss_end_mb']:.1f} MB (peak {fig['peak_rss_mb']:.1f} MB)")


def run_child(kubeconfig: Path, namespace: str, n: int, live: int, page_size: int) -> Any:
    argv = [sys.executable, __file__, "--nodes", str(n), "--live", str(live)]
    argv += ["--page-sizes", str(page_size), "--measure", str(kubeconfig), namespace]
    child = subprocess.run(argv, capture_output=True, text=True, check=False)
    if child.returncode != 0:
        raise RuntimeError(f"measurement failed:\n{child.stdout}\n{child.stderr}")
    return json.loads(child.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--live", type=int, default=1000, help="patches for the lag phase")
    parser.add_argument("--page-sizes", default="500,100", help="LIST page sizes to compare")
    parser.add_argument("--kubeconfig", type=Path)
    parser.add_argument(
        "--measure", nargs=2, metavar=("KUBECONFIG", "NAMESPACE"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    page_sizes = [int(p) for p in args.page_sizes.split(",")]
    if args.measure:
        kubeconfig, namespace = Path(args.measure[0]), args.measure[1]
        fig = asyncio.run(measure(kubeconfig, namespace, args.nodes, args.live, page_sizes[0]))
        print(json.dumps(fig))
        return 0

    local: LocalCluster | None = None
    kubeconfig = args.kubeconfig
    if kubeconfig is None:
        local = LocalCluster(state_dir=Path(tempfile.mkdtemp(prefix="nw-bench-informer-"))).up()
        kubeconfig = local.kubeconfig
    namespace = f"bench-{uuid.uuid4().hex[:8]}"
    run_kubectl(kubeconfig, "create", "namespace", namespace)
    try:
        create_s = asyncio.run(populate(kubeconfig, namespace, args.nodes))
        load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
        print(f"bench_informer: {args.nodes} WorkerNodes (load average {load})")
        print(
            f"  populate: create + status write, 32 in flight: {create_s:.1f} s"
            f" ({2 * args.nodes / create_s:.0f} writes/s)"
        )
        for i, size in enumerate(page_sizes):
            live = args.live if i == 0 else 0  # the watch phases once
            report(args.nodes, size, run_child(kubeconfig, namespace, args.nodes, live, size))
    finally:
        run_kubectl(kubeconfig, "delete", "namespace", namespace, "--wait=false", check=False)
        if local is not None:
            local.down()
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
    from calibration import summary  # the machine figure this run compares through

    print(summary(), flush=True)
    raise SystemExit(main())
