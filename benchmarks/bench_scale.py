#!/usr/bin/env python3
"""Benchmark: the live operator over a mixed fleet -- cloud VMs, side nodes, a queue.

    .venv/bin/python benchmarks/bench_scale.py --nodes 1000 [--nodes 3000 ...]
        [--containers-per-node 0.5] [--idle 60] [--changes 50] [--profile DIR]

For each `--nodes N` (the default: 1,000; `--nodes 10000` is the fleet of issue 14), on a
fresh namespace of one local control plane (or `--kubeconfig`):

- 80 % cloud VMs: created in the stub cloud (`nodewarden_doubles.stubcloud`, its own
  process) before the operator starts, tagged as this dispatcher's, with the init script
  the operator would give them (its SSH key, the instance secret it derives), so the
  operator adopts them: it creates their WorkerNodes and probes them over SSH. Each stub
  VM is a real asyncssh server on its own loopback port inside the one stub cloud
  process (no sharing): a probe is a real SSH login plus the ready and runner commands,
  answered by the stub worker from memory (no subprocess), so a probe costs a handshake
  on each side and little else. The probe rate is the product's (`dispatch.probe_interval`
  10 s, `max_probes_per_second` 50), so a full sweep of N VMs takes at least N/50 s;
- 20 % side nodes behind ONE fake BMC process (`nodewarden_doubles.fakebmc`, HTTPS, one
  Redfish system each, all Off; their SSH endpoints are not admitted: an Off node is not
  probed anyway), as in bench_power_fleet.py (whose fake BMC, operator start, watch and
  audit-log code this script reuses);
- `--containers-per-node` x N ContainerDispatches (5,000 at 10,000 nodes), Queued, each
  needing a GPU type while `maxNodes` is the VM count: they wait ("max nodes reached")
  and keep the dispatcher planning every round over the whole queue.

The PowerPolicy keeps the fleet still (idle threshold 24 h, boot grace, heartbeat
staleness and lame-after 2 h), so the steady state is a fleet where nothing changes.
Printed (JSON), per size:

- seconds from the operator's start until every node is acknowledged and has its first
  decision (`status.state` or `status.lastSafetyRecord`; a DEFER for missing telemetry
  is a decision), and until every node has fresh facts (cloud VM: a probe recorded in
  `status.lastProbe`; side node: `status.observedPower`);
- operator peak RSS and CPU seconds (start-up, and the whole run);
- reconcile lag p50 / p99, fact change -> decision written: BMC power flips (until
  `status.observedPower` changes; bounded below by the 15 s poll) and spec edits
  (`spec.power: On` on an Off side node, until a new `status.lastSafetyRecord`);
- API requests per second in the steady state by verb and resource (the API server's
  audit log, the operator's own identity), its CPU share then;
- WorkerNode status writes by phase (start-up, settling, idle, changes), per node and
  per changed node (the write economy of issue 14: at most one per real change, none
  when nothing changed).

Targets (issue 14; reported, not asserted): first decisions <= 60 s at 10,000 nodes,
RSS <= 1 GB, lag p99 <= 5 s, zero writes and < 5 % of a core while nothing changes.
The 10,000 run is heavy (the stub cloud's 8,000 SSH servers, ~430 MB; the operator
~1.2 GB; the API server and etcd ~1 GB together): run it alone on the machine, not while
`/tmp/nodewarden-ci.lock` exists; it takes some 20 minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO / "e2e"), str(REPO / "benchmarks")]

import yaml  # noqa: E402

from bench_dispatch import proc_sample as _proc_sample  # noqa: E402
from bench_power_fleet import (  # noqa: E402
    BmcProcess,
    Seen,
    Watcher,
    audit_requests,
    change_facts,
    control_plane,
    counters,
    delta,
    memory,
    node_body,
    node_name,
    seen,
    start_operator,
    start_profiler,
    write_secrets,
)
from clusterkit import ClusterHandle  # noqa: E402
from dispatchkit import DispatchEnv, container  # noqa: E402
from nodewarden.api.kinds import CONTAINER_DISPATCH, WORKER_NODE  # noqa: E402
from nodewarden.cloud import build_cloud  # noqa: E402
from nodewarden.kube.client import Kube, api_client_from  # noqa: E402
from nodewarden.kube.informer import Informer  # noqa: E402
from nodewarden.kube.store import EventType  # noqa: E402
from nodewarden.pool.identity import instance_secret, master_secret  # noqa: E402
from nodewarden_doubles.stubcloud.process import StubCloudProcess  # noqa: E402

DISPATCHER = "bench"
EVALUATE_INTERVAL = 30.0
STILL_POLICY = {
    "idleThreshold": "24h",
    "bootGrace": "2h",
    "minOn": "0s",
    "cooldown": "0s",
    "heartbeatStaleAfter": "2h",
    "dispatch": {"maxAttempts": 3, "lameAfter": "2h", "lameMinProbes": 3, "takeoverAfter": "2h"},
}


# --- the benchmark's view of a WorkerNode ------------------------------------------------


@dataclass(frozen=True, slots=True)
class ScaleSeen(Seen):
    cloud: bool = False
    probed: bool = False  # a probe result is in status (cloud VM)
    status_sig: tuple[tuple[str, int], ...] = ()  # each status field's value, hashed


def scale_seen(raw: Mapping[str, Any]) -> ScaleSeen:
    base = seen(raw)
    status = raw.get("status") or {}
    spec = raw.get("spec") or {}
    cloud = spec.get("nodeType") == "CloudVM"
    return ScaleSeen(
        **{f: getattr(base, f) for f in Seen.__dataclass_fields__},
        cloud=cloud,
        probed=bool(status.get("lastProbe")),
        status_sig=tuple(
            sorted((k, hash(json.dumps(v, sort_keys=True))) for k, v in status.items())
        ),
    )


class ScaleWatcher(Watcher):
    """Watcher + when each node first had fresh facts."""

    def __init__(self) -> None:
        super().__init__()
        self.fresh: dict[str, float] = {}
        self.anatomy: Counter[str] = Counter()
        """Status writes seen by the watch, by the set of status fields each changed."""

    def handler(self, etype: EventType, old: Seen | None, new: Seen | None) -> None:
        super().handler(etype, old, new)
        if isinstance(old, ScaleSeen) and isinstance(new, ScaleSeen):
            before, after = dict(old.status_sig), dict(new.status_sig)
            changed = sorted(
                k for k in before.keys() | after.keys() if before.get(k) != after.get(k)
            )
            kind = "cloud" if new.cloud else "side"
            self.anatomy[f"{kind}: {','.join(changed) or '(metadata/spec only)'}"] += 1
        if not isinstance(new, ScaleSeen) or new.name in self.fresh:
            return
        if (new.cloud and new.probed) or (not new.cloud and new.power is not None):
            self.fresh[new.name] = time.monotonic()


# --- the fleet ----------------------------------------------------------------------------


async def create_cloud_vms(env: DispatchEnv, n: int) -> float:
    """`n` stub VMs tagged as ours, each with the init script the operator would write."""
    stub: StubCloudProcess = env.stub
    facade = build_cloud(
        stub.cloud_config(ops_per_second=0, max_concurrent_creates=0),
        stub.cloud_credentials(),
        DISPATCHER,
    )
    small = next(t for t in facade.catalogue if t.name == "small")
    master = master_secret(env.ssh_key)
    gate = asyncio.Semaphore(32)
    t0 = time.monotonic()

    async def one(i: int) -> None:
        name = f"{DISPATCHER}-small-{i:05d}"
        request, _ = facade.create_request(
            name=name,
            instance_type=small,
            ssh_public_key=env.ssh_key.public_key,
            tags={facade.tag_keys.node: name, facade.tag_keys.idle_behavior: "run"},
            login_user="root",
            instance_secret=instance_secret(master, name),
        )
        async with gate:
            await facade.create(request)

    await asyncio.gather(*(one(i) for i in range(n)))
    await facade.close()
    return time.monotonic() - t0


async def create_objects(
    kubeconfig: Path, namespace: str, bodies: list[tuple[Any, dict[str, Any]]]
) -> float:
    kube = Kube(await api_client_from(kubeconfig), field_manager="bench")
    gate = asyncio.Semaphore(32)
    t0 = time.monotonic()

    async def one(kind: Any, body: dict[str, Any]) -> None:
        async with gate:
            await kube.create(kind, namespace, body)

    await asyncio.gather(*(one(k, b) for k, b in bodies))
    await kube.close()
    return time.monotonic() - t0


def gpu_container(i: int) -> dict[str, Any]:
    body = container(f"q{i:05d}", 900_000 + i, vcpus=1, ram="1Gi", gpus=1, duration=3600)
    body.pop("apiVersion")
    body.pop("kind")
    return body


def write_config(env: DispatchEnv, bmc: BmcProcess, lease: float) -> None:
    """The DispatchEnv's config with the product's timing (its test knobs removed), the
    fake BMC admitted, and a lease a loaded machine can renew."""
    config = yaml.safe_load(env.config_path.read_text())
    config.pop("resync_interval", None)
    config["dispatch"] = {"ssh_private_key_secret": config["dispatch"]["ssh_private_key_secret"]}
    config["cloud"]["max_concurrent_creates"] = 8
    config["credentials"] = {
        "bmc_endpoints": [bmc.endpoint.removeprefix("https://")],
        "ssh_endpoints": [],
    }
    config["leader_election"] = {"lease_duration": lease, "renew_interval": max(10.0, lease / 6)}
    env.config_path.write_text(yaml.safe_dump(config))


# --- one size -----------------------------------------------------------------------------


class OperatorExited(Exception):
    """The operator process is gone (e.g. it lost its lease on a starved machine)."""


def proc_sample(pid: int) -> tuple[float, int]:
    """(cpu seconds, rss bytes) of the operator; OperatorExited once it is gone."""
    try:
        return _proc_sample(pid)
    except (OSError, StopIteration):
        raise OperatorExited(pid) from None


def per_node(counts: Mapping[str, int], nodes: int) -> float | None:
    return round(sum(counts.values()) / nodes, 2) if nodes else None


def workernode_writes(requests: Mapping[str, int]) -> dict[str, int]:
    return {k: v for k, v in requests.items() if "workernodes" in k and _write(k)}


def _write(key: str) -> bool:
    return key.split(" ", 1)[0] in ("create", "update", "patch", "delete")


async def run_size(
    args: argparse.Namespace, cluster: ClusterHandle, workdir: Path, n: int
) -> dict[str, Any]:
    n_side = n // 5
    n_cloud = n - n_side
    n_containers = round(n * args.containers_per_node)
    namespace = f"scale-{uuid.uuid4().hex[:6]}"
    workdir = workdir / namespace
    workdir.mkdir(parents=True)
    cluster.kubectl("create", "namespace", namespace)
    result: dict[str, Any] = {
        "nodes": n,
        "cloud_vms": n_cloud,
        "side_nodes": n_side,
        "containers": n_containers,
    }
    bmc = BmcProcess.start(max(n_side, 1), workdir)
    env: DispatchEnv | None = None
    op = None
    peak = 0
    informer: Informer[Seen] | None = None
    watch_api = await api_client_from(cluster.kubeconfig)
    try:
        write_secrets(cluster, namespace, bmc)
        env = DispatchEnv.create(
            cluster,
            namespace,
            workdir,
            dispatcher_id=DISPATCHER,
            policy={**STILL_POLICY, "maxNodes": n_cloud},
        )
        write_config(env, bmc, args.lease)
        result["create_vms_seconds"] = round(await create_cloud_vms(env, n_cloud), 1)
        bodies: list[tuple[Any, dict[str, Any]]] = [
            (WORKER_NODE, node_body(i, bmc)) for i in range(n_side)
        ]
        bodies += [(CONTAINER_DISPATCH, gpu_container(i)) for i in range(n_containers)]
        result["create_objects_seconds"] = round(
            await create_objects(cluster.kubeconfig, namespace, bodies), 1
        )
        print(f"[{n}] fleet created: {json.dumps(result)}", flush=True)

        watcher = ScaleWatcher()
        informer = Informer(watch_api, WORKER_NODE, scale_seen, namespace=namespace)
        informer.add_handler(watcher.handler)
        informer.start()
        await informer.wait_synced()

        wall_start = datetime.now().astimezone()
        t0 = time.monotonic()
        op = await asyncio.to_thread(
            start_operator, cluster.operator_kubeconfig, env.config_path, workdir
        )
        pid = op.proc.pid
        if args.profile:
            start_profiler(args.profile, pid, 90, f"{n}-startup")
        cpu_start, _ = proc_sample(pid)

        def sample() -> None:
            nonlocal peak
            peak = max(peak, proc_sample(pid)[1])

        async def until_all(seen_at: dict[str, float], longest: float, what: str) -> None:
            while len(seen_at) < n and time.monotonic() - t0 < longest:
                await asyncio.sleep(1)
                sample()
            done = len(seen_at) >= n
            result[f"seconds_to_every_{what}"] = round(time.monotonic() - t0, 1) if done else None
            result[f"nodes_{what}"] = len(seen_at)
            if seen_at:
                times = sorted(t - t0 for t in seen_at.values())
                result[f"{what}_p50_seconds"] = round(times[len(times) // 2], 1)
            print(f"[{n}] {what}: {len(seen_at)}/{n}", flush=True)

        await until_all(watcher.first, args.timeout, "first_decision")
        result["operator_cpu_seconds_to_first_decisions"] = round(
            proc_sample(pid)[0] - cpu_start, 1
        )
        await until_all(watcher.fresh, args.fresh_timeout, "node_fresh")

        # settle: no node's state or decision changed for 45 s
        settle_end = time.monotonic() + args.settle
        while (
            time.monotonic() < settle_end and time.monotonic() - watcher.last_decision_change < 45
        ):
            await asyncio.sleep(1)
            sample()
        result["settled"] = time.monotonic() - watcher.last_decision_change >= 45
        result["settle_seconds"] = round(time.monotonic() - t0, 1)
        wall_settled = datetime.now().astimezone()
        anatomy_startup = Counter(watcher.anatomy)

        # steady state: nothing changes
        m0, w0 = counters(op), watcher.modified
        wall0 = datetime.now().astimezone()
        cpu0 = proc_sample(pid)[0]
        t_idle = time.monotonic()
        profiler = (
            start_profiler(args.profile, pid, args.idle, f"{n}-idle") if args.profile else None
        )
        await asyncio.sleep(args.idle)
        idle = time.monotonic() - t_idle
        cpu1, rss_idle = proc_sample(pid)
        wall1 = datetime.now().astimezone()
        m1, w1 = counters(op), watcher.modified
        if profiler is not None:
            profiler.wait()
        peak = max(peak, rss_idle)
        audited = audit_requests(cluster, namespace, wall0, wall1, verbs=None)
        result["steady"] = {
            "seconds": round(idle, 1),
            "operator_cpu_share": round((cpu1 - cpu0) / idle, 3),
            "api_requests_per_second": {
                k: round(v / idle, 2) for k, v in sorted(audited.items(), key=lambda kv: -kv[1])
            },
            "api_writes": {k: v for k, v in audited.items() if _write(k)},
            "workernode_watch_modified_events": w1 - w0,
            "operator_counters": delta(m1, m0),
        }
        result["operator_rss_idle_mb"] = round(rss_idle / 2**20, 1)
        result["operator_memory_idle"] = memory(pid)

        # fact changes on side nodes: BMC flips and spec edits
        k = min(args.changes, n_side // 2)
        wall_changes = datetime.now().astimezone()
        anatomy_before_changes = Counter(watcher.anatomy)
        result["fact_change_to_decision_written"] = await change_facts(
            cluster, namespace, bmc, watcher, informer, k, args.change_timeout
        )
        await asyncio.sleep(5)  # writes that follow the decision (the intent, conditions)
        wall_end = datetime.now().astimezone()
        startup = audit_requests(cluster, namespace, wall_start, wall_settled, verbs=None)
        changes = audit_requests(cluster, namespace, wall_changes, wall_end, verbs=None)
        status_patches_startup = audit_requests(
            cluster, namespace, wall_start, wall_settled, verbs=("patch",), by_object=True
        )
        status_patches_changes = audit_requests(
            cluster, namespace, wall_changes, wall_end, verbs=("patch",), by_object=True
        )
        wn_startup = Counter(
            {
                name: v
                for name, v in status_patches_startup.items()
                if name.startswith("workernodes/status/")
            }
        )
        wn_changes = Counter(
            {
                name: v
                for name, v in status_patches_changes.items()
                if name.startswith("workernodes/status/")
            }
        )
        changed_nodes = {f"workernodes/status/{node_name(i)}" for i in range(2 * k)}
        result["workernode_writes"] = {
            "startup_to_settled": workernode_writes(startup),
            "startup_status_patches_per_node": {
                "mean": per_node(wn_startup, n),
                "max": max(wn_startup.values(), default=0),
                "distribution": dict(sorted(Counter(wn_startup.values()).items())),
            },
            "idle": workernode_writes(result["steady"]["api_writes"]),
            "changes": workernode_writes(changes),
            "status_patches_per_changed_node": {
                "mean": per_node(Counter({k2: wn_changes[k2] for k2 in changed_nodes}), 2 * k),
                "on_unchanged_nodes": sum(
                    v for k2, v in wn_changes.items() if k2 not in changed_nodes
                ),
                "distribution": dict(
                    sorted(Counter(wn_changes[k2] for k2 in changed_nodes).items())
                ),
            },
        }
        result["workernode_writes"]["fields_changed_per_write"] = {
            "startup_to_settled": dict(anatomy_startup.most_common()),
            "changes": dict((watcher.anatomy - anatomy_before_changes).most_common()),
        }
        result["api_requests_startup_to_settled"] = dict(
            sorted(startup.items(), key=lambda kv: -kv[1])
        )
        result["operator_cpu_seconds_total"] = round(proc_sample(pid)[0] - cpu_start, 1)
        result["operator_peak_rss_mb"] = round(peak / 2**20, 1)
        result["decisions"] = dict(
            Counter(
                f"{s.state} {s.decision} {','.join(s.reasons)}" for s in informer.store.values()
            ).most_common(8)
        )
        result["operator_log"] = str(op.log_path)
        return result
    except OperatorExited:
        # a partial result: what was measured before the operator stopped
        result["operator_exited"] = f"the operator exited; its log: {op.log_path if op else '?'}"
        result["operator_peak_rss_mb"] = round(peak / 2**20, 1)
        return result
    finally:
        if informer is not None:
            await informer.stop()
        await watch_api.close()
        if op is not None:
            op.stop()
        if env is not None:
            env.stub.stop()
        bmc.stop()
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, action="append", help="fleet size (repeatable)")
    parser.add_argument("--containers-per-node", type=float, default=0.5)
    parser.add_argument("--idle", type=float, default=60.0, help="seconds of the steady window")
    parser.add_argument("--settle", type=float, default=240.0, help="longest settling wait")
    parser.add_argument("--changes", type=int, default=50, help="BMC flips and spec edits each")
    parser.add_argument("--change-timeout", type=float, default=120.0)
    parser.add_argument("--timeout", type=float, default=600.0, help="for the first decisions")
    parser.add_argument(
        "--fresh-timeout", type=float, default=600.0, help="for fresh facts (from the start)"
    )
    parser.add_argument("--lease", type=float, default=120.0, help="lease duration (seconds)")
    parser.add_argument("--kubeconfig", type=Path)
    parser.add_argument("--profile", type=Path, help="py-spy output directory")
    args = parser.parse_args()
    sizes = args.nodes or [1000]
    workdir = Path(tempfile.mkdtemp(prefix="nw-scale-"))
    results = []
    with control_plane(args.kubeconfig, workdir) as cluster:
        for n in sizes:
            load_before = os.getloadavg()
            result = asyncio.run(run_size(args, cluster, workdir, n))
            result["load_average_before"] = load_before
            result["load_average_after"] = os.getloadavg()
            results.append(result)
            print(json.dumps(result, indent=2), flush=True)
    print(
        "summary (nodes: first decisions s / fresh s / peak RSS MB / CPU s / steady cpu share "
        "/ steady writes / lag p99 bmc, spec s)"
    )
    for r in results:
        if "operator_exited" in r:
            print(f"  {r['nodes']:>6}: {r['operator_exited']}; partial: {json.dumps(r)[:300]}")
            continue
        lag = r["fact_change_to_decision_written"]
        print(
            f"  {r['nodes']:>6}: {r['seconds_to_every_first_decision']} / "
            f"{r['seconds_to_every_node_fresh']} / {r['operator_peak_rss_mb']} / "
            f"{r['operator_cpu_seconds_total']} / {r['steady']['operator_cpu_share']} / "
            f"{sum(r['steady']['api_writes'].values())} / "
            f"{lag['bmc']['p99_seconds']}, {lag['spec']['p99_seconds']}"
        )
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
    from calibration import summary  # the machine figure this run compares through

    print(summary(), flush=True)
    raise SystemExit(main())
