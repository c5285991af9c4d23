"""Karpenter's scale-out scenario on the local control plane: N pending pods -> all Running.

The control plane is `localcluster.LocalCluster` with node-lifecycle-controller added to
the controller manager (without it a new Node keeps the `not-ready` taint the API
server's admission puts on it, and no pod ever lands). Beside it, as local processes
against the API server on 127.0.0.1: kube-scheduler, KWOK (it plays the kubelet of every
Node that carries `kwok.x-k8s.io/node=fake`: node Ready, leases, pods Running) and
Karpenter's KWOK provider (it creates those Nodes for NodeClaims). The CRDs come from
the karpenter module's source in the Go module cache (`pkg/apis/crds`, and
`kwok/apis/crds` for KWOKNodeClass); KWOK's stages are the "fast" ones Karpenter's CI
installs (KWOK's node-initialize, pod-ready, pod-complete; Karpenter's own
node-heartbeat-with-lease and pod-delete from `hack/kwok/stages`).

The run mirrors `benchmarks/bench_dispatch.py`: the pods are created first (Pending:
nothing can hold them yet), then Karpenter starts and the clock runs from its start until
every pod is Running (a watch on the pods, not repeated lists: lists of 1,000 pods would
load the API server being measured). Karpenter's CPU seconds come from /proc/PID/stat,
its peak RSS from VmHWM. Every process started here is stopped by pid in `close()`, and
the objects the scenario made are removed so another benchmark can use the same
control plane afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client

from localcluster import LocalCluster, log
from nodewarden.kube.client import api_client_from
from nodewarden_doubles.ports import unused_loopback_port

HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE / "build.sh"
NODE_LIFECYCLE_CONTROLLER = "node-lifecycle-controller"
NAMESPACE = "anchor"
POD_LABEL = {"nodewarden.dev/bench": "anchor"}
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node=fake"
KARPENTER_KINDS = ("nodeclaims.karpenter.sh", "nodepools.karpenter.sh")
CLK_TCK = os.sysconf("SC_CLK_TCK")
STOP_SECONDS = 10.0


class AnchorError(RuntimeError):
    """The anchor scenario could not be built, started or cleaned up."""


def _build(*args: str) -> list[str]:
    out = subprocess.run([str(BUILD_SCRIPT), *args], stdout=subprocess.PIPE, text=True, check=False)
    if out.returncode != 0:
        raise AnchorError(f"{BUILD_SCRIPT} {' '.join(args)} failed (exit {out.returncode})")
    return out.stdout.strip().splitlines()


def anchor_binaries() -> Path:
    """Build karpenter-kwok, kwok and kube-scheduler if needed (cached); their directory."""
    override = os.environ.get("NODEWARDEN_ANCHOR_BIN")
    return Path(override) if override else Path(_build()[-1])


def module_sources() -> dict[str, Path]:
    """Source directories of the karpenter and kwok modules in the Go module cache."""
    sources: dict[str, Path] = {}
    for line in _build("--sources"):
        name, _, where = line.partition(" ")
        sources[name] = Path(where)
    return sources


class AnchorCluster(LocalCluster):
    """The project's local control plane, its controller manager also running
    node-lifecycle-controller (Ready nodes lose the not-ready taint)."""

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        if name == "kube-controller-manager":
            argv = [
                f"{arg},{NODE_LIFECYCLE_CONTROLLER}" if arg.startswith("--controllers=") else arg
                for arg in argv
            ]
        return super()._spawn(name, argv)


def proc_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def proc_peak_rss_mb(pid: int) -> float:
    """Peak resident set size of a process (VmHWM) in MiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def kwok_config(sources: dict[str, Path]) -> str:
    """KWOK's configuration file: the options Karpenter's CI deploys KWOK with (no server
    port: nothing here talks to a fake kubelet) and the "fast" stages."""
    kwok, karpenter = sources["kwok"], sources["karpenter"]
    options = {
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
        "kind": "KwokConfiguration",
        "options": {
            "manageNodesWithAnnotationSelector": KWOK_NODE_ANNOTATION,
            "nodeLeaseDurationSeconds": 40,
            "nodeLeaseParallelism": 4,
            "podPlayStageParallelism": 4,
            "nodePlayStageParallelism": 4,
            "enablePodsOnNodeSyncStreamWatch": True,
            "cidr": "10.64.0.0/16",  # pod IPs: the default /24 is too small for 1,000 pods
        },
    }
    stages = [
        kwok / "kustomize/stage/node/fast/node-initialize.yaml",
        kwok / "kustomize/stage/pod/fast/pod-ready.yaml",
        kwok / "kustomize/stage/pod/fast/pod-complete.yaml",
        karpenter / "hack/kwok/stages/node-heartbeat-with-lease.yaml",
        karpenter / "hack/kwok/stages/pod-delete.yaml",
    ]
    docs = [json.dumps(options)] + [path.read_text().strip() for path in stages]
    return "\n---\n".join(docs) + "\n"


