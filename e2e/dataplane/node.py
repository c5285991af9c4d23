"""A one-node cluster inside the e2e network namespace: control plane plus a real node.

Runs inside the node namespace (`e2e/dataplane/run.py` re-executes itself there with
`ip netns exec`, so every process below shares one mount namespace: the kubelet's
volume mounts are visible to containerd). Components, all started and stopped by pid:

- the control plane of `e2e/localcluster.py` (etcd, kube-apiserver,
  kube-controller-manager) with what a node needs on top: the API server listens on the
  node IP too and advertises it (the `kubernetes` Service's endpoint), its serving
  certificate also names the node IP and the Service IP, it reaches the kubelet with a
  client certificate, and the controller manager runs the controllers of Deployments,
  ReplicaSets, EndpointSlices, PodDisruptionBudgets, node lifecycle and the root CA
  ConfigMap;
- kube-scheduler; containerd (Debian) with runc and the bridge CNI plugin; the kubelet
  (node client certificate `system:node:<name>`, cgroupfs driver, its own cgroup root
  per run); kube-proxy in iptables mode.

State lives under one directory per run; the node's cgroups under `/nwe2e-<id>`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from dataplane.images import PAUSE_REF
from dataplane.netns import NODE_IP, POD_CIDR
from localcluster import LocalCluster, _issue, _key, _name, _pem_cert, _pem_key

REPO = Path(__file__).resolve().parent.parent.parent
DATAPLANE_BUILD = REPO / "e2e" / "dataplane" / "build.sh"
NODE_NAME = "nwe2e-node"
SERVICE_IP = "10.0.0.1"
CNI_BIN = Path("/usr/lib/cni")
KCM_CONTROLLERS = [
    "garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "deployment-controller",
    "replicaset-controller",
    "root-ca-certificate-publisher-controller",
    "node-lifecycle-controller",
    "taint-eviction-controller",
    "endpoints-controller",
    "endpointslice-controller",
    "disruption-controller",
    "pod-garbage-collector-controller",
]
CGROUP_ROOT = Path("/sys/fs/cgroup")


class NodeError(RuntimeError):
    """A node component failed to start; the message names its log."""


def dataplane_binaries() -> Path:
    """Build kubelet, kube-scheduler, kube-proxy, kubeconform if needed (cached); their dir."""
    override = os.environ.get("NODEWARDEN_DATAPLANE_BIN")
    if override:
        return Path(override)
    out = subprocess.run([str(DATAPLANE_BUILD)], stdout=subprocess.PIPE, text=True, check=False)
    if out.returncode != 0:
        raise NodeError(f"data plane build failed (exit {out.returncode}); see output above")
    return Path(out.stdout.strip().splitlines()[-1])


def with_flags(argv: list[str], set_flags: dict[str, str | None]) -> list[str]:
    """argv with each `--name` of `set_flags` replaced (value) or removed (None); new ones added."""
    out: list[str] = []
    seen: set[str] = set()
    for arg in argv:
        name = arg.split("=", 1)[0]
        if name in set_flags:
            seen.add(name)
            value = set_flags[name]
            if value is not None:
                out.append(f"{name}={value}")
        else:
            out.append(arg)
    out += [f"{n}={v}" for n, v in set_flags.items() if n not in seen and v is not None]
    return out


def cgroup_controllers() -> list[Path]:
    """Mounted cgroup hierarchies (v1 controllers and the v2 unified one)."""
    mounts = Path("/proc/self/mounts").read_text().splitlines()
    found = []
    for line in mounts:
        parts = line.split()
        if parts[2] in ("cgroup", "cgroup2") and parts[1].startswith(str(CGROUP_ROOT)):
            found.append(Path(parts[1]))
    return found


class NodeCluster(LocalCluster):
    """`LocalCluster` plus scheduler, containerd, kubelet and kube-proxy (see module doc)."""

    def __init__(self, state_dir: Path, run_id: str, namespace: str = "default") -> None:
        super().__init__(state_dir=state_dir, namespace=namespace)
        self.run_id = run_id
        self.node_bin = dataplane_binaries()
        self.cgroup_root = f"/nwe2e-{run_id}"

    # --- control plane: the flags a node needs ----------------------------------------

    def _start_apiserver(self, timeout: float) -> None:
        self._serving_cert_for_node()
        super()._start_apiserver(timeout)

    def _serving_cert_for_node(self) -> None:
        """Re-issue the API server's certificate with the node IP and the Service IP."""
        key = _key()
        names = ["127.0.0.1", NODE_IP, SERVICE_IP, "localhost", "kubernetes"]
        names += ["kubernetes.default", "kubernetes.default.svc"]
        names += ["kubernetes.default.svc.cluster.local"]
        cert = _issue(_name("kube-apiserver"), key, self._ca(), server_names=names)
        self._write_pki("apiserver.crt", _pem_cert(cert))
        self._write_pki("apiserver.key", _pem_key(key))

    def _ca(self) -> tuple[Any, Any]:
        """The cluster CA (certificate, key) written by `LocalCluster`."""
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization

        ca = x509.load_pem_x509_certificate((self.pki / "ca.crt").read_bytes())
        key = serialization.load_pem_private_key((self.pki / "ca.key").read_bytes(), None)
        return ca, key

    def _write_pki(self, name: str, data: bytes) -> None:
        path = self.pki / name
        path.write_bytes(data)
        path.chmod(0o600)

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        pki = self.pki
        if name == "kube-apiserver":
            argv = with_flags(
                argv,
                {
                    # all addresses of the node namespace: lo, the node IP, the Pod bridge
                    "--bind-address": "0.0.0.0",  # noqa: S104
                    "--advertise-address": NODE_IP,
                    "--endpoint-reconciler-type": None,  # default: keeps `kubernetes` endpoints
                    "--kubelet-client-certificate": str(pki / "admin.crt"),
                    "--kubelet-client-key": str(pki / "admin.key"),
                    "--kubelet-preferred-address-types": "InternalIP",
                },
            )
        elif name == "kube-controller-manager":
            argv = with_flags(argv, {"--controllers": ",".join(KCM_CONTROLLERS)})
        return super()._spawn(name, argv)

    def install_crds(self) -> None:
        """Nothing: the chart under test installs its CRDs."""

    # --- the node ------------------------------------------------------------------------

    @property
    def node_dir(self) -> Path:
        return self.state_dir / "node"

    @property
    def socket_dir(self) -> Path:
        """Short path for sockets (a unix socket path has at most 104-108 bytes)."""
        return Path(f"/run/nwe2e-{self.run_id}")

    @property
    def containerd_socket(self) -> Path:
        return self.socket_dir / "containerd.sock"

    def up(self, timeout: float = 120.0) -> NodeCluster:
        super().up(timeout)
        try:
            self._node_identity()
            self._start_scheduler()
            self._start_containerd(timeout)
        except BaseException:
            self.down(remove_state=False)
            raise
        return self

    def start_kubelet(self, timeout: float = 120.0) -> None:
        """Start kubelet and kube-proxy (after the images are imported); wait for Ready."""
        try:
            self._start_kubelet()
            self._start_kube_proxy()
            self._wait_node_ready(timeout)
        except BaseException:
            self.down(remove_state=False)
            raise

    def _node_identity(self) -> None:
        key = _key()
        cert = _issue(
            _name(f"system:node:{NODE_NAME}", "system:nodes"), key, self._ca(), client=True
        )
        self._write_pki("node.crt", _pem_cert(cert))
        self._write_pki("node.key", _pem_key(key))
        self.kubectl(
            "create", "clusterrolebinding", "nwe2e-nodes", "--clusterrole=system:node",
            "--group=system:nodes",
        )  # fmt: skip
        config = json.loads(self.kubeconfig.read_text())
        config["users"] = [
            {
                "name": "node",
                "user": {
                    "client-certificate": str(self.pki / "node.crt"),
                    "client-key": str(self.pki / "node.key"),
                },
            }
        ]
        config["contexts"][0]["context"]["user"] = "node"
        node_config = self.state_dir / "node.kubeconfig"
        node_config.write_text(json.dumps(config))
        node_config.chmod(0o600)

    def _start_scheduler(self) -> None:
        self._spawn(
            "kube-scheduler",
            [
                str(self.node_bin / "kube-scheduler"),
                f"--kubeconfig={self.kubeconfig}",
                "--leader-elect=false",
                "--secure-port=0",
                "--v=1",
            ],
        )

    def _start_containerd(self, timeout: float) -> None:
        d = self.node_dir
        for sub in ("containerd/root", "containerd/state", "cni/net.d", "cni/ipam", "logs"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        self.socket_dir.mkdir(mode=0o700, exist_ok=True)
        (d / "cni" / "net.d" / "10-nwe2e.conflist").write_text(
            json.dumps(
                {
                    "cniVersion": "1.0.0",
                    "name": "nwe2e",
                    "plugins": [
                        {
                            "type": "bridge",
                            "bridge": "cni0",
                            "isGateway": True,
                            "ipMasq": False,
                            "hairpinMode": True,
                            "ipam": {
                                "type": "host-local",
                                "ranges": [[{"subnet": POD_CIDR}]],
                                "routes": [{"dst": "0.0.0.0/0"}],
                                "dataDir": str(d / "cni" / "ipam"),
                            },
                        }
                    ],
                },
                indent=2,
            )
        )
        cri = '[plugins."io.containerd.grpc.v1.cri"]'
        config = d / "containerd.toml"
        config.write_text(
            f"""version = 2
root = "{d / "containerd" / "root"}"
state = "{d / "containerd" / "state"}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "{self.containerd_socket}"
[ttrpc]
  address = "{self.containerd_socket}.ttrpc"
{cri}
  sandbox_image = "{PAUSE_REF}"
  # this sandbox refuses a negative oom_score_adj even to root
  restrict_oom_score_adj = true
  disable_apparmor = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
{cri[:-1]}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
{cri[:-1]}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
{cri[:-1]}.containerd.runtimes.runc.options]
  SystemdCgroup = false
{cri[:-1]}.cni]
  bin_dir = "{CNI_BIN}"
  conf_dir = "{d / "cni" / "net.d"}"
"""
        )
        proc = self._spawn("containerd", ["containerd", f"--config={config}"])
        self._wait("containerd", lambda: self.ctr("version").returncode == 0, proc, timeout)

    def ctr(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ctr", f"--address={self.containerd_socket}", "--namespace=k8s.io", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def import_image(self, archive: Path) -> None:
        out = self.ctr("images", "import", "--all-platforms", str(archive))
        if out.returncode != 0:
            raise NodeError(f"ctr images import {archive}: {out.stderr.strip()}")

    def _start_kubelet(self) -> None:
        d = self.node_dir
        for hierarchy in cgroup_controllers():
            (hierarchy / self.cgroup_root.lstrip("/")).mkdir(exist_ok=True)
        resolv = d / "resolv.conf"
        resolv.write_text("nameserver 127.0.0.1\n")  # no DNS anywhere: a Pod resolves nothing
        config = d / "kubelet.yaml"
        config.write_text(
            json.dumps(
                {
                    "apiVersion": "kubelet.config.k8s.io/v1beta1",
                    "kind": "KubeletConfiguration",
                    "address": NODE_IP,
                    "port": 10250,
                    "readOnlyPort": 0,
                    "healthzBindAddress": "127.0.0.1",
                    "healthzPort": 10248,
                    "authentication": {
                        "anonymous": {"enabled": False},
                        "webhook": {"enabled": True},
                        "x509": {"clientCAFile": str(self.pki / "ca.crt")},
                    },
                    "authorization": {"mode": "Webhook"},
                    "cgroupDriver": "cgroupfs",
                    "cgroupRoot": self.cgroup_root,
                    "failSwapOn": False,
                    "failCgroupV1": False,
                    "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
                    "podLogsDir": str(d / "pod-logs"),
                    "resolvConf": str(resolv),
                    "clusterDomain": "cluster.local",
                    "maxPods": 30,
                    "imageGCHighThresholdPercent": 100,
                    "imageGCLowThresholdPercent": 99,
                    "evictionHard": {
                        "memory.available": "100Mi",
                        "nodefs.available": "1%",
                        "imagefs.available": "1%",
                    },
                    "syncFrequency": "10s",
                    "fileCheckFrequency": "10s",
                    "nodeStatusUpdateFrequency": "5s",
                    "serializeImagePulls": False,
                }
            )
        )
        self._spawn(
            "kubelet",
            [
                str(self.node_bin / "kubelet"),
                f"--config={config}",
                f"--kubeconfig={self.state_dir / 'node.kubeconfig'}",
                f"--root-dir={d / 'kubelet'}",
                f"--cert-dir={d / 'kubelet-pki'}",
                f"--hostname-override={NODE_NAME}",
                f"--node-ip={NODE_IP}",
                "--v=1",
            ],
        )

    def _start_kube_proxy(self) -> None:
        config = self.node_dir / "kube-proxy.yaml"
        config.write_text(
            json.dumps(
                {
                    "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
                    "kind": "KubeProxyConfiguration",
                    "mode": "iptables",
                    "clusterCIDR": POD_CIDR,
                    "hostnameOverride": NODE_NAME,
                    "bindAddress": NODE_IP,
                    "healthzBindAddress": "127.0.0.1:10256",
                    "metricsBindAddress": "127.0.0.1:10249",
                    "clientConnection": {"kubeconfig": str(self.kubeconfig)},
                    # per-namespace conntrack limits are not writable here: leave them
                    "conntrack": {"maxPerCore": 0, "min": 0},
                }
            )
        )
        self._spawn("kube-proxy", [str(self.node_bin / "kube-proxy"), f"--config={config}"])

    def _wait_node_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            for name in ("kubelet", "kube-proxy", "containerd"):
                proc = self._procs.get(name)
                if proc is not None and proc.poll() is not None:
                    raise NodeError(f"{name} exited with {proc.returncode}\n{self._tail(name)}")
            out = self.kubectl("get", "node", NODE_NAME, "-o", "json", check=False)
            if out.returncode == 0:
                conds = json.loads(out.stdout)["status"].get("conditions", [])
                ready = [c for c in conds if c["type"] == "Ready"]
                if ready and ready[0]["status"] == "True":
                    return
                last = ready[0].get("message", "") if ready else "no Ready condition"
            time.sleep(1)
        raise NodeError(f"node {NODE_NAME} not Ready after {timeout:.0f}s ({last})")

    # --- teardown ------------------------------------------------------------------------

    def down(self, remove_state: bool = True, timeout: float = 10.0) -> None:
        """Pods first (so their containers stop), then node daemons, then the control plane."""
        if self.pids.get("kubelet") and self._procs.get("kubelet") is not None:
            self._stop_pods()
        self._stop_named(["kube-proxy", "kubelet", "kube-scheduler"], timeout)
        self._kill_containers()
        self._stop_named(["containerd"], timeout)
        self._unmount_state()
        self._remove_cgroups()
        shutil.rmtree(self.socket_dir, ignore_errors=True)
        super().down(remove_state=False, timeout=timeout)
        if remove_state:
            shutil.rmtree(self.state_dir, ignore_errors=True)

    def _stop_pods(self) -> None:
        """Remove every Pod sandbox through the CRI (stops its containers, frees its IP)."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.kubectl(
                "delete", "pods", "--all", "--all-namespaces", "--grace-period=5", "--wait=false",
                check=False, timeout=30,
            )  # fmt: skip

    def _kill_containers(self) -> None:
        if not self.containerd_socket.exists():
            return
        out = self.ctr("tasks", "list", "--quiet", timeout=30)
        for task in out.stdout.split():
            self.ctr("tasks", "kill", "--signal=SIGKILL", task, timeout=30)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and self.ctr("tasks", "list", "--quiet").stdout.strip():
            time.sleep(0.3)

    def _stop_named(self, names: list[str], timeout: float) -> None:
        for name in names:
            proc = self._procs.pop(name, None)
            pid = self.pids.pop(name, None)
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            elif proc is None and pid is not None and self._ours(name, pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 9)
        self._save_pids()

    def _unmount_state(self) -> None:
        """Unmount whatever the kubelet and containerd left mounted under the state dir."""
        prefix = str(self.state_dir.resolve())
        mounts = [
            line.split()[1]
            for line in Path("/proc/self/mounts").read_text().splitlines()
            if line.split()[1].startswith(prefix)
        ]
        for mount in sorted(mounts, key=len, reverse=True):
            subprocess.run(["umount", "-l", mount], capture_output=True, check=False)

    def _remove_cgroups(self) -> None:
        for hierarchy in cgroup_controllers():
            top = hierarchy / self.cgroup_root.lstrip("/")
            if not top.is_dir():
                continue
            for path in sorted(top.rglob("*"), key=lambda p: len(p.parts), reverse=True):
                if path.is_dir():
                    with contextlib.suppress(OSError):
                        path.rmdir()
            with contextlib.suppress(OSError):
                top.rmdir()
