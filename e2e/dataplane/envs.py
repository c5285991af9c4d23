"""Where the e2e scenario runs: what differs between the network-namespace data plane and kind.

`dataplane.scenario` asserts the same things on both; an `Environment` gives it a cluster
(kubeconfig), the operator image under two tags, a way to crash a container, the stub
cloud and the side-node process somewhere the Pods can reach them, and the plugin
directory as a hostPath on the node.
`NetnsEnvironment` is `make e2e` (this module); `e2e/kind/kindenv.py` is the kind one.
"""

from __future__ import annotations

import ipaddress
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from dataplane.netns import CLOUD_IP, POD_CIDR, call_in
from dataplane.node import NodeCluster
from nodewarden_doubles.sidenode.process import SideNodeAdmin, SideNodeProcess
from nodewarden_doubles.stubcloud.process import StubCloudAdmin, StubCloudProcess
from nodewarden_doubles.stubcloud.serverconfig import StubServerConfig


class Environment(Protocol):
    kubeconfig: Path
    image_ref: str
    next_image_ref: str
    pod_network: ipaddress.IPv4Network
    timings: dict[str, float]

    def start(self, plugins: Path) -> None:
        """Cluster up, node Ready, both image tags known to the node, `plugins` mountable."""

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str: ...

    def kill_container(self, container_id: str) -> None:
        """SIGKILL one container (a crash: no graceful shutdown)."""

    def start_cloud(self, config: StubServerConfig, workdir: Path) -> str:
        """Start the stub cloud; the URL the operator Pods reach it at."""

    def cloud_admin(self, fn: Callable[[StubCloudAdmin], Any]) -> Any: ...

    def start_side_nodes(self, config: dict[str, Any], workdir: Path) -> SideNodeProcess:
        """Start the side-node process (after `start_cloud`) where the Pods reach its SSH
        servers and BMCs by routing; its state names them at that routed address."""

    def side_admin(self, fn: Callable[[SideNodeAdmin], Any]) -> Any: ...

    def pod_env(self) -> list[dict[str, str]]:
        """Extra environment of the operator Pods (for the routed cloud plugin)."""

    def plugin_volume(self, plugins: Path) -> dict[str, Any]:
        """The hostPath volume source of `plugins` as the node sees it."""

    def stop(self) -> None: ...


def python_in(netns: Path, workdir: Path) -> str:
    """A script that runs this Python inside the network namespace at `netns`."""
    workdir.mkdir(parents=True, exist_ok=True)
    python = workdir / "python-in-netns"
    python.write_text(f'#!/bin/sh\nexec nsenter --net={netns} -- {sys.executable} "$@"\n')
    python.chmod(0o755)
    return str(python)


class NamespacedCloud:
    """The stub cloud (a test double) on the loopback of a network namespace of its own,
    reached from outside through the DNAT rule `dataplane.netns` puts there."""

    def __init__(self, netns: Path) -> None:
        self.netns = netns
        self.stub: StubCloudProcess | None = None

    def start(self, config: StubServerConfig, workdir: Path, address: str) -> str:
        python = python_in(self.netns, workdir)
        self.stub = StubCloudProcess(config, workdir=workdir, python=python).start()
        return f"http://{address}:{self.stub.url.rsplit(':', 1)[1]}"

    def admin(self, fn: Callable[[StubCloudAdmin], Any]) -> Any:
        """The admin API listens on the namespace's loopback: call it from in there."""
        assert self.stub is not None
        stub = self.stub
        return call_in(self.netns, lambda: fn(stub.admin))

    def stop(self) -> None:
        if self.stub is not None:
            self.stub.stop(timeout=10)


