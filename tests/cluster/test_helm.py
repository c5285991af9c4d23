"""The Helm chart: lints, installs on the real API server, and its RBAC is enough to operate."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from clusterkit import ClusterHandle, start_operator, wait_for
from localcluster import REPO, binaries_dir
from nodewarden.config import OperatorConfig, load_config

pytestmark = pytest.mark.cluster

CHART = REPO / "helm" / "nodewarden"


def helm(*args: str, kubeconfig: Path | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [str(binaries_dir() / "helm"), *args]
    if kubeconfig is not None:
        cmd.append(f"--kubeconfig={kubeconfig}")
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=120)
    assert out.returncode == 0, out.stderr
    return out


def test_chart_lints() -> None:
    helm("lint", str(CHART), "--strict")


def test_alert_rules_pass_promtool() -> None:
    out = subprocess.run(
        ["promtool", "check", "rules", str(CHART / "files" / "alerts.yaml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def _rendered(*sets: str) -> list[dict[str, Any]]:
    args = ["template", "t", str(CHART), "--namespace", "nw"]
    for s in sets:
        args += ["--set", s]
    return [d for d in yaml.safe_load_all(helm(*args).stdout) if d]


def test_rendered_config_is_a_valid_operator_config(tmp_path: Path) -> None:
    docs = _rendered("dispatcherId=gpu-east", "management.tokenSecretName=nw-token")
    cm = next(d for d in docs if d["kind"] == "ConfigMap" and "config.yaml" in d["data"])
    path = tmp_path / "config.yaml"
    path.write_text(cm["data"]["config.yaml"])
    config = load_config(path)
    assert isinstance(config, OperatorConfig)
    assert config.dispatcher_id == "gpu-east"
    assert config.namespace == "nw"
    assert config.management.token_secret_name == "nw-token"
    kinds = {d["kind"] for d in docs}
    assert {"ServiceAccount", "Role", "RoleBinding", "Deployment", "Service", "ConfigMap"} <= kinds
    deploy = next(d for d in docs if d["kind"] == "Deployment")
    container = deploy["spec"]["template"]["spec"]["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert deploy["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True


def test_cloud_and_dispatch_values_reach_the_operator_config(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "cloud": {
                    "driver": "ec2",
                    "driver_params": {"region": "eu-west-1"},
                    "credentials": {
                        "key_ref": {"name": "c", "key": "k"},
                        "secret_ref": {"name": "c", "key": "s"},
                    },
                    "image": "ami-0123",
                    "instance_types": [
                        {
                            "name": "m5.large",
                            "provider_type": "m5.large",
                            "vcpus": 2,
                            "ram": "8Gi",
                            "price": 0.096,
                        }
                    ],
                },
                "dispatch": {
                    "ssh_private_key_secret": {"name": "ssh", "key": "id"},
                    "probe_interval": 5,
                },
            }
        )
    )
    out = helm("template", "t", str(CHART), "--namespace", "nw", "-f", str(values)).stdout
    cm = next(
        d
        for d in yaml.safe_load_all(out)
        if d and d["kind"] == "ConfigMap" and "config.yaml" in d["data"]
    )
    path = tmp_path / "config.yaml"
    path.write_text(cm["data"]["config.yaml"])
    config = load_config(path)
    assert config.cloud is not None and config.cloud.instance_types[0].ram == 8 * 2**30
    assert config.dispatch.probe_interval == 5
    assert config.dispatch.ssh_private_key_secret is not None


def test_optional_monitoring_objects_render() -> None:
    docs = _rendered("alerts.enabled=true", "metrics.serviceMonitor.enabled=true")
    kinds = {d["kind"] for d in docs}
    assert {"PrometheusRule", "ServiceMonitor"} <= kinds
    rule = next(d for d in docs if d["kind"] == "PrometheusRule")
    assert rule["spec"]["groups"][0]["rules"]


def _metric_names_in_chart() -> set[str]:
    text = (CHART / "files" / "alerts.yaml").read_text() + (
        CHART / "files" / "dashboard.json"
    ).read_text()
    names = set(re.findall(r"\b(nodewarden_[a-z_]+)", text))
    return {re.sub(r"_(bucket|count|sum)$", "", n) for n in names}


def test_helm_install_and_operate_with_the_charts_rbac(
    cluster: ClusterHandle, namespace: str, tmp_path: Path
) -> None:
    helm(
        "install",
        "nw",
        str(CHART),
        "--namespace",
        namespace,
        "--set",
        "dispatcherId=helmtest",
        "--wait=false",
        kubeconfig=cluster.kubeconfig,
    )
    sa = cluster.get_json(namespace, "serviceaccount", "nw-nodewarden")
    assert sa["metadata"]["name"] == "nw-nodewarden"
    # Run the operator with exactly the ServiceAccount's rights (token from TokenRequest).
    token = cluster.kubectl("-n", namespace, "create", "token", "nw-nodewarden").stdout.strip()
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    sa_config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": admin["clusters"],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [
            {
                "name": "sa",
                "context": {
                    "cluster": admin["clusters"][0]["name"],
                    "user": "sa",
                    "namespace": namespace,
                },
            }
        ],
        "current-context": "sa",
    }
    sa_kubeconfig = tmp_path / "sa.kubeconfig"
    sa_kubeconfig.write_text(json.dumps(sa_config))
    cm = cluster.get_json(namespace, "configmap", "nw-nodewarden")
    config_path = tmp_path / "config.yaml"
    config_path.write_text(cm["data"]["config.yaml"])

    class SA:
        kubeconfig = sa_kubeconfig
        operator_kubeconfig = sa_kubeconfig

    op = start_operator(SA, namespace, tmp_path, f"--config={config_path}", "--log-format=json")  # type: ignore[arg-type]
    try:
        cluster.kubectl(
            "-n",
            namespace,
            "apply",
            "-f",
            "-",
            input=json.dumps(
                {
                    "apiVersion": "nodewarden.io/v1alpha1",
                    "kind": "WorkerNode",
                    "metadata": {"name": "n1"},
                    "spec": {
                        "nodeType": "CloudVM",
                        "instanceType": "m5.large",
                        "policyRef": {"name": "missing"},
                    },
                }
            ),
        )

        def acknowledged() -> dict[str, Any] | None:
            status = cluster.get_json(namespace, "wn", "n1").get("status") or {}
            return status if status.get("observedGeneration") == 1 else None

        status = wait_for(acknowledged, timeout=20, what="acknowledged with SA rights")
        assert status["conditions"][0]["reason"] == "PolicyNotFound"
        wait_for(
            lambda: [
                e
                for e in cluster.get_json(namespace, "events")["items"]
                if e["reason"] == "PolicyNotFound"
            ],
            timeout=10,
            what="event posted with SA rights",
        )
        lease = cluster.get_json(namespace, "lease", "nodewarden-helmtest")
        assert lease["spec"]["holderIdentity"]
        code, metrics = op.get("/metrics")
        assert code == 200
        exported = set(re.findall(r"^# HELP (nodewarden_[a-z_]+)", metrics, re.M))
        exported |= {re.sub(r"_total$", "", n) for n in exported} | {n + "_total" for n in exported}
        missing = _metric_names_in_chart() - exported
        assert not missing, f"alerts/dashboard use metrics the operator does not export: {missing}"
        assert "forbidden" not in op.logs().lower(), op.logs()[-2000:]
        assert token not in op.logs()
    finally:
        op.stop()
