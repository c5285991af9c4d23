#!/usr/bin/env python3
"""The `make e2e` scenario on a kind cluster, for hosts with Docker (cannot run here: no
Docker engine on the development machines; not run by CI).

Same assertions as `make e2e` (`e2e/dataplane/scenario.py`); only the environment differs:

- cluster: `kind create cluster` (one node), the plugin directory mounted into the node
  (extraMounts) at the same path; the image from the Dockerfile by `docker build`, loaded
  under two tags with `kind load docker-image`;
- the host reaches Pod and Service addresses through routes via the node container
  (the scenario and prometheus talk to Pods directly, as in the namespaces);
- the stub cloud runs in a network namespace of its own whose veth is attached to kind's
  Docker bridge, with an address at the top of kind's subnet and the same DNAT rule as
  in `dataplane.netns`; the operator Pods' routed cloud plugin is told kind's subnet;
  the side-node process runs in that namespace too, advertised at the same address;
- a leader crash is `crictl stop --timeout 0` in the node container.

    sudo e2e/kind/e2e.sh [--trimmed]      # needs docker, kind, root (namespace, routes)
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent.parent / "operator")]

from dataplane.envs import NamespacedCloud, NamespacedSideNodes, run_quiet  # noqa: E402
from dataplane.netns import CLOUD_LINK  # noqa: E402
from localcluster import REPO  # noqa: E402
from nodewarden_doubles.sidenode.process import SideNodeAdmin, SideNodeProcess  # noqa: E402
from nodewarden_doubles.stubcloud.process import StubCloudAdmin  # noqa: E402
from nodewarden_doubles.stubcloud.serverconfig import StubServerConfig  # noqa: E402

KIND_POD_CIDR = "10.244.0.0/16"
KIND_SERVICE_CIDR = "10.96.0.0/16"


class KindEnvironment:
    pod_network = ipaddress.IPv4Network(KIND_POD_CIDR)

    def __init__(self, state: Path) -> None:
        self.state = state
        self.name = f"nwe2e-{uuid.uuid4().hex[:6]}"
        self.kubeconfig = state / "kubeconfig"
        self.image_ref = f"docker.io/library/nodewarden:{self.name}"
        self.next_image_ref = f"{self.image_ref}-next"
        self.node = f"{self.name}-control-plane"
        self.cloud_netns = f"{self.name}-c"
        self.cloud: NamespacedCloud | None = None
        self.side_nodes: NamespacedSideNodes | None = None
        self.routes: list[str] = []
        self.timings: dict[str, float] = {}

    def start(self, plugins: Path) -> None:
        t0 = time.monotonic()
        config = self.state / "kind.yaml"
        config.write_text(
            json.dumps(
                {
                    "kind": "Cluster",
                    "apiVersion": "kind.x-k8s.io/v1alpha4",
                    "networking": {"podSubnet": KIND_POD_CIDR, "serviceSubnet": KIND_SERVICE_CIDR},
                    "nodes": [
                        {
                            "role": "control-plane",
                            "extraMounts": [
                                {
                                    "hostPath": str(plugins),
                                    "containerPath": str(plugins),
                                    "readOnly": True,
                                }
                            ],
                        }
                    ],
                }
            )
        )
        run_quiet("kind", "create", "cluster", f"--name={self.name}", f"--config={config}",
                  f"--kubeconfig={self.kubeconfig}", "--wait=180s")  # fmt: skip
        self.timings["cluster_up"] = time.monotonic() - t0
        t1 = time.monotonic()
        run_quiet("docker", "build", "-t", self.image_ref, str(REPO), timeout=1800)
        run_quiet("docker", "tag", self.image_ref, self.next_image_ref)
        for ref in (self.image_ref, self.next_image_ref):
            run_quiet("kind", "load", "docker-image", ref, f"--name={self.name}")
        self.timings["images_loaded"] = time.monotonic() - t1
        self.node_ip = run_quiet(
            "docker", "inspect", "-f", "{{.NetworkSettings.Networks.kind.IPAddress}}", self.node
        ).strip()
        for cidr in (KIND_POD_CIDR, KIND_SERVICE_CIDR):
            run_quiet("ip", "route", "add", cidr, "via", self.node_ip)
            self.routes.append(cidr)

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        proc = subprocess.run(
            ["kubectl", f"--kubeconfig={self.kubeconfig}", *args],
            input=input, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {proc.stderr.strip()}")
        return proc.stdout

    def kill_container(self, container_id: str) -> None:
        run_quiet("docker", "exec", self.node, "crictl", "stop", "--timeout", "0", container_id)

    def start_cloud(self, config: StubServerConfig, workdir: Path) -> str:
        """The cloud namespace on kind's Docker bridge, at the top address of its subnet."""
        network = json.loads(run_quiet("docker", "network", "inspect", "kind"))[0]
        ipam = next(c for c in network["IPAM"]["Config"] if ":" not in c["Subnet"])
        subnet = ipaddress.IPv4Network(ipam["Subnet"])
        self.subnet = str(subnet)
        address = str(subnet.broadcast_address - 1)
        bridge = f"br-{network['Id'][:12]}"
        ns = self.cloud_netns
        host_end = f"nwk{uuid.uuid4().hex[:6]}"
        run_quiet("ip", "netns", "add", ns)
        run_quiet("ip", "link", "add", host_end, "type", "veth", "peer", "name", CLOUD_LINK,
                  "netns", ns)  # fmt: skip
        run_quiet("ip", "link", "set", host_end, "master", bridge, "up")
        for argv in (
            ["ip", "link", "set", "lo", "up"],
            ["ip", "addr", "add", f"{address}/{subnet.prefixlen}", "dev", CLOUD_LINK],
            ["ip", "link", "set", CLOUD_LINK, "up"],
            ["ip", "route", "add", KIND_POD_CIDR, "via", self.node_ip],
            ["sysctl", "-q", "-w", "net.ipv4.conf.all.route_localnet=1"],
            ["iptables", "-t", "nat", "-A", "PREROUTING", "-i", CLOUD_LINK, "-d", address,
             "-p", "tcp", "-j", "DNAT", "--to-destination", "127.0.0.1"],
        ):  # fmt: skip
            run_quiet("ip", "netns", "exec", ns, *argv)
        self.cloud = NamespacedCloud(Path(f"/run/netns/{ns}"))
        self.cloud_address = address
        return self.cloud.start(config, workdir, address)

    def cloud_admin(self, fn: Callable[[StubCloudAdmin], Any]) -> Any:
        assert self.cloud is not None
        return self.cloud.admin(fn)

    def start_side_nodes(self, config: dict[str, Any], workdir: Path) -> SideNodeProcess:
        assert self.cloud is not None, "start_cloud first: the side nodes share its namespace"
        self.side_nodes = NamespacedSideNodes(self.cloud.netns)
        return self.side_nodes.start(config, workdir, self.cloud_address)

    def side_admin(self, fn: Callable[[SideNodeAdmin], Any]) -> Any:
        assert self.side_nodes is not None
        return self.side_nodes.admin(fn)

    def pod_env(self) -> list[dict[str, str]]:
        return [{"name": "NWE2E_ROUTED_NETWORK", "value": self.subnet}]

    def plugin_volume(self, plugins: Path) -> dict[str, Any]:
        return {"hostPath": {"path": str(plugins), "type": "Directory"}}

    def stop(self) -> None:
        if self.side_nodes is not None:
            self.side_nodes.stop()
        if self.cloud is not None:
            self.cloud.stop()
        subprocess.run(
            ["ip", "netns", "delete", self.cloud_netns], capture_output=True, check=False
        )
        for cidr in self.routes:
            subprocess.run(["ip", "route", "del", cidr], capture_output=True, check=False)
        subprocess.run(["kind", "delete", "cluster", f"--name={self.name}"], check=False)


def main() -> int:
    from dataplane.scenario import run_scenario

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--trimmed", action="store_true")
    parser.add_argument("--report", type=Path)
    args = parser.parse_args()
    for tool in ("docker", "kind", "kubectl"):
        if shutil.which(tool) is None:
            print(
                f"e2e/kind: {tool} not found (this path is for hosts with Docker)", file=sys.stderr
            )
            return 2
    state = Path(tempfile.mkdtemp(prefix="nwe2e-kind-"))
    report = args.report or state / "report.json"
    code = run_scenario(state, KindEnvironment(state), args.trimmed, report, 0.0)
    print(f"e2e on kind {'passed' if code == 0 else 'FAILED'}; report {report}", file=sys.stderr)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
