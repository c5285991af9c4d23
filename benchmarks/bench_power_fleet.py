#!/usr/bin/env python3
"""Benchmark: the live operator's power controller over 1,000 / 10,000 WorkerNodes.

The fleet, all side nodes in one namespace, created before the operator starts:

- `--bmc-nodes` (default min(N, 1000)) behind ONE fake BMC process (the project's
  `nodewarden_doubles.fakebmc`, HTTPS on loopback) serving one Redfish system per node,
  all Off; their endpoint is admitted, their SSH endpoints are not (nothing is dialled:
  an Off node is not probed anyway);
- the rest: side nodes whose BMC and SSH endpoints are not admitted. The credential
  resolver refuses them before any packet or DNS lookup; their decision is the answer.

The operator runs with the product's defaults (power poll 15 s, evaluation of a DEFER
every 30 s, re-validation every 30 s) and no cloud. The benchmark holds its own watch
on the WorkerNodes (the events arrive as the operator's writes land) and prints:

- seconds from the operator's start until every node has its first decision
  (`status.state` or `status.lastSafetyRecord` set);
- p50 / p99 from a fact change to the decision written: power flips at the fake BMC
  (Off -> On, until `status.observedPower` says On; bounded below by the poll interval)
  and spec edits (`spec.power: On` on an Off BMC node, until a new
  `status.lastSafetyRecord`);
- API writes while nothing changes over `--idle` seconds (the operator's own counters,
  the WorkerNode watch, and, on the local control plane, the API server's audit log),
  also per evaluation round (`evaluate_interval`);
- operator RSS and CPU after settling; the size of one raw and one compact body.

    .venv/bin/python benchmarks/bench_power_fleet.py --nodes 1000 [--bmc-nodes 1000]
        [--idle 70] [--changes 100] [--kubeconfig F] [--profile DIR]

Without --kubeconfig a local control plane is started in a temporary directory. With
--profile, py-spy (if installed) records the operator's first 90 s and the idle window
into DIR (collapsed stacks).
Figures are printed; nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO / "e2e"), str(REPO / "benchmarks")]

import yaml  # noqa: E402

from bench_dispatch import proc_sample  # noqa: E402
from bench_informer import deep_size  # noqa: E402
from clusterkit import ClusterHandle, OperatorProcess, wait_for  # noqa: E402
from localcluster import OPERATOR_USER, LocalCluster  # noqa: E402
from nodewarden.api.kinds import WORKER_NODE  # noqa: E402
from nodewarden.credentials import LABEL  # noqa: E402
from nodewarden.kube.client import Kube, api_client_from  # noqa: E402
from nodewarden.kube.compact import compact_workernode  # noqa: E402
from nodewarden.kube.informer import Informer  # noqa: E402
from nodewarden.kube.store import EventType  # noqa: E402
from nodewarden.ownership import DISPATCHER_LABEL  # noqa: E402
from nodewarden.ssh.credentials import SshClientKey  # noqa: E402
from nodewarden_doubles.ports import unused_loopback_port  # noqa: E402

BMC_USER = "bench-bmc"
BMC_PASSWORD = "bench-bmc-password-7f3a1"
WRITE_VERBS = ("create", "update", "patch", "delete")
EVALUATE_INTERVAL = 30.0  # the product default (config power.evaluate_interval)


# --- the fake BMC process (this script run with --serve-bmc) ------------------------------


def serve_bmc(systems: int, state_dir: Path) -> None:
    """One fake BMC with `systems` systems, plus a small admin API to flip their power."""
    from aiohttp import web

    from nodewarden_doubles.fakebmc import FakeBmc, FakeBmcOptions, write_loopback_certificate

    async def main() -> None:
        context, _ = write_loopback_certificate(state_dir)
        options = FakeBmcOptions(
            username=BMC_USER,
            password=BMC_PASSWORD,
            system_ids=tuple(str(i) for i in range(systems)),
            initial_power="Off",
        )
        bmc = FakeBmc(options, ssl_context=context)
        totals: Counter[str] = Counter()

        async def trim() -> None:  # the fake records every request; keep counts only
            while True:
                await asyncio.sleep(5)
                for record in bmc.requests:
                    totals[f"{record.method} {record.status}"] += 1
                bmc.requests.clear()
                bmc.resets.clear()

        async def power(request: web.Request) -> web.Response:
            body = await request.json()
            for sid in body["systems"]:
                bmc.set_power(str(sid), body["state"])
            return web.json_response({"ok": True})

        async def stats(request: web.Request) -> web.Response:
            live = Counter(f"{r.method} {r.status}" for r in bmc.requests)
            return web.json_response(dict(totals + live))

        app = web.Application()
        app.router.add_post("/power", power)
        app.router.add_get("/stats", stats)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        async with bmc:
            await site.start()
            admin_port = runner.addresses[0][1]
            task = asyncio.create_task(trim())
            print(
                json.dumps(
                    {
                        "endpoint": bmc.url,
                        "ca": (state_dir / "ca.pem").read_text(),
                        "admin": f"http://127.0.0.1:{admin_port}",
                    }
                ),
                flush=True,
            )
            await asyncio.Event().wait()
            task.cancel()

    asyncio.run(main())


@dataclass
class BmcProcess:
    proc: subprocess.Popen[str]
    endpoint: str
    ca: str
    admin: str

    @classmethod
    def start(cls, systems: int, workdir: Path) -> BmcProcess:
        state = workdir / "bmc"
        state.mkdir(parents=True, exist_ok=True)
        proc = subprocess.Popen(
            [sys.executable, __file__, "--serve-bmc", str(systems), "--state-dir", str(state)],
            stdout=subprocess.PIPE,
            stderr=(workdir / "bmc.log").open("w"),
            text=True,
        )
        assert proc.stdout is not None
        info = json.loads(proc.stdout.readline())
        return cls(proc, info["endpoint"], info["ca"], info["admin"])

    def _call(self, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            self.admin + path, data=data, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read())

    def power(self, systems: list[int], state: str) -> None:
        self._call("/power", {"systems": [str(s) for s in systems], "state": state})

    def stats(self) -> dict[str, int]:
        """Requests the fake BMC answered, by method and status ({} if it is too busy)."""
        try:
            return dict(self._call("/stats"))
        except OSError:
            return {}

    def stop(self) -> None:
        self.proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)


# --- the fleet ----------------------------------------------------------------------------


def node_name(i: int) -> str:
    return f"side-{i:05d}"


def node_body(i: int, bmc: BmcProcess | None) -> dict[str, Any]:
    host = f"side-{i:05d}.bench.example"
    spec: dict[str, Any] = {
        "nodeType": "SideNode",
        "controlMethod": "Redfish",
        "capacity": {"vcpus": 16, "ram": "64Gi"},
        "ssh": {
            "address": host,
            "user": "nodewarden",
            "knownHostsSecretRef": {"name": "side-ssh", "key": "known_hosts"},
        },
        "bmc": {
            "endpoint": bmc.endpoint if bmc is not None else f"https://bmc-{i:05d}.bench.example",
            "usernameSecretRef": {"name": "side-bmc", "key": "username"},
            "passwordSecretRef": {"name": "side-bmc", "key": "password"},
            "caBundleSecretRef": {"name": "side-bmc-ca", "key": "caBundle"},
        },
    }
    if bmc is not None:
        spec["bmc"]["systemId"] = str(i)
    # what `kubectl apply` leaves on every object; the compact body drops it
    applied = json.dumps({"metadata": {"name": node_name(i)}, "spec": spec})
    return {
        "metadata": {
            "name": node_name(i),
            # labelled with the bench dispatcher: an unlabelled side node is claimed first
            "labels": {"site.example/rack": f"r{i % 40:02d}", DISPATCHER_LABEL: "bench"},
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": applied},
        },
        "spec": spec,
    }


async def create_fleet(
    kubeconfig: Path, namespace: str, n: int, bmc: BmcProcess, n_bmc: int
) -> float:
    kube = Kube(await api_client_from(kubeconfig), field_manager="bench")
    gate = asyncio.Semaphore(32)
    t0 = time.monotonic()

    async def one(i: int) -> None:
        async with gate:
            await kube.create(WORKER_NODE, namespace, node_body(i, bmc if i < n_bmc else None))

    await asyncio.gather(*(one(i) for i in range(n)))
    await kube.close()
    return time.monotonic() - t0


def write_secrets(cluster: ClusterHandle, namespace: str, bmc: BmcProcess) -> None:
    key = SshClientKey.generate()
    other = SshClientKey.generate()
    secrets: dict[str, tuple[str | None, dict[str, str]]] = {
        "operator-ssh": (None, {"id": key.export_private().get_secret_value()}),
        "side-bmc": ("bmc", {"username": BMC_USER, "password": BMC_PASSWORD}),
        "side-bmc-ca": ("bmc", {"caBundle": bmc.ca}),
        "side-ssh": ("ssh", {"known_hosts": f"side.bench.example {other.public_key}"}),
    }
    for name, (use, data) in secrets.items():
        meta: dict[str, Any] = {"name": name}
        if use is not None:
            meta["labels"] = {LABEL: use}
        obj = {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "stringData": data}
        cluster.kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(obj))
    policy = {
        "apiVersion": "nodewarden.io/v1alpha1",
        "kind": "PowerPolicy",
        "metadata": {"name": "default"},
        "spec": {},
    }
    cluster.kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(policy))


def write_config(path: Path, namespace: str, bmc: BmcProcess, lease: float) -> None:
    config = {
        "dispatcher_id": "bench",
        "namespace": namespace,
        "log_format": "json",
        "log_level": "INFO",
        "credentials": {
            "bmc_endpoints": [bmc.endpoint.removeprefix("https://")],
            "ssh_endpoints": [],
        },
        "dispatch": {"ssh_private_key_secret": {"name": "operator-ssh", "key": "id"}},
        # a big fleet on a loaded 2-core machine: the event loop lags seconds at start-up,
        # longer than the default lease (15 s, renewal deadline 10 s) tolerates
        "leader_election": {"lease_duration": lease, "renew_interval": 10},
    }
    path.write_text(yaml.safe_dump(config))


# --- the benchmark's own watch --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Seen:
    name: str
    resource_version: str  # every write is a change the watcher counts
    generation: int
    observed_generation: int | None
    state: str | None
    power: str | None
    record: str | None  # lastSafetyRecord time + decision
    decision: str | None
    reasons: tuple[str, ...]


def seen(raw: Mapping[str, Any]) -> Seen:
    status = raw.get("status") or {}
    record = status.get("lastSafetyRecord") or {}
    return Seen(
        name=raw["metadata"]["name"],
        resource_version=raw["metadata"]["resourceVersion"],
        generation=int(raw["metadata"].get("generation") or 0),
        observed_generation=status.get("observedGeneration"),
        state=status.get("state"),
        power=status.get("observedPower"),
        record=f"{record.get('time')} {record.get('decision')}" if record else None,
        decision=record.get("decision"),
        reasons=tuple(record.get("reasons") or ()),
    )


class Watcher:
    """First decisions, pending fact changes and write events, from one WorkerNode watch."""

    def __init__(self) -> None:
        self.first: dict[str, float] = {}
        self.modified = 0
        self.waiting: dict[str, tuple[float, str, Seen | None]] = {}
        self.latencies: dict[str, list[float]] = {"bmc": [], "spec": []}
        self.drained = asyncio.Event()
        self.last_decision_change = time.monotonic()

    def handler(self, etype: EventType, old: Seen | None, new: Seen | None) -> None:
        now = time.monotonic()
        if etype == "MODIFIED":
            self.modified += 1
        if new is None:
            return
        if old is None or (old.state, old.record) != (new.state, new.record):
            self.last_decision_change = now
        name = new.name
        if name not in self.first and (new.state or new.record):
            self.first[name] = now
        pending = self.waiting.get(name)
        if pending is None:
            return
        since, kind, before = pending
        done = (kind == "bmc" and new.power == "On") or (
            kind == "spec"
            and since > 0
            and new.record is not None
            and new.record != (before.record if before is not None else None)
        )
        if done:
            self.latencies[kind].append(now - since)
            del self.waiting[name]
            if not self.waiting:
                self.drained.set()


async def change_facts(
    cluster: ClusterHandle,
    namespace: str,
    bmc: BmcProcess,
    watcher: Watcher,
    informer: Informer[Any],
    k: int,
    wait_seconds: float,
) -> dict[str, dict[str, Any]]:
    """Flip `k` Off BMC nodes On at the BMC and set `spec.power: On` on `k` others (even
    and odd node numbers from 0); wait until each decision is written (or `wait_seconds`);
    the latencies by kind."""
    flips = list(range(0, 2 * k, 2))
    edits = list(range(1, 2 * k, 2))
    if k:
        for i in edits:
            watcher.waiting[node_name(i)] = (
                0.0,
                "spec",
                informer.store.get(namespace, node_name(i)),
            )
        now = time.monotonic()
        for i in flips:
            watcher.waiting[node_name(i)] = (now, "bmc", None)
        bmc.power(flips, "On")
        kube = Kube(await api_client_from(cluster.kubeconfig), field_manager="bench")
        gate = asyncio.Semaphore(16)

        async def edit(i: int) -> None:
            async with gate:
                name = node_name(i)
                _, _, before = watcher.waiting[name]
                watcher.waiting[name] = (time.monotonic(), "spec", before)
                await kube.patch(WORKER_NODE, namespace, name, {"spec": {"power": "On"}})

        await asyncio.gather(*(edit(i) for i in edits))
        await kube.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(watcher.drained.wait(), wait_seconds)
    return {
        kind: {
            "changes": k,
            "decided": len(values),
            "p50_seconds": pct(values, 0.5),
            "p99_seconds": pct(values, 0.99),
        }
        for kind, values in watcher.latencies.items()
    }


# --- the operator process -----------------------------------------------------------------


TRACEMALLOC_WRAPPER = """
import runpy, signal, sys, tracemalloc
OUT = sys.argv.pop(1)
tracemalloc.start(6)
def dump(*_):
    snapshot = tracemalloc.take_snapshot()
    with open(OUT, "w") as out:
        for key, top in (("filename", 25), ("traceback", 30)):
            out.write(f"== by {key}\\n")
            for stat in snapshot.statistics(key)[:top]:
                out.write(f"{stat.size / 2**20:8.1f} MB {stat.count:9d} blocks\\n")
                out.writelines(f"    {line}\\n" for line in stat.traceback.format()[-20:])
        total = sum(s.size for s in snapshot.statistics("filename"))
        out.write(f"total traced {total / 2**20:.1f} MB\\n")
