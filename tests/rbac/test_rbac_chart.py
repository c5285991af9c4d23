"""The chart's Role grants exactly the permission table (operator/nodewarden/kube/permissions.py)."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
import yaml

from localcluster import REPO, binaries_dir
from rbac.rbac_rules import role_grants, table_grants

CHART = REPO / "helm" / "nodewarden"


def rendered_role(*sets: str) -> dict[str, Any]:
    args = [str(binaries_dir() / "helm"), "template", "t", str(CHART), "--namespace", "nw"]
    args += ["--set", "image.repository=registry.example.org/nodewarden"]
    for s in sets:
        args += ["--set", s]
    out = subprocess.run(args, capture_output=True, text=True, check=True, timeout=120)
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    return next(d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] == "t-nodewarden")


def test_the_role_is_the_permission_table() -> None:
    role = rendered_role("dispatcherId=east")
    assert role_grants(role["rules"], {"nodewarden-east": "nodewarden-*"}) == table_grants()


@pytest.mark.parametrize(
    ("sets", "names"),
    [
        ((), None),
        (
            (
                "credentials.secretNames={gpu-bmc,node-ssh}",
                "management.tokenSecretName=status",
                "dispatch.ssh_private_key_secret.name=op-ssh",
                "dispatch.ssh_private_key_secret.key=id",
            ),
            ["gpu-bmc", "node-ssh", "status", "op-ssh"],
        ),
    ],
)
def test_secret_reads_can_be_narrowed_to_named_secrets(
    sets: tuple[str, ...], names: list[str] | None
) -> None:
    rule = next(r for r in rendered_role(*sets)["rules"] if r["resources"] == ["secrets"])
    assert rule["verbs"] == ["get"]
    assert rule.get("resourceNames") == names