def node_pool_manifest(max_cpu: int) -> str:
    """A KWOKNodeClass and a NodePool (linux/amd64, on-demand) that never disrupts during
    the run (the scenario measures scale-out only)."""
    node_class = {
        "apiVersion": "karpenter.kwok.sh/v1alpha1",
        "kind": "KWOKNodeClass",
        "metadata": {"name": NAMESPACE},
    }
    node_pool = {
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodePool",
        "metadata": {"name": NAMESPACE},
        "spec": {
            "template": {
                "spec": {
                    "requirements": [
                        {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
                        {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]},
                        {
                            "key": "karpenter.sh/capacity-type",
                            "operator": "In",
                            "values": ["on-demand"],
                        },
                    ],
                    "nodeClassRef": {
                        "group": "karpenter.kwok.sh",
                        "kind": "KWOKNodeClass",
                        "name": NAMESPACE,
                    },
                    "expireAfter": "Never",
                }
            },
            "limits": {"cpu": str(max_cpu)},
            "disruption": {"consolidationPolicy": "WhenEmpty", "consolidateAfter": "Never"},
        },
    }
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": [node_class, node_pool]})


def pod_body(index: int, cpu: str, memory: str) -> dict[str, Any]:
    """A bare pod with a small request (the image is never pulled: KWOK plays the kubelet)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"anchor-{index:05d}", "labels": dict(POD_LABEL)},
        "spec": {
            "containers": [
                {
                    "name": "work",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"requests": {"cpu": cpu, "memory": memory}},
                }
            ],
            "terminationGracePeriodSeconds": 0,
        },
    }


@dataclass
class Scenario:
    """Karpenter's scale-out of `pods` pending pods on the control plane of `cluster`."""

    cluster: LocalCluster
    pods: int = 1000
    cpu: str = "1"
    memory: str = "1Gi"
    timeout: float = 600.0
    bin_dir: Path | None = None
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def logs(self) -> Path:
        return self.cluster.state_dir / "logs"

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> int:
        self.logs.mkdir(parents=True, exist_ok=True)
        with (self.logs / f"{name}.log").open("ab") as out:
            proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                # out of the terminal's process group: Ctrl-C reaches only the benchmark,
                # whose `close()` stops this process by pid
                start_new_session=True,
                cwd=self.cluster.state_dir,
                env={**os.environ, **(env or {})},
            )
        self.procs[name] = proc
        return proc.pid

    def _check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                tail = (self.logs / f"{name}.log").read_text(errors="replace").splitlines()[-15:]
                raise AnchorError(f"{name} exited with {proc.returncode}:\n" + "\n".join(tail))

    def setup(self) -> None:
        """CRDs, the NodePool and KWOKNodeClass, kube-scheduler and KWOK (not Karpenter)."""
        self.bin_dir = self.bin_dir or anchor_binaries()
        sources = module_sources()
        crds = [sources["karpenter"] / "pkg/apis/crds", sources["karpenter"] / "kwok/apis/crds"]
        for crd_dir in crds:
            self.cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd_dir))
        self.cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")
        self.cluster.kubectl(
            "apply", "-f", "-", input=node_pool_manifest(max_cpu=max(1000, 4 * self.pods))
        )
        self.cluster.kubectl("create", "namespace", NAMESPACE)
        kubeconfig = str(self.cluster.kubeconfig)
        self._spawn(
            "kube-scheduler",
            [
                str(self.bin_dir / "kube-scheduler"),
                f"--kubeconfig={kubeconfig}",
                "--leader-elect=false",
                "--secure-port=0",
                "--v=1",
            ],
        )
        config = self.cluster.state_dir / "kwok.yaml"
        config.write_text(kwok_config(sources))
        self._spawn(
            "kwok",
            [str(self.bin_dir / "kwok"), f"--kubeconfig={kubeconfig}", f"--config={config}"],
        )

    def start_karpenter(self) -> int:
        assert self.bin_dir is not None
        env = {
            "KUBECONFIG": str(self.cluster.kubeconfig),
            "DISABLE_LEADER_ELECTION": "true",
            # Karpenter binds these on every interface (":port"); ports free on loopback
            "METRICS_PORT": str(unused_loopback_port()),
            "HEALTH_PROBE_PORT": str(unused_loopback_port()),
            "LOG_LEVEL": "info",
        }
        return self._spawn("karpenter", [str(self.bin_dir / "karpenter-kwok")], env)

    def run(self) -> dict[str, Any]:
        """Create the pods, start Karpenter, measure until all are Running (or timeout)."""
        self.setup()
        previous = signal.getsignal(signal.SIGTERM)
        try:
            return asyncio.run(self._measure())
        finally:
            signal.signal(signal.SIGTERM, previous)

    async def _measure(self) -> dict[str, Any]:
        # SIGTERM during the measurement cancels this task (an exception raised by a
        # Python-level handler in the middle of the event loop's I/O would skip the
        # loop's own shutdown); the caller's `close()` then stops every process
        task = asyncio.current_task()
        assert task is not None
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        api = await api_client_from(self.cluster.kubeconfig)
        try:
            # Any: raw (_preload_content=False) responses and dict bodies are used below
            core: Any = client.CoreV1Api(api)
            created = await self._create_pods(core)
            print(
                f"karpenter: created {self.pods} pending pods in {created:.1f}s "
                "(Karpenter not running)",
                flush=True,
            )
            self._check_alive()
            peers = {name: proc.pid for name, proc in self.procs.items()}
            peers |= {n: p for n, p in self.cluster.pids.items()}
            t0 = time.monotonic()
            pid = self.start_karpenter()
            peers["karpenter"] = pid
            cpu0 = {name: proc_cpu_seconds(p) for name, p in peers.items() if name != "karpenter"}
            cpu0["karpenter"] = 0.0
            first, running = await self._watch_running(core, t0)
            wall = time.monotonic() - t0
            cpu1 = {name: proc_cpu_seconds(p) for name, p in peers.items()}
            karpenter_cpu = cpu1["karpenter"] - cpu0["karpenter"]
            nodes = await core.list_node(label_selector="karpenter.sh/nodepool")
            return {
                "pods": self.pods,
                "pod_requests": {"cpu": self.cpu, "memory": self.memory},
                "all_running": running >= self.pods,
                "running": running,
                "wall_seconds_to_all_running": round(wall, 1),
                "seconds_to_first_running": round(first if first is not None else -1, 1),
                "karpenter_cpu_seconds": round(karpenter_cpu, 1),
                "karpenter_cores_average": round(karpenter_cpu / wall, 2),
                "karpenter_peak_rss_mb": round(proc_peak_rss_mb(pid), 1),
                "nodes": len(nodes.items),
                "cpu_share_of_one_core": {
                    name: round((cpu1[name] - cpu0[name]) / wall, 2) for name in sorted(peers)
                },
            }
        finally:
            await api.close()

    async def _create_pods(self, core: Any) -> float:
        sem = asyncio.Semaphore(32)
        t0 = time.monotonic()

        async def one(i: int) -> None:
            async with sem:
                await core.create_namespaced_pod(NAMESPACE, pod_body(i, self.cpu, self.memory))

        await asyncio.gather(*(one(i) for i in range(self.pods)))
        return time.monotonic() - t0

    async def _watch_running(self, core: Any, t0: float) -> tuple[float | None, int]:
        """Seconds from `t0` to the first Running pod, and how many ran by the end (all,
        or as many as by the timeout). Raw watch events, parsed for the phase only."""
        selector = ",".join(f"{k}={v}" for k, v in POD_LABEL.items())
        deadline = t0 + self.timeout
        running: set[str] = set()
        first: float | None = None

        def see(pod: dict[str, Any]) -> None:
            nonlocal first
            name = pod["metadata"]["name"]
            if (pod.get("status") or {}).get("phase") == "Running":
                if first is None:
                    first = time.monotonic() - t0
                running.add(name)
            else:
                running.discard(name)

        while len(running) < self.pods and time.monotonic() < deadline:
            self._check_alive()
            listed = await core.list_namespaced_pod(
                NAMESPACE, label_selector=selector, _preload_content=False
            )
            body = json.loads(await listed.read())
            running.clear()
            for pod in body["items"]:
                see(pod)
            version = body["metadata"]["resourceVersion"]
            remaining = max(1, int(deadline - time.monotonic()))
            stream = await core.list_namespaced_pod(
                NAMESPACE,
                label_selector=selector,
                watch=True,
                resource_version=version,
                timeout_seconds=min(remaining, 60),
                _preload_content=False,
            )
            with contextlib.closing(stream):
                async for line in stream.content:
                    event = json.loads(line)
                    if event.get("type") == "ERROR":
                        break  # expired resource version: list again
                    if event.get("type") == "DELETED":
                        running.discard(event["object"]["metadata"]["name"])
                    else:
                        see(event["object"])
                    if len(running) >= self.pods or time.monotonic() >= deadline:
                        break
        return first, len(running)

    # --- teardown ----------------------------------------------------------------------

    def stop_processes(self) -> None:
        """Karpenter first (it must not react to the cleanup), then KWOK and the scheduler:
        TERM, then KILL after STOP_SECONDS, each by the pid started here."""
        for names in (["karpenter"], ["kwok", "kube-scheduler"]):
            procs = [self.procs.pop(n) for n in names if n in self.procs]
            for proc in procs:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for proc in procs:
                try:
                    proc.wait(timeout=STOP_SECONDS)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()

    def remove_objects(self) -> None:
        """Delete what the scenario made: the pods (forced: no kubelet is left to confirm),
        the namespace, NodeClaims, Nodes, NodePool, KWOKNodeClass (their finalizers
        dropped: no Karpenter is left to run them), KWOK's node leases, the CRDs."""
        kubectl = self.cluster.kubectl
        kubectl(
            "-n",
            NAMESPACE,
            "delete",
            "pods",
            "--all",
            "--force",
            "--grace-period=0",
            "--wait=false",
            check=False,
            timeout=300,
        )
        kinds = [*KARPENTER_KINDS, "kwoknodeclasses.karpenter.kwok.sh", "nodes"]
        for kind in kinds:
            # only Karpenter's Nodes (this control plane has no others, but be exact)
            selector = ["-l", "karpenter.sh/nodepool"] if kind == "nodes" else []
            listed = kubectl("get", kind, *selector, "-o", "json", check=False)
            if listed.returncode != 0:
                continue
            items = json.loads(listed.stdout)["items"]
            held = [o for o in items if o["metadata"].get("finalizers")]
            for obj in held:
                obj["metadata"]["finalizers"] = []
            if held:
                doc = json.dumps({"apiVersion": "v1", "kind": "List", "items": held})
                kubectl("replace", "-f", "-", input=doc, check=False, timeout=300)
            if items:
                kubectl(
                    "delete",
                    kind,
                    *(selector or ["--all"]),
                    "--wait=false",
                    check=False,
                    timeout=300,
                )
        kubectl("-n", "kube-node-lease", "delete", "leases", "--all", check=False)
        left = kubectl("get", "nodes", "-l", "karpenter.sh/nodepool", "-o", "name", check=False)
        log(f"anchor cleanup: Karpenter's Nodes left: {len(left.stdout.split())}")
        kubectl("delete", "namespace", NAMESPACE, "--timeout=120s", check=False, timeout=180)
        sources = module_sources()
        for crd_dir in (
            sources["karpenter"] / "pkg/apis/crds",
            sources["karpenter"] / "kwok/apis/crds",
        ):
            kubectl("delete", "-f", str(crd_dir), "--wait=false", check=False)

    def close(self) -> None:
        """Stop every process started here, then remove the scenario's objects."""
        try:
            self.stop_processes()
        finally:
            if self.cluster.alive():
                try:
                    self.remove_objects()
                except (OSError, subprocess.SubprocessError) as exc:
                    log(f"anchor cleanup of the API objects failed: {exc}")
            else:
                print("anchor: control plane already stopped", file=sys.stderr)