signal.signal(signal.SIGUSR1, dump)
runpy.run_module("nodewarden", run_name="__main__")
"""


def start_operator(
    kubeconfig: Path,
    config: Path,
    workdir: Path,
    tracemalloc_out: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> OperatorProcess:
    port = unused_loopback_port()
    log_path = workdir / "operator.log"
    out = log_path.open("w")
    head = [sys.executable, "-m", "nodewarden"]
    if tracemalloc_out is not None:  # argv[1]: where SIGUSR1 writes the snapshot
        head = [sys.executable, "-c", TRACEMALLOC_WRAPPER, str(tracemalloc_out)]
    proc = subprocess.Popen(
        [
            *head,
            "run",
            f"--kubeconfig={kubeconfig}",
            f"--config={config}",
            f"--http-port={port}",
            "--http-host=127.0.0.1",
        ],
        stdout=out,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
        env={**os.environ, **(env or {})},
    )
    out.close()
    op = OperatorProcess(proc, port, log_path)
    wait_for(lambda: _healthy(op), timeout=60, what="operator /healthz")
    return op


def _healthy(op: OperatorProcess) -> bool:
    if op.proc.poll() is not None:
        raise RuntimeError(f"operator exited {op.proc.returncode}:\n{op.logs()[-4000:]}")
    try:
        return op.get("/healthz")[0] == 200
    except OSError:
        return False


def counters(op: OperatorProcess) -> dict[str, float]:
    """The operator's request and write counters, by label set (a busy operator may take
    seconds to answer)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{op.port}/metrics", timeout=60) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for name in ("nodewarden_kube_requests_total", "nodewarden_status_writes_total"):
        for labels, value in re.findall(rf"^{name}\{{([^}}]*)\}} (\S+)$", text, re.M):
            out[f"{name.removeprefix('nodewarden_')}{{{labels}}}"] = float(value)
    return out