class NamespacedSideNodes:
    """The side-node process (a test double: stub SSH workers up only while their fake BMC
    says On) on the loopback of the cloud namespace. It advertises the cloud address: the
    DNAT rule there maps <address>:<port> onto its SSH servers and BMCs, whose TLS
    certificate names that address."""

    def __init__(self, netns: Path) -> None:
        self.netns = netns
        self.process: SideNodeProcess | None = None

    def start(self, config: dict[str, Any], workdir: Path, address: str) -> SideNodeProcess:
        python = python_in(self.netns, workdir)
        config = {**config, "advertise_address": address}
        self.process = SideNodeProcess(config, workdir=workdir, python=python).start()
        return self.process

    def admin(self, fn: Callable[[SideNodeAdmin], Any]) -> Any:
        """The admin API listens on the namespace's loopback: call it from in there."""
        assert self.process is not None
        admin = self.process.admin
        return call_in(self.netns, lambda: fn(admin))

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(timeout=10)


class NetnsEnvironment:
    """The node namespace (this process runs in it) and the cloud namespace (`cloud_netns`)."""

    pod_network = ipaddress.IPv4Network(POD_CIDR)

    def __init__(self, state: Path, cloud_netns: Path, prepared: dict[str, str]) -> None:
        self.state = state
        self.prepared = prepared
        self.image_ref = prepared["operator_ref"]
        self.next_image_ref = f"{self.image_ref}-next"
        self.cluster: NodeCluster | None = None
        self.cloud = NamespacedCloud(cloud_netns)
        self.side_nodes = NamespacedSideNodes(cloud_netns)
        self.timings: dict[str, float] = {}

    @property
    def kubeconfig(self) -> Path:
        assert self.cluster is not None
        return self.cluster.kubeconfig

    def start(self, plugins: Path) -> None:
        import time

        t0 = time.monotonic()
        self.cluster = NodeCluster(self.state / "cluster", uuid.uuid4().hex[:8])
        self.cluster.up()
        self.timings["control_plane_up"] = time.monotonic() - t0
        t1 = time.monotonic()
        self.cluster.import_image(Path(self.prepared["pause_archive"]))
        self.cluster.import_image(Path(self.prepared["operator_archive"]))
        out = self.cluster.ctr("images", "tag", "--force", self.image_ref, self.next_image_ref)
        if out.returncode != 0:
            raise AssertionError(f"ctr images tag: {out.stderr}")
        self.timings["images_imported"] = time.monotonic() - t1
        t2 = time.monotonic()
        self.cluster.start_kubelet()
        self.timings["node_ready"] = time.monotonic() - t2

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        assert self.cluster is not None
        return self.cluster.kubectl(*args, input=input, check=check, timeout=120).stdout

    def kill_container(self, container_id: str) -> None:
        assert self.cluster is not None
        out = self.cluster.ctr("tasks", "kill", "--signal=SIGKILL", container_id)
        if out.returncode != 0:
            raise AssertionError(f"cannot kill container {container_id}: {out.stderr}")

    def start_cloud(self, config: StubServerConfig, workdir: Path) -> str:
        return self.cloud.start(config, workdir, CLOUD_IP)

    def cloud_admin(self, fn: Callable[[StubCloudAdmin], Any]) -> Any:
        return self.cloud.admin(fn)

    def start_side_nodes(self, config: dict[str, Any], workdir: Path) -> SideNodeProcess:
        return self.side_nodes.start(config, workdir, CLOUD_IP)

    def side_admin(self, fn: Callable[[SideNodeAdmin], Any]) -> Any:
        return self.side_nodes.admin(fn)

    def pod_env(self) -> list[dict[str, str]]:
        return []

    def plugin_volume(self, plugins: Path) -> dict[str, Any]:
        return {"hostPath": {"path": str(plugins), "type": "Directory"}}

    def stop(self) -> None:
        self.side_nodes.stop()
        self.cloud.stop()
        if self.cluster is not None:
            self.cluster.down(remove_state=False)


def run_quiet(*argv: str, timeout: float = 600) -> str:
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(argv[:3])}: {proc.stderr.strip()}")
    return proc.stdout
