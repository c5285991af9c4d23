"""The chart's requester admission policy on the local control plane, for cluster tests.

`requester_policy(cluster, namespace, operator_username)` renders the chart's
`templates/requesters.yaml` (ValidatingAdmissionPolicy, its binding to `namespace`, the
`powerintents/override` Role, optionally bound to `override_subjects`) with the real helm,
applies it and returns once the policy is in force: a dry-run PowerIntent naming another
requester is refused (policies take a moment to compile and bind). The cluster-scoped
policy and binding are deleted again by `close()` (each test namespace has its own).
"""

from __future__ import annotations

import json
import subprocess
import uuid
from dataclasses import dataclass
from typing import Any

import yaml

from clusterkit import ClusterHandle, wait_for
from localcluster import REPO, binaries_dir

CHART = REPO / "helm" / "nodewarden"
RELEASE = "t"


def render(
    namespace: str, operator_username: str, override_subjects: list[dict[str, str]] | None = None
) -> list[dict[str, Any]]:
    args = [str(binaries_dir() / "helm"), "template", RELEASE, str(CHART)]
    args += ["--namespace", namespace, "--show-only", "templates/requesters.yaml"]
    args += ["--set", "image.repository=registry.example.org/nodewarden"]
    args += ["--set", f"requesters.operatorUsername={operator_username}"]
    args += ["--set-json", f"requesters.overrideSubjects={json.dumps(override_subjects or [])}"]
    out = subprocess.run(args, capture_output=True, text=True, check=True, timeout=120)
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def intent(name: str, requested_by: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "nodewarden.io/v1alpha1",
        "kind": "PowerIntent",
        "metadata": {"name": name},
        "spec": {
            "nodeName": "some-node",
            "action": "Shutdown",
            "source": "Manual",
            "requestedBy": requested_by,
            **spec,
        },
    }


@dataclass
class RequesterPolicy:
    cluster: ClusterHandle
    namespace: str
    docs: list[dict[str, Any]]

    def close(self) -> None:
        for doc in self.docs:
            if doc["kind"] in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"):
                self.cluster.kubectl(
                    "delete", doc["kind"].lower(), doc["metadata"]["name"], "--wait=false",
                    check=False,
                )  # fmt: skip


def requester_policy(
    cluster: ClusterHandle,
    namespace: str,
    operator_username: str,
    override_subjects: list[dict[str, str]] | None = None,
) -> RequesterPolicy:
    docs = render(namespace, operator_username, override_subjects)
    cluster.kubectl(
        "-n",
        namespace,
        "apply",
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}),
    )
    policy = RequesterPolicy(cluster, namespace, docs)

    def refused() -> bool:
        probe = intent(f"probe-{uuid.uuid4().hex[:8]}", "not-the-admin")
        out = cluster.kubectl(
            "-n", namespace, "create", "--dry-run=server", "-f", "-",
            input=json.dumps(probe), check=False,
        )  # fmt: skip
        return out.returncode != 0 and "spec.requestedBy must be" in out.stderr

    wait_for(refused, timeout=30, interval=0.3, what="the requester admission policy in force")
    return policy