def delta(after: Mapping[str, float], before: Mapping[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0)}


def audit_writes(
    cluster: ClusterHandle, namespace: str, since: datetime, until: datetime
) -> dict[str, int]:
    """Write requests of the operator's identity in `namespace` between two times."""
    return audit_requests(cluster, namespace, since, until)


def audit_requests(
    cluster: ClusterHandle,
    namespace: str,
    since: datetime,
    until: datetime,
    verbs: tuple[str, ...] | None = WRITE_VERBS,
    by_object: bool = False,
) -> dict[str, int]:
    """Requests of the operator's identity in `namespace` between two times, by "verb
    resource[/subresource]" (`verbs` None: every verb), or with `by_object` by
    "resource[/subresource]/name"."""
    if cluster.local is None or not cluster.local.audit_log.exists():
        return {}
    out: Counter[str] = Counter()
    with cluster.local.audit_log.open() as lines:
        for line in lines:
            if OPERATOR_USER not in line or namespace not in line:
                continue
            event = json.loads(line)
            ref = event.get("objectRef") or {}
            if ref.get("namespace") != namespace:
                continue
            if verbs is not None and event["verb"] not in verbs:
                continue
            at = datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00"))
            if since <= at <= until:
                resource = ref.get("resource", "") + (
                    "/" + ref["subresource"] if ref.get("subresource") else ""
                )
                if by_object:
                    out[f"{resource}/{ref.get('name', '')}"] += 1
                else:
                    out[f"{event['verb']} {resource}"] += 1
    return dict(out)


