"""The side nodes of `make demo`: two machines on 127.0.0.1 that really power-cycle.

`DemoSideNodes.start(workdir)` starts the side-node process (`nodewarden_doubles.sidenode`,
nodes from e2e/demo/sidenodes.yaml: `demo-side-redfish` behind the real sushy-tools
Redfish emulator, `demo-side-wol` woken by Wake-on-LAN and switched off over SSH, its
fake BMC observing the power) with a fresh SSH key, BMC login and SecureOn password.
Then:

- `objects()`: the designated Secrets (label `nodewarden.io/credentials=bmc|ssh|wol`), the
  fast PowerPolicy and the WorkerNodes of e2e/demo/sidenode-workernodes.yaml with the
  ports, BMC endpoints and system id the process got;
- `allow_lists()`: the operator config's `credentials.*` entries, 127.0.0.1:PORT only;
- `pids()`: the side-node process and its sushy-emulator child (recorded by the demo);
- `GpuArrivals`: applies each side node's GPU container (e2e/demo/sidenode-containers.yaml)
  once the operator has recorded that node Off -- the arrival is timed by that
  condition, never by a clock.

Only loopback is ever addressed; the example side nodes of `examples/` are not touched.
"""

from __future__ import annotations

import copy
import json
import secrets
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from nodewarden.credentials import LABEL
from nodewarden.ssh.credentials import SshClientKey
from nodewarden_doubles.sidenode.process import SideNodeProcess

DEMO = Path(__file__).resolve().parent / "demo"
SIDE_NODES = DEMO / "sidenodes.yaml"
WORKER_NODES = DEMO / "sidenode-workernodes.yaml"
GPU_CONTAINERS = DEMO / "sidenode-containers.yaml"
AFTER_OFF = "demo.nodewarden.io/after-off"
BMC_USER = "nodewarden-demo"


def _secret(name: str, use: str, data: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "labels": {LABEL: use}},
        "stringData": data,
    }


def _loopback(url: str) -> str:
    """`https://127.0.0.1:PORT/` -> `127.0.0.1:PORT` (an allow-list entry)."""
    host = url.removeprefix("https://").rstrip("/")
    if not host.startswith("127.0.0.1:"):
        raise ValueError(f"a demo side node must be on 127.0.0.1, not {host!r}")
    return host


@dataclass
class DemoSideNodes:
    process: SideNodeProcess
    key: SshClientKey
    bmc_password: str
    secure_on: str

    @classmethod
    def start(cls, workdir: Path) -> DemoSideNodes:
        key = SshClientKey.generate()
        password = secrets.token_urlsafe(18)
        secure_on = ":".join(f"{b:02x}" for b in secrets.token_bytes(6))
        config = yaml.safe_load(SIDE_NODES.read_text())
        config.update(
            name="demo-sidenodes",
            authorized_keys=[key.public_key],
            bmc={"username": BMC_USER, "password": password},
        )
        for node in config["nodes"]:
            if node["power"] in ("wol", "wol+bmc"):
                node["secure_on"] = secure_on
        process = SideNodeProcess(config, workdir=workdir, new_session=True)
        process.start()
        return cls(process, key, password, secure_on)

    def stop(self, timeout: float = 15) -> None:
        self.process.stop(timeout=timeout)

    @property
    def names(self) -> list[str]:
        return list(self.process.state["nodes"])

    def pids(self) -> dict[str, int]:
        out: dict[str, int] = {}
        if self.process.process is not None:
            out["side-nodes"] = self.process.process.pid
        sushy = self.process.state.get("sushy")
        if sushy and sushy.get("pid"):
            out["sushy-emulator"] = int(sushy["pid"])
        return out

    def allow_lists(self) -> dict[str, list[str]]:
        bmc, ssh = set(), []
        for info in self.process.state["nodes"].values():
            ssh.append(f"{info['ssh']['host']}:{info['ssh']['port']}")
            if info["power"].get("endpoint"):
                bmc.add(_loopback(info["power"]["endpoint"]))
        return {
            "bmc_endpoints": sorted(bmc),
            "ssh_endpoints": sorted(ssh),
            "wake_on_lan_targets": [f"127.0.0.1:{self.process.wol_port}"],
        }

    def objects(self) -> list[dict[str, Any]]:
        """Secrets first, then the policy and the WorkerNodes with their ports filled in."""
        side = self.process
        known_hosts = "\n".join(side.known_hosts_line(n) for n in self.names)
        out = [
            _secret("demo-side-bmc", "bmc", {"username": BMC_USER, "password": self.bmc_password}),
            _secret("demo-side-bmc-ca", "bmc", {"caBundle": side.state["bmc_ca_pem"]}),
            _secret(
                "demo-side-ssh",
                "ssh",
                {
                    "privateKey": self.key.export_private().get_secret_value(),
                    "knownHosts": known_hosts,
                },
            ),
            _secret("demo-side-wol", "wol", {"secureOn": self.secure_on}),
        ]
        for doc in yaml.safe_load_all(WORKER_NODES.read_text()):
            if doc["kind"] == "WorkerNode":
                doc = self._filled(doc)
            out.append(doc)
        return out

    def _filled(self, node: dict[str, Any]) -> dict[str, Any]:
        node = copy.deepcopy(node)
        info = self.process.node_info(node["metadata"]["name"])
        spec = node["spec"]
        spec["ssh"]["address"] = info["ssh"]["host"]
        spec["ssh"]["port"] = int(info["ssh"]["port"])
        power = info["power"]
        if "bmc" in spec:
            spec["bmc"]["endpoint"] = power["endpoint"].rstrip("/")
            spec["bmc"]["systemId"] = power["system_id"]
        if "wakeOnLan" in spec:
            spec["wakeOnLan"]["mac"] = info["mac"]
            spec["wakeOnLan"]["port"] = self.process.wol_port
        return node


@dataclass
class GpuArrivals:
    """Applies each GPU container of sidenode-containers.yaml once its node is recorded Off.

    `step()` is called from the demo's main loop; it reads the side nodes' states at most
    every `interval` seconds and stops reading once every container was applied.
    """

    kubectl: Callable[..., Any]
    namespace: str
    interval: float = 2.0
    pending: list[dict[str, Any]] = field(default_factory=list)
    _next: float = 0.0

    def __post_init__(self) -> None:
        if not self.pending:
            self.pending = list(yaml.safe_load_all(GPU_CONTAINERS.read_text()))

    def step(self) -> None:
        if not self.pending or time.monotonic() < self._next:
            return
        self._next = time.monotonic() + self.interval
        out = self.kubectl(  # a list (one name given would print one object, not a list)
            "-n",
            self.namespace,
            "get",
            "wn",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name}={.status.state}{'\\n'}{end}",
            check=False,
        )
        if out.returncode != 0:
            return
        states = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
        for container in list(self.pending):
            node = container["metadata"]["annotations"][AFTER_OFF]
            if states.get(node) != "Off":
                continue
            self.kubectl("-n", self.namespace, "apply", "-f", "-", input=json.dumps(container))
            self.pending.remove(container)
            gpu = container["spec"]["resources"].get("gpuModel")
            print(
                f">> {node} is Off (its BMC shows Off): queued {container['metadata']['name']}, "
                f"a container only {node} can run ({gpu}) -- watch nodewarden wake it",
                file=sys.stderr,
                flush=True,
            )
