"""The chart's sharding value: off by default (config and Role as before), above 1 it
sets `sharding.shards` in the operator config and grants the sharding Lease permissions
(`kube.permissions.SHARDING_PERMISSIONS`), exactly."""

from __future__ import annotations

import subprocess
from typing import Any

import yaml

from localcluster import REPO, binaries_dir
from nodewarden.config import OperatorConfig
from nodewarden.kube.permissions import SHARDING_PERMISSIONS
from rbac.rbac_rules import role_grants, table_grants

CHART = REPO / "helm" / "nodewarden"


def rendered(*sets: str) -> list[dict[str, Any]]:
    args = [str(binaries_dir() / "helm"), "template", "t", str(CHART), "--namespace", "nw"]
    args += [
        "--set",
        "image.repository=registry.example.org/nodewarden",
        "--set",
        "dispatcherId=east",
    ]
    for s in sets:
        args += ["--set", s]
    out = subprocess.run(args, capture_output=True, text=True, check=True, timeout=120)
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def role_and_config(*sets: str) -> tuple[set[tuple[str, str, str, str]], OperatorConfig]:
    docs = rendered(*sets)
    role = next(d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] == "t-nodewarden")
    cm = next(d for d in docs if d["kind"] == "ConfigMap" and "config.yaml" in d.get("data", {}))
    config = OperatorConfig.model_validate(yaml.safe_load(cm["data"]["config.yaml"]))
    return role_grants(role["rules"], {"nodewarden-east": "nodewarden-*"}), config


def test_sharding_off_by_default_and_on_with_exactly_the_lease_grants() -> None:
    grants, config = role_and_config()
    assert grants == table_grants() and config.sharding.shards == 1
    grants, config = role_and_config("sharding.shards=4")
    assert config.sharding.shards == 4
    extra = {(p.group, p.resource, verb, "*") for p in SHARDING_PERMISSIONS for verb in p.verbs}
    assert grants == table_grants() | extra
