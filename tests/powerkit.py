"""Helpers for power-controller tests: side nodes that really power-cycle, and the operator.

`PowerEnv.create(...)` starts the side-node process (`nodewarden_doubles.sidenode`: stub
SSH workers that are up only while their fake BMC / sushy-tools system / Wake-on-LAN
power is On, all on 127.0.0.1), writes the designated credential Secrets (BMC login and
CA bundle: label bmc; known_hosts: ssh; SecureOn: wol) and the operator's own SSH key
(reserved), a fast PowerPolicy, one WorkerNode per side node, and an operator config
that admits exactly those endpoints. `env.start_operator()` runs `nodewarden run`
against the real local API server (no cloud: side nodes only, unless `cloud=` is given).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from clusterkit import ClusterHandle, OperatorProcess, start_operator, wait_for
from nodewarden.credentials import LABEL
from nodewarden.ssh.credentials import SshClientKey
from nodewarden_doubles.sidenode.process import SideNodeProcess

BMC_USER = "nodewarden-bmc"
BMC_PASSWORD = "side-bmc-password-41c9e"
SECURE_ON = "0a:1b:2c:3d:4e:5f"

FAST_POWER_POLICY: dict[str, Any] = {
    "idleThreshold": "2s",
    "bootGrace": "60s",
    "minOn": "0s",
    "minOff": "0s",
    "cooldown": "0s",
    "telemetryMaxAge": "15s",
    "heartbeatStaleAfter": "60s",
    "billing": {"period": "0s", "windowStart": "0s", "windowEnd": "1s"},
    "deadlines": {"shutdown": "15s", "wake": "15s", "ready": "15s", "drain": "60s"},
    "retry": {"budget": 2, "initialBackoff": "1s", "maxBackoff": "2s", "jitter": 0.1},
    "disruptionBudget": {"maxConcurrentTransitions": 10},
}


def side_node_entry(name: str, power: str = "fakebmc", **extra: Any) -> dict[str, Any]:
    """A node of the side-node process config (see nodewarden_doubles.sidenode.config)."""
    entry: dict[str, Any] = {
        "name": name,
        "power": power,
        "initial_power": "On",
        "boot_delay": 0.3,
        "ready_delay": 0.3,
        "shutdown_delay": 0.2,
        "initial_uptime": 3600,
        "gpus": 1,
    }
    if power in ("wol", "wol+bmc"):
        # from the name's bytes, not hash(): str hashes vary per process, and two nodes of
        # one fleet once drew the same MAC (the side-node process refused the config)
        digest = hashlib.sha256(name.encode()).digest()
        entry.setdefault("mac", "52:54:00:" + digest[:3].hex(":"))
    entry.update(extra)
    return entry


@dataclass
class PowerEnv:
    cluster: ClusterHandle
    namespace: str
    workdir: Path
    side: SideNodeProcess
    key: SshClientKey
    config_path: Path = field(init=False)
    operators: list[OperatorProcess] = field(default_factory=list)

    @classmethod
    def create(
        cls,
        cluster: ClusterHandle,
        namespace: str,
        workdir: Path,
        nodes: Iterable[dict[str, Any]],
        *,
        policy: dict[str, Any] | None = None,
        node_specs: dict[str, dict[str, Any]] | None = None,
        config: dict[str, Any] | None = None,
        labels: dict[str, dict[str, str]] | None = None,
        objects: Iterable[dict[str, Any]] = (),
    ) -> PowerEnv:
        """`labels`: metadata labels per WorkerNode; `objects`: more objects applied with
        the rest (one kubectl call for everything)."""
        key = SshClientKey.generate()
        workdir.mkdir(parents=True, exist_ok=True)
        side = SideNodeProcess(
            {
                "name": f"side-{namespace}",
                "authorized_keys": [key.public_key],
                "bmc": {"username": BMC_USER, "password": BMC_PASSWORD},
                "nodes": list(nodes),
            },
            workdir=workdir / "sidenodes",
        )
        side.start()
        env = cls(cluster, namespace, workdir, side, key)
        batch = env._secrets()
        batch.append(
            {
                "apiVersion": "nodewarden.io/v1alpha1",
                "kind": "PowerPolicy",
                "metadata": {"name": "default"},
                "spec": {**FAST_POWER_POLICY, **(policy or {})},
            }
        )
        batch.extend(objects)
        env.config_path = workdir / "operator.yaml"
        env.write_config(config or {})
        for name in env.side.state["nodes"]:
            spec = dict((node_specs or {}).get(name, {}))
            if spec.pop("wakeOnLanWithBmc", False):
                spec.update(env.wake_on_lan(name))
            node = env.worker_node(name, **spec)
            if labels and name in labels:
                node["metadata"]["labels"] = dict(labels[name])
            batch.append(node)
        env.apply_all(batch)
        return env

    # -- objects -------------------------------------------------------------------------

    def _secrets(self) -> list[dict[str, Any]]:
        known = "\n".join(self.side.known_hosts_line(n) for n in self.side.state["nodes"])
        secrets = {
            "operator-ssh": (None, {"id": self.key.export_private().get_secret_value()}),
            "side-bmc": ("bmc", {"username": BMC_USER, "password": BMC_PASSWORD}),
            "side-bmc-ca": ("bmc", {"caBundle": self.side.state["bmc_ca_pem"]}),
            "side-ssh": ("ssh", {"knownHosts": known}),
            "side-wol": ("wol", {"secureOn": SECURE_ON}),
        }
        out: list[dict[str, Any]] = []
        for name, (use, data) in secrets.items():
            meta: dict[str, Any] = {"name": name}
            if use is not None:
                meta["labels"] = {LABEL: use}
            out.append({"apiVersion": "v1", "kind": "Secret", "metadata": meta, "stringData": data})
        return out

    def worker_node(self, name: str, **overrides: Any) -> dict[str, Any]:
        info = self.side.node_info(name)
        ssh = info["ssh"]
        power = info["power"]
        spec: dict[str, Any] = {
            "nodeType": "SideNode",
            "capacity": {"vcpus": 16, "ram": "64Gi", "gpus": 1, "gpuModel": "a10"},
            "ssh": {
                "address": ssh["host"],
                "port": int(ssh["port"]),
                "user": "nodewarden",
                "knownHostsSecretRef": {"name": "side-ssh", "key": "knownHosts"},
            },
        }
        if power["source"] in ("fakebmc", "sushy"):
            spec["controlMethod"] = "Redfish"
            spec["bmc"] = {
                "endpoint": power["endpoint"],
                "usernameSecretRef": {"name": "side-bmc", "key": "username"},
                "passwordSecretRef": {"name": "side-bmc", "key": "password"},
                "caBundleSecretRef": {"name": "side-bmc-ca", "key": "caBundle"},
            }
            if power.get("system_id"):
                spec["bmc"]["systemId"] = power["system_id"]
        else:
            spec["controlMethod"] = "WakeOnLan"
            spec["wakeOnLan"] = {
                "mac": info["mac"],
                "broadcastAddress": "127.0.0.1",
                "port": self.side.wol_port,
            }
        spec.update(overrides)
        return {
            "apiVersion": "nodewarden.io/v1alpha1",
            "kind": "WorkerNode",
            "metadata": {"name": name},
            "spec": spec,
        }

    def wake_on_lan(self, name: str) -> dict[str, Any]:
        """Spec fields making a node woken by Wake-on-LAN (its BMC, if any, still observes)."""
        return {
            "controlMethod": "WakeOnLan",
            "wakeOnLan": {
                "mac": self.side.node_info(name)["mac"],
                "broadcastAddress": "127.0.0.1",
                "port": self.side.wol_port,
            },
        }

    def write_config(self, extra: dict[str, Any]) -> None:
        bmc_endpoints, ssh_endpoints = [], []
        for name, info in self.side.state["nodes"].items():
            del name
            ssh_endpoints.append(f"{info['ssh']['host']}:{info['ssh']['port']}")
            endpoint = info["power"].get("endpoint")
            if endpoint:
                bmc_endpoints.append(endpoint.removeprefix("https://").rstrip("/"))
        config: dict[str, Any] = {
            "dispatcher_id": "power",
            "namespace": self.namespace,
            "log_format": "json",
            "log_level": "INFO",
            "resync_interval": "5s",
            "leader_election": {"lease_duration": 8, "renew_interval": 2, "retry_interval": 1},
            "credentials": {
                "bmc_endpoints": sorted(set(bmc_endpoints)),
                "ssh_endpoints": ssh_endpoints,
                "wake_on_lan_targets": [f"127.0.0.1:{self.side.wol_port}"],
                "secret_ttl": "2s",
            },
            "power": {
                "power_poll_interval": 2,
                "power_poll_interval_at_rest": 2,
                "evaluate_interval": 3,
                "request_timeout": 5,
            },
            "dispatch": {
                "tick_interval": 0.5,
                "probe_interval": 1,
                "boot_probe_interval": 0.5,
                "max_probes_per_second": 0,
                "term_interval": 1,
                "term_timeout": 5,
                "ssh_user": "nodewarden",
                "ssh_private_key_secret": {"name": "operator-ssh", "key": "id"},
            },
        }
        for key, value in extra.items():
            if isinstance(value, dict) and isinstance(config.get(key), dict):
                config[key] = {**config[key], **value}
            else:
                config[key] = value
        self.config_path.write_text(yaml.safe_dump(config))

    def apply(self, obj: dict[str, Any]) -> None:
        self.cluster.kubectl("-n", self.namespace, "apply", "-f", "-", input=json.dumps(obj))

    def apply_all(self, objs: list[dict[str, Any]]) -> None:
        """Apply `objs` in order with one kubectl call."""
        self.apply({"apiVersion": "v1", "kind": "List", "items": objs})

    def start_operator(self, name: str | None = None) -> OperatorProcess:
        op = start_operator(
            self.cluster,
            self.namespace,
            self.workdir,
            f"--config={self.config_path}",
            name=name or f"operator-{len(self.operators)}",
        )
        self.operators.append(op)
        return op

    # -- reading ---------------------------------------------------------------------------

    def node(self, name: str) -> dict[str, Any]:
        return self.cluster.get_json(self.namespace, "wn", name)  # type: ignore[no-any-return]

    def status(self, name: str) -> dict[str, Any]:
        return self.node(name).get("status") or {}

    def intents(self, node: str | None = None) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.cluster.get_json(self.namespace, "pi")["items"]
        if node is not None:
            items = [i for i in items if i["spec"]["nodeName"] == node]
        return sorted(items, key=lambda i: i["metadata"]["creationTimestamp"])

    def wait_state(self, name: str, state: str, timeout: float = 60) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            status = self.status(name)
            return status if status.get("state") == state else None

        return wait_for(  # type: ignore[no-any-return]
            reached, timeout=timeout, interval=0.5, what=f"{name} state {state}"
        )

    def resets(self, name: str) -> list[dict[str, Any]]:
        """The resets the node's BMC received (what the operator sent)."""
        log = self.side.admin.bmc_log(name)
        return list(log.get("resets", []))

    def close(self) -> None:
        with ThreadPoolExecutor(max(1, len(self.operators))) as pool:  # stop them side by side
            list(pool.map(lambda op: op.stop(), self.operators))
        for op in self.operators:
            print(f"--- {op.log_path.name} (last 8000 chars) ---\n{op.logs()[-8000:]}")
        print(f"--- side nodes ---\n{self.side.log_text()[-3000:]}")
        self.side.stop()
