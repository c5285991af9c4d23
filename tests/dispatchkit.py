"""Helpers for dispatcher tests: a stub cloud server, Secrets, config and the operator process.

`DispatchEnv.create(...)` starts a stub cloud server process (its VMs are real SSH
servers on 127.0.0.1), writes the SSH-key and cloud-credential Secrets and a PowerPolicy
into the test namespace, and renders an operator config file; `env.start_operator()`
runs `nodewarden run` against the real local API server with it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from clusterkit import ClusterHandle, OperatorProcess, start_operator, wait_for
from nodewarden.scheduling.instancetypes import InstanceType
from nodewarden.ssh.credentials import SshClientKey
from nodewarden_doubles.stubcloud.process import StubCloudProcess
from nodewarden_doubles.stubcloud.serverconfig import StubServerConfig, StubServerCredentials

GI = 2**30

CATALOGUE = [
    InstanceType(name="small", provider_type="t3.small", vcpus=2, ram=4 * GI, price=0.02),
    InstanceType(name="medium", provider_type="m5.large", vcpus=4, ram=16 * GI, price=0.096),
    InstanceType(name="large", provider_type="m5.2xlarge", vcpus=8, ram=32 * GI, price=0.384),
    InstanceType(
        name="gpu",
        provider_type="g5.xlarge",
        vcpus=4,
        ram=16 * GI,
        gpus=1,
        gpu_model="a10g",
        price=1.006,
    ),
]

FAST_POLICY = {
    "idleThreshold": "3s",
    "bootGrace": "60s",
    "minOn": "0s",
    "cooldown": "0s",
    "heartbeatStaleAfter": "60s",
    "billing": {"period": "0s", "windowStart": "0s", "windowEnd": "1s"},
    "dispatch": {"maxAttempts": 3, "lameAfter": "60s", "lameMinProbes": 3, "takeoverAfter": "20s"},
}


@dataclass
class DispatchEnv:
    cluster: ClusterHandle
    namespace: str
    workdir: Path
    stub: StubCloudProcess
    dispatcher_id: str = "disp"
    config_path: Path = field(init=False)
    ssh_key: SshClientKey = field(init=False)
    operators: list[OperatorProcess] = field(default_factory=list)

    @classmethod
    def create(
        cls,
        cluster: ClusterHandle,
        namespace: str,
        workdir: Path,
        *,
        stub: StubCloudProcess | None = None,
        faults: dict[str, Any] | None = None,
        policy: dict[str, Any] | None = None,
        dispatcher_id: str = "disp",
        dispatch: dict[str, Any] | None = None,
        cloud: dict[str, Any] | None = None,
        catalogue: Iterable[InstanceType] = CATALOGUE,
        ssh_key: SshClientKey | None = None,
    ) -> DispatchEnv:
        if stub is None:
            stub = StubCloudProcess(
                StubServerConfig(
                    name=f"stub-{namespace}",
                    credentials=StubServerCredentials(
                        key="AKIASTUBTEST0001", secret="stub-secret-value-1"
                    ),
                    instance_types=list(catalogue),
                    faults=faults or {},
                ),
                workdir=workdir / "stub",
            )
            stub.start()
        workdir.mkdir(parents=True, exist_ok=True)
        env = cls(cluster, namespace, workdir, stub, dispatcher_id)
        env.ssh_key = ssh_key or SshClientKey.generate()
        env._secrets()
        env.apply(
            {
                "apiVersion": "nodewarden.io/v1alpha1",
                "kind": "PowerPolicy",
                "metadata": {"name": "default"},
                "spec": {**FAST_POLICY, **(policy or {})},
            }
        )
        env.config_path = workdir / f"operator-{dispatcher_id}.yaml"
        env.write_config(dispatch or {}, cloud or {})
        return env

    def _secrets(self) -> None:
        key = self.ssh_key
        creds = self.stub.cloud_credentials()
        assert creds is not None and creds.secret is not None
        for name, data in {
            "nodewarden-ssh": {"id": key.export_private().get_secret_value()},
            "nodewarden-cloud": {
                "key": creds.key.get_secret_value(),
                "secret": creds.secret.get_secret_value(),
            },
            "nodewarden-status": {"token": "status-token-for-tests-0123456789"},
        }.items():
            self.apply(
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {"name": name},
                    "stringData": data,
                }
            )

    def write_config(self, dispatch: dict[str, Any], cloud: dict[str, Any]) -> None:
        base = self.stub.cloud_config().model_dump(mode="json")
        base.update(
            {
                "credentials": {
                    "key_ref": {"name": "nodewarden-cloud", "key": "key"},
                    "secret_ref": {"name": "nodewarden-cloud", "key": "secret"},
                },
                "ops_per_second": 0,
                "max_concurrent_creates": 8,
            }
        )
        base.update(cloud)
        config = {
            "dispatcher_id": self.dispatcher_id,
            "namespace": self.namespace,
            "log_format": "json",
            "log_level": "INFO",
            "resync_interval": "5s",
            "management": {"token_secret_name": "nodewarden-status"},
            "leader_election": {"lease_duration": 8, "renew_interval": 2, "retry_interval": 1},
            "cloud": base,
            "dispatch": {
                "tick_interval": 0.5,
                "sync_interval": 2,
                "sync_interval_at_rest": 2,
                "probe_interval": 1,
                "boot_probe_interval": 0.5,
                "max_probes_per_second": 0,
                "term_interval": 1,
                "term_timeout": 5,
                "probe_tag_interval": 2,
                "ssh_private_key_secret": {"name": "nodewarden-ssh", "key": "id"},
                **dispatch,
            },
        }
        self.config_path.write_text(yaml.safe_dump(config))

    def apply(self, obj: dict[str, Any]) -> None:
        self.cluster.kubectl("-n", self.namespace, "apply", "-f", "-", input=json.dumps(obj))

    def start_operator(self, name: str | None = None) -> OperatorProcess:
        op = start_operator(
            self.cluster,
            self.namespace,
            self.workdir,
            f"--config={self.config_path}",
            name=name or f"operator-{self.dispatcher_id}-{len(self.operators)}",
        )
        self.operators.append(op)
        return op

    def containers(self) -> list[dict[str, Any]]:
        return self.cluster.get_json(self.namespace, "cd")["items"]  # type: ignore[no-any-return]

    def nodes(self) -> list[dict[str, Any]]:
        return self.cluster.get_json(self.namespace, "wn")["items"]  # type: ignore[no-any-return]

    def phases(self) -> dict[str, str | None]:
        return {
            c["metadata"]["name"]: (c.get("status") or {}).get("phase") for c in self.containers()
        }

    def ours(self) -> list[Any]:
        """Stub VMs tagged with our dispatcher id (and not terminated)."""
        return [
            vm
            for vm in self.stub.admin.vms()
            if vm.tags.get("nodewarden-dispatcher") == self.dispatcher_id
            and vm.state not in ("terminated",)
        ]

    def wait_phases(self, want: dict[str, str], timeout: float = 120) -> dict[str, str | None]:
        def done() -> dict[str, str | None] | None:
            got = self.phases()
            return got if all(got.get(k) == v for k, v in want.items()) else None

        return wait_for(done, timeout=timeout, interval=1, what=f"phases {want}")  # type: ignore[no-any-return]

    def wait_no_nodes(self, timeout: float = 120) -> None:
        wait_for(
            lambda: not self.nodes() and not self.ours(),
            timeout=timeout,
            interval=1,
            what="every WorkerNode and instance gone",
        )

    def close(self, stop_stub: bool = True) -> None:
        for op in self.operators:
            op.stop()
            # shown by pytest only when the test failed
            print(f"--- {op.log_path.name} (last 8000 chars) ---\n{op.logs()[-8000:]}")
        if stop_stub:
            self.stub.stop()


def container(
    name: str,
    uuid_index: int,
    *,
    vcpus: int = 1,
    ram: str = "1Gi",
    gpus: int = 0,
    priority: int = 500,
    duration: float = 2.0,
    exit_code: int | None = None,
    preemptible: bool = False,
) -> dict[str, Any]:
    runtime: dict[str, Any] = {"durationHintSeconds": duration}
    if exit_code is not None:
        runtime["exitCodeHint"] = exit_code
    return {
        "apiVersion": "nodewarden.io/v1alpha1",
        "kind": "ContainerDispatch",
        "metadata": {"name": name},
        "spec": {
            "uuid": f"zzzzz-dz642-{uuid_index:015d}",
            "priority": priority,
            "resources": {"vcpus": vcpus, "ram": ram, "gpus": gpus, "preemptible": preemptible},
            "command": ["sleep", str(duration)],
            "runtime": runtime,
        },
    }


def apply_many(env: DispatchEnv, objs: list[dict[str, Any]]) -> None:
    env.cluster.kubectl(
        "-n",
        env.namespace,
        "apply",
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objs}),
        timeout=300,
    )