def memory(pid: int) -> dict[str, float]:
    """Resident memory of a process in MB by kind (anonymous: the heap; file: mapped code
    and libraries), and its thread count (each thread may get its own malloc arena)."""
    out: dict[str, float] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
                out[f"{key}_mb"] = round(int(value.split()[0]) / 1024, 1)
            elif key == "Threads":
                out["threads"] = int(value)
    return out


def _text(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)


# --- the run ------------------------------------------------------------------------------


async def run(args: argparse.Namespace, cluster: ClusterHandle, workdir: Path) -> dict[str, Any]:
    n, n_bmc = args.nodes, min(args.bmc_nodes, args.nodes)
    namespace = f"fleet-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", namespace)
    bmc = BmcProcess.start(max(n_bmc, 1), workdir)
    result: dict[str, Any] = {"nodes": n, "bmc_nodes": n_bmc, "cpus": os.cpu_count()}
    op: OperatorProcess | None = None
    informer: Informer[Seen] | None = None
    watch_api = await api_client_from(cluster.kubeconfig)
    try:
        write_secrets(cluster, namespace, bmc)
        config = workdir / "operator.yaml"
        write_config(config, namespace, bmc, args.lease)
        created = await create_fleet(cluster.kubeconfig, namespace, n, bmc, n_bmc)
        result["create_seconds"] = round(created, 1)
        print(f"created {n} WorkerNodes in {created:.1f}s", flush=True)

        watcher = Watcher()
        informer = Informer(watch_api, WORKER_NODE, seen, namespace=namespace)
        informer.add_handler(watcher.handler)
        informer.start()
        await informer.wait_synced()

        t0 = time.monotonic()
        env = dict(item.split("=", 1) for item in args.operator_env)
        result["operator_env"] = env
        op = await asyncio.to_thread(
            start_operator, cluster.operator_kubeconfig, config, workdir, args.tracemalloc, env
        )
        pid = op.proc.pid
        if args.profile:
            start_profiler(args.profile, pid, 90, "startup")
        cpu_start, _ = proc_sample(pid)
        peak = 0
        while len(watcher.first) < n and time.monotonic() - t0 < args.timeout:
            await asyncio.sleep(1)
            peak = max(peak, proc_sample(pid)[1])
        first_all = time.monotonic() - t0 if len(watcher.first) >= n else None
        result["seconds_to_every_first_decision"] = round(first_all, 1) if first_all else None
        result["nodes_with_a_decision"] = len(watcher.first)
        if watcher.first:
            times = sorted(t - t0 for t in watcher.first.values())
            result["first_decision_p50_seconds"] = round(times[len(times) // 2], 1)
        print(
            f"first decisions: {len(watcher.first)}/{n} after {time.monotonic() - t0:.1f}s",
            flush=True,
        )

        # settle: until no node's state or decision record changed for 45 s (three BMC
        # polls), or --settle seconds pass
        settle_end = time.monotonic() + args.settle
        while (
            time.monotonic() < settle_end and time.monotonic() - watcher.last_decision_change < 45
        ):
            await asyncio.sleep(1)
            peak = max(peak, proc_sample(pid)[1])
        result["settle_seconds"] = round(time.monotonic() - t0, 1)
        result["settled"] = time.monotonic() - watcher.last_decision_change >= 45
        cpu_settled, rss_settled = proc_sample(pid)
        result["operator_cpu_seconds_to_settle"] = round(cpu_settled - cpu_start, 1)

        # idle window: nothing changes
        profiler = start_profiler(args.profile, pid, args.idle, "idle") if args.profile else None
        m0, w0, bmc0 = counters(op), watcher.modified, bmc.stats()
        wall0 = datetime.now().astimezone()
        cpu0 = proc_sample(pid)[0]
        t_idle = time.monotonic()
        await asyncio.sleep(args.idle)
        idle = time.monotonic() - t_idle
        cpu1, rss_idle = proc_sample(pid)
        wall1 = datetime.now().astimezone()
        m1, w1, bmc1 = counters(op), watcher.modified, bmc.stats()
        if profiler is not None:
            profiler.wait()
        rounds = idle / EVALUATE_INTERVAL
        requests = delta(m1, m0)
        writes = sum(v for k, v in requests.items() if "status_writes" in k)
        audited = audit_writes(cluster, namespace, wall0, wall1)
        result["idle"] = {
            "seconds": round(idle, 1),
            "evaluation_rounds": round(rounds, 2),
            "operator_requests": requests,
            "status_writes_per_round": round(writes / rounds, 1),
            "workernode_watch_modified_events": w1 - w0,
            "audited_writes": audited,
            "audited_writes_per_round": round(sum(audited.values()) / rounds, 1)
            if audited
            else None,
            "bmc_requests": delta(bmc1, bmc0),
            "operator_cpu_share": round((cpu1 - cpu0) / idle, 3),
        }
        peak = max(peak, rss_idle)
        if args.tracemalloc is not None:
            os.kill(pid, signal.SIGUSR1)
            result["tracemalloc"] = str(args.tracemalloc)
            await asyncio.to_thread(
                wait_for,
                lambda: "total traced" in _text(args.tracemalloc),
                timeout=300,
                interval=2,
                what="the tracemalloc snapshot",
            )
        result["operator_rss_mb"] = round(rss_idle / 2**20, 1)
        result["operator_memory_idle"] = memory(pid)
        result["operator_rss_settled_mb"] = round(rss_settled / 2**20, 1)
        result["operator_peak_rss_mb"] = round(peak / 2**20, 1)

        # fact changes: BMC flips and spec edits, spread over the BMC nodes
        k = min(args.changes, max(n_bmc // 2, 0))
        result["fact_change_to_decision_written"] = await change_facts(
            cluster, namespace, bmc, watcher, informer, k, args.change_timeout
        )
        result["fact_change_notes"] = (
            "bmc: power flipped Off->On at the fake BMC until status.observedPower is On "
            "(polled every 15 s); spec: spec.power set On on an Off node until a new "
            "status.lastSafetyRecord"
        )
        result["operator_cpu_seconds_total"] = round(proc_sample(pid)[0] - cpu_start, 1)
        result["decisions"] = dict(
            Counter(
                f"{s.state} {s.decision} {','.join(s.reasons)}" for s in informer.store.values()
            ).most_common(8)
        )
        sample = cluster.get_json(namespace, "wn", node_name(0))
        other = compact_workernode(cluster.get_json(namespace, "wn", node_name(min(n - 1, 1))))
        compact = compact_workernode(sample)
        shared: set[int] = set()
        deep_size(other, shared)  # what a second compact body shares (interned strings)
        status_sizes = {k: deep_size(v) for k, v in (compact.get("status") or {}).items()}
        result["body_bytes"] = {
            "raw": deep_size(sample),
            "compact": deep_size(compact),
            "compact_beside_another": deep_size(compact, shared),
            "compact_parts": {k: deep_size(v) for k, v in compact.items()},
            "largest_status_fields": dict(sorted(status_sizes.items(), key=lambda kv: -kv[1])[:6]),
        }
        print(f"operator log: {op.log_path}", flush=True)
        return result
    finally:
        if informer is not None:
            await informer.stop()
        await watch_api.close()
        if op is not None:
            op.stop()
        bmc.stop()
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def start_profiler(
    directory: Path, pid: int, seconds: float, label: str
) -> subprocess.Popen[bytes] | None:
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists():
        print("py-spy not installed: no profile", flush=True)
        return None
    directory.mkdir(parents=True, exist_ok=True)
    out = directory / f"operator-{pid}-{label}.txt"
    command = [spy, "record", "--nonblocking", "-p", str(pid), "-d", str(int(seconds))]
    return subprocess.Popen(
        [*command, "-f", "raw", "-o", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--bmc-nodes", type=int, default=1000)
    parser.add_argument("--idle", type=float, default=70.0, help="seconds of the idle window")
    parser.add_argument("--settle", type=float, default=300.0, help="longest settling wait")
    parser.add_argument("--changes", type=int, default=100, help="BMC flips and spec edits")
    parser.add_argument("--change-timeout", type=float, default=120.0)
    parser.add_argument("--timeout", type=float, default=900.0, help="for the first decisions")
    parser.add_argument("--lease", type=float, default=60.0, help="lease duration (seconds)")
    parser.add_argument("--kubeconfig", type=Path)
    parser.add_argument("--profile", type=Path, help="py-spy output directory (idle window)")
    parser.add_argument(
        "--tracemalloc", type=Path, help="run the operator under tracemalloc; top allocations here"
    )
    parser.add_argument(
        "--operator-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="environment variable for the operator process (repeatable), e.g. malloc tuning",
    )
    parser.add_argument("--serve-bmc", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--state-dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_bmc is not None:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        serve_bmc(args.serve_bmc, args.state_dir)
        return 0
    workdir = Path(tempfile.mkdtemp(prefix="nw-fleet-"))
    with control_plane(args.kubeconfig, workdir) as cluster:
        result = asyncio.run(run(args, cluster, workdir))
        result["load_average"] = os.getloadavg()
        print(json.dumps(result, indent=2))
    return 0


@contextlib.contextmanager
def control_plane(kubeconfig: Path | None, workdir: Path) -> Iterator[ClusterHandle]:
    """The cluster at `kubeconfig`, or (None) a local control plane started in `workdir`
    and stopped afterwards."""
    local = None
    if kubeconfig is None:
        local = LocalCluster(state_dir=workdir / "cluster").up()
        kubeconfig = local.kubeconfig
    try:
        yield ClusterHandle(kubeconfig, local)
    finally:
        if local is not None:
            local.down()


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
    from calibration import summary  # the machine figure this run compares through

    if "--serve-bmc" not in sys.argv:  # the BMC process's first line is its JSON address
        print(summary(), flush=True)
    raise SystemExit(main())
