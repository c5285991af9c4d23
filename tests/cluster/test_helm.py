"""The Helm chart: lint, schema, knobs, per-release monitoring, alert rules, and its RBAC in use."""

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
REPOSITORY = "registry.example.org/platform/nodewarden"


def helm(
    *args: str, kubeconfig: Path | None = None, ok: bool = True
) -> subprocess.CompletedProcess[str]:
    cmd = [str(binaries_dir() / "helm"), *args]
    if kubeconfig is not None:
        cmd.append(f"--kubeconfig={kubeconfig}")
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=120)
    if ok:
        assert out.returncode == 0, out.stderr
    return out


def _rendered(*sets: str, release: str = "t", namespace: str = "nw") -> list[dict[str, Any]]:
    args = ["template", release, str(CHART), "--namespace", namespace]
    for s in ("image.repository=" + REPOSITORY, *sets):
        args += ["--set", s]
    return [d for d in yaml.safe_load_all(helm(*args).stdout) if d]


def _one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"{len(found)} {kind}"
    return found[0]


def _pod_spec(docs: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = _one(docs, "Deployment")["spec"]["template"]["spec"]
    return spec


# --- lint and schema ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "sets",
    [
        [],
        ["alerts.enabled=true", "metrics.serviceMonitor.enabled=true", "hostNetwork=true"],
    ],
)
def test_chart_lints_strict(sets: list[str]) -> None:
    args = ["lint", str(CHART), "--strict", "--set", f"image.repository={REPOSITORY}"]
    for s in sets:
        args += ["--set", s]
    helm(*args)


def test_install_without_an_image_repository_says_what_to_set() -> None:
    out = helm("template", "t", str(CHART), ok=False)
    assert out.returncode != 0
    assert "image.repository is not set" in out.stderr and "make image" in out.stderr


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ("replicas=two", "/replicas"),
        ("replicas=-1", "/replicas"),
        ("image.pullPolicy=Sometimes", "/image/pullPolicy"),
        ("image.digest=latest", "/image/digest"),
        ("podAntiAffinity=maybe", "/podAntiAffinity"),
        ("http.metricsPort=0", "/http/metricsPort"),
        ("dispatcherId=Fleet_East", "/dispatcherId"),
        ("resyncInterval=10 minutes", "/resyncInterval"),
        ("logLevel=LOUD", "/logLevel"),
        ("leaderElection.leaseDuration=0", "/leaderElection/leaseDuration"),
        ("podDisruptionBudget.maxUnavailable=0", "/podDisruptionBudget/maxUnavailable"),
        ("imagePullSecrets[0].nam=regcred", "/imagePullSecrets/0"),
        ("topologySpreadConstraints[0].whenUnsatisfiable=Never", "/topologySpreadConstraints/0"),
        ("extraVolumeMounts[0].name=x", "/extraVolumeMounts/0"),
        ("metrics.serviceMonitor.additionalLabels.bad/key/x=y", "bad/key/x"),
        ("replica=2", "replica"),
    ],
)
def test_values_schema_rejects_bad_values(value: str, field: str) -> None:
    for command in (["lint", "--strict"], ["template", "t"]):
        out = helm(*command, str(CHART), "--set", f"image.repository={REPOSITORY}", "--set",
                   value, ok=False)  # fmt: skip
        text = out.stdout + out.stderr
        assert out.returncode != 0, f"{command[0]} accepted {value}"
        assert "schema" in text and field in text, text


# --- operator config -----------------------------------------------------------------------


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
    assert (config.http.port, config.http.metrics_port) == (8080, 8081)
    # safe, non-zero hard caps by default (no PowerPolicy can raise them)
    limits = config.dispatch.limits
    assert (limits.max_nodes, limits.max_hourly_spend, limits.max_per_instance_type) == (
        50,
        25,
        20,
    )
    kinds = {d["kind"] for d in docs}
    assert {"ServiceAccount", "Role", "RoleBinding", "Deployment", "Service", "ConfigMap"} <= kinds
    assert "PodDisruptionBudget" in kinds
    pod = _pod_spec(docs)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["containers"][0]["image"] == f"{REPOSITORY}:0.1.0"


def test_cloud_and_dispatch_values_reach_the_operator_config(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "image": {"repository": REPOSITORY},
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


# --- knobs ---------------------------------------------------------------------------------


def test_probes_and_metrics_have_their_own_port() -> None:
    docs = _rendered()
    container = _pod_spec(docs)["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": 8080, "metrics": 8081, "probes": 8082}
    assert container["livenessProbe"]["httpGet"]["port"] == "probes"
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "probes"}
    cm = next(d for d in docs if d["kind"] == "ConfigMap" and "config.yaml" in d["data"])
    config = yaml.safe_load(cm["data"]["config.yaml"])
    assert config["http"]["probe_port"] == 8082
    assert config["http"]["header_timeout"] == 5 and config["http"]["max_connections"] == 512
    service = _one(docs, "Service")
    assert {p["name"]: p["targetPort"] for p in service["spec"]["ports"]} == {
        "metrics": "metrics",
        "http": "http",
    }
    env = {e["name"]: e for e in container["env"]}
    assert env["NODEWARDEN_POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"


def test_caps_default_policy_and_network_policy_render(tmp_path: Path) -> None:
    docs = _rendered(
        "limits.maxNodes=7",
        "limits.instanceTypes.gpu=2",
        "dispatch.tick_interval=2",
        "networkPolicy.enabled=true",
        "networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.team=monitoring",
        "networkPolicy.egress[0].ports[0].port=443",
    )
    cm = next(d for d in docs if d["kind"] == "ConfigMap" and "config.yaml" in d["data"])
    path = tmp_path / "config.yaml"
    path.write_text(cm["data"]["config.yaml"])
    config = load_config(path)
    assert config.dispatch.limits.max_nodes == 7
    assert config.dispatch.limits.instance_types == {"gpu": 2}
    assert config.dispatch.tick_interval == 2  # the rest of `dispatch` still passes through
    policy = _one(docs, "PowerPolicy")
    assert policy["metadata"]["name"] == "default"
    assert policy["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert policy["spec"] == {"maxNodes": 20, "maxHourlySpend": 10}
    assert "PowerPolicy" not in {d["kind"] for d in _rendered("defaultPowerPolicy.create=false")}
    netpol = _one(docs, "NetworkPolicy")["spec"]
    assert netpol["policyTypes"] == ["Ingress", "Egress"]
    by_port = {r["ports"][0]["port"]: r for r in netpol["ingress"]}
    assert "from" not in by_port["probes"]  # the kubelet, from wherever it probes
    assert by_port["metrics"]["from"][0]["namespaceSelector"]["matchLabels"]["team"] == "monitoring"
    assert (
        by_port["http"]["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/instance"]
        == "t"
    )
    assert "NetworkPolicy" not in {d["kind"] for d in _rendered()}  # off by default


def test_the_chart_installs_a_default_policy_only_if_none_exists(
    cluster: ClusterHandle, namespace: str
) -> None:
    def install(release: str, ns: str, verb: str = "install") -> None:
        helm(
            verb, release, str(CHART), "--namespace", ns,
            "--set", f"image.repository={REPOSITORY}", "--set", f"dispatcherId={release}",
            "--set", f"watchNamespace={ns}", "--wait=false",
            kubeconfig=cluster.kubeconfig,
        )  # fmt: skip

    # a site's own default policy is left alone
    own = {
        "apiVersion": "nodewarden.io/v1alpha1",
        "kind": "PowerPolicy",
        "metadata": {"name": "default"},
        "spec": {"maxNodes": 3},
    }
    cluster.kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(own))
    install("own", namespace)
    assert cluster.get_json(namespace, "pp", "default")["spec"]["maxNodes"] == 3
    # none exists: the chart's is installed, kept through an upgrade and an uninstall
    fresh = f"{namespace}-b"
    cluster.kubectl("create", "namespace", fresh)
    try:
        install("fresh", fresh)
        policy = cluster.get_json(fresh, "pp", "default")
        assert (policy["spec"]["maxNodes"], policy["spec"]["maxHourlySpend"]) == (20, 10)
        install("fresh", fresh, "upgrade")
        assert cluster.get_json(fresh, "pp", "default")["spec"]["maxNodes"] == 20
        helm("uninstall", "fresh", "--namespace", fresh, kubeconfig=cluster.kubeconfig)
        assert cluster.get_json(fresh, "pp", "default")["spec"]["maxNodes"] == 20
    finally:
        cluster.kubectl("delete", "namespace", fresh, "--wait=false", check=False)


def test_spread_is_soft_by_default_and_configurable() -> None:
    pod = _pod_spec(_rendered())
    preferred = pod["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    term = preferred[0]["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"]["app.kubernetes.io/instance"] == "t"
    (spread,) = pod["topologySpreadConstraints"]
    assert spread["whenUnsatisfiable"] == "ScheduleAnyway"
    assert spread["labelSelector"]["matchLabels"]["app.kubernetes.io/instance"] == "t"
    hard = _pod_spec(_rendered("podAntiAffinity=hard"))["affinity"]["podAntiAffinity"]
    assert "requiredDuringSchedulingIgnoredDuringExecution" in hard
    assert "affinity" not in _pod_spec(_rendered("podAntiAffinity=none"))
    pdb = _one(_rendered(), "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert "PodDisruptionBudget" not in {
        d["kind"] for d in _rendered("podDisruptionBudget.enabled=false")
    }


def test_every_knob_reaches_the_objects(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "image": {"repository": REPOSITORY, "tag": "1.2.3", "digest": "sha256:" + "a" * 64},
                "nameOverride": "warden",
                "imagePullSecrets": [{"name": "regcred"}],
                "serviceAccount": {"annotations": {"eks.amazonaws.com/role-arn": "arn:x"}},
                "podAnnotations": {"example.org/a": "b"},
                "podLabels": {"team": "batch"},
                "extraEnv": [{"name": "EXTRA", "value": "1"}],
                "extraVolumes": [{"name": "plugins", "emptyDir": {}}],
                "extraVolumeMounts": [{"name": "plugins", "mountPath": "/plugins"}],
                "hostNetwork": True,
                "priorityClassName": "system-cluster-critical",
                "metrics": {"serviceMonitor": {"enabled": True, "additionalLabels": {"r": "k"}}},
                "alerts": {"enabled": True, "additionalLabels": {"r": "k"}},
            }
        )
    )
    out = helm("template", "rel", str(CHART), "-n", "nw", "-f", str(values)).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    assert _one(docs, "Deployment")["metadata"]["name"] == "rel-warden"
    pod = _pod_spec(docs)
    container = pod["containers"][0]
    assert container["image"] == f"{REPOSITORY}:1.2.3@sha256:{'a' * 64}"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert {"name": "EXTRA", "value": "1"} in container["env"]
    assert {"name": "plugins", "mountPath": "/plugins"} in container["volumeMounts"]
    assert {"name": "plugins", "emptyDir": {}} in pod["volumes"]
    template = _one(docs, "Deployment")["spec"]["template"]["metadata"]
    assert template["annotations"]["example.org/a"] == "b"
    assert template["labels"]["team"] == "batch"
    sa = _one(docs, "ServiceAccount")
    assert sa["metadata"]["annotations"] == {"eks.amazonaws.com/role-arn": "arn:x"}
    assert _one(docs, "ServiceMonitor")["metadata"]["labels"]["r"] == "k"
    assert _one(docs, "PrometheusRule")["metadata"]["labels"]["r"] == "k"
    full = _rendered("fullnameOverride=fleet")
    assert _one(full, "Deployment")["metadata"]["name"] == "fleet"


def _leaf_values(data: Any, prefix: str = "") -> set[str]:
    opaque = {
        "resources",
        "podSecurityContext",
        "securityContext",
        "topologySpreadConstraints",
        "defaultPowerPolicy.spec",
    }
    if not isinstance(data, dict) or not data or prefix in opaque:
        return {prefix}
    out: set[str] = set()
    for key, value in data.items():
        out |= _leaf_values(value, f"{prefix}.{key}" if prefix else key)
    return out


def test_chart_readme_lists_every_value_with_its_default() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    readme = (CHART / "README.md").read_text()
    listed = set(re.findall(r"^\| `([A-Za-z.]+)` \|", readme, re.M))
    assert _leaf_values(values) - listed == set(), "values missing from the chart README"
    assert listed - _leaf_values(values) == set(), "the README lists values that do not exist"


# --- monitoring per release ----------------------------------------------------------------


def _monitoring(release: str, namespace: str) -> tuple[dict[str, Any], dict[str, Any]]:
    docs = _rendered("alerts.enabled=true", release=release, namespace=namespace)
    rules = _one(docs, "PrometheusRule")["spec"]
    dashboard_cm = next(d for d in docs if d["metadata"]["name"].endswith("-dashboard"))
    (text,) = dashboard_cm["data"].values()
    return rules, json.loads(text)


def test_two_releases_have_their_own_dashboard_and_alerts() -> None:
    rules_a, dash_a = _monitoring("a", "ns1")
    rules_b, dash_b = _monitoring("b", "ns2")
    assert dash_a["uid"] != dash_b["uid"] and len(dash_a["uid"]) <= 40
    for dash, selector in ((dash_a, 'namespace="ns1", job="a-nodewarden-metrics"'),):
        exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
        assert exprs and all(selector in e for e in exprs), exprs
    exprs = [r["expr"] for g in rules_a["groups"] for r in g["rules"]]
    assert all('namespace="ns1", job="a-nodewarden-metrics"' in e for e in exprs), exprs
    assert "absent(nodewarden_build_info{" in " ".join(exprs)
    for rule in (r for g in rules_a["groups"] for r in g["rules"]):
        assert rule["labels"]["namespace"] == "ns1" and rule["labels"]["release"] == "a"
    assert {g["name"] for g in rules_a["groups"]}.isdisjoint(g["name"] for g in rules_b["groups"])


PROMTOOL_TESTS = """
rule_files: [rules.yaml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'nodewarden_leader{namespace="ns1", job="a-nodewarden-metrics", dispatcher_id="d"}'
        values: '0x10'
      - series: 'nodewarden_build_info{namespace="ns2", job="b-nodewarden-metrics", version="0.1.0"}'
        values: '1x10'
      - series: 'nodewarden_invalid_objects{namespace="ns1", job="a-nodewarden-metrics", kind="WorkerNode"}'
        values: '2x20'
      - series: 'nodewarden_reconcile_total{namespace="ns1", job="a-nodewarden-metrics", kind="PowerIntent", result="error"}'
        values: '0+60x20'
      - series: 'nodewarden_leader{namespace="ns2", job="b-nodewarden-metrics", dispatcher_id="other"}'
        values: '0x10'
      - series: 'nodewarden_creates_stopped{namespace="ns1", job="a-nodewarden-metrics"}'
        values: '1x10'
      - series: 'nodewarden_creates_stopped{namespace="ns2", job="b-nodewarden-metrics"}'
        values: '1x10'
      - series: 'nodewarden_held_workernodes{namespace="ns1", job="a-nodewarden-metrics"}'
        values: '3x40'
    alert_rule_test:
      - eval_time: 3m
        alertname: NodewardenCreatesStopped
        exp_alerts: []
      - eval_time: 6m
        alertname: NodewardenCreatesStopped
        exp_alerts:
          - exp_labels: {severity: critical, namespace: ns1, release: a, team: t}
            exp_annotations:
              summary: "nodewarden creates no cloud instance: the default PowerPolicy is missing or invalid"
              description: "Without a usable default PowerPolicy nodewarden creates nothing (it never falls back to unlimited); containers that need a new node wait. kubectl -n ns1 get pp -o wide; the waiting containers' schedulingStatus and the declared WorkerNodes' Launched condition say why. Create or fix the policy named by defaultPolicy (the chart installs one with defaultPowerPolicy.create)."
      - eval_time: 20m
        alertname: NodewardenCapReached
        exp_alerts: []
      - eval_time: 31m
        alertname: NodewardenCapReached
        exp_alerts:
          - exp_labels: {severity: info, namespace: ns1, release: a, team: t}
            exp_annotations:
              summary: "3 declared CloudVM WorkerNode(s) wait for an instance: a hard cap refuses it"
              description: "Their Launched condition names the cap (the operator's limits.* or the default PowerPolicy's maxNodes / maxHourlySpend / instanceTypeLimits). kubectl -n ns1 get wn -o custom-columns=NAME:.metadata.name,LAUNCHED:.status.conditions[?(@.type=='Launched')].message; raise the cap (docs/operations.md, Hard caps) or delete the WorkerNodes nobody needs."
      - eval_time: 3m
        alertname: NodewardenNoLeader
        exp_alerts:
          - exp_labels: {severity: critical, namespace: ns1, release: a, team: t, dispatcher_id: d}
            exp_annotations:
              summary: "nodewarden dispatcher d has no acting replica"
              description: "No replica holds the dispatcher's Lease for 2 minutes: nothing is dispatched and no node is powered on or off."
      - eval_time: 1m
        alertname: NodewardenNoLeader
        exp_alerts: []
      - eval_time: 6m
        alertname: NodewardenDown
        exp_alerts:
          - exp_labels: {severity: critical, namespace: ns1, release: a, team: t, job: a-nodewarden-metrics}
            exp_annotations:
              summary: "nodewarden a-nodewarden-metrics in ns1 is not being scraped"
              description: "No replica of this release has exported metrics for 5 minutes."
      - eval_time: 16m
        alertname: NodewardenInvalidObjects
        exp_alerts:
          - exp_labels: {severity: warning, namespace: ns1, release: a, team: t, kind: WorkerNode}
            exp_annotations:
              summary: "2 invalid WorkerNode object(s)"
              description: "Objects with Valid=False are not acted on. kubectl get workernode -o wide; the condition message names the field to fix."
      - eval_time: 20m
        alertname: NodewardenReconcileErrors
        exp_alerts:
          - exp_labels: {severity: warning, namespace: ns1, release: a, team: t, kind: PowerIntent}
            exp_annotations:
              summary: "nodewarden fails to reconcile PowerIntent objects"
              description: "Reconciles are failing with API errors; check the operator logs and RBAC."
"""


def test_alert_rules_pass_promtool_and_fire_per_release(tmp_path: Path) -> None:
    """promtool checks the rendered rules and their firing conditions: release a's
    NodewardenDown fires although release b is up, and b's leaderless metrics never
    raise a's NodewardenNoLeader. The power path's rules: tests/monitoring."""
    docs = _rendered("alerts.enabled=true", "alerts.alertLabels.team=t", release="a",
                     namespace="ns1")  # fmt: skip
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(_one(docs, "PrometheusRule")["spec"]))
    (tmp_path / "tests.yaml").write_text(PROMTOOL_TESTS)
    for args in (["check", "rules", "rules.yaml"], ["test", "rules", "tests.yaml"]):
        out = subprocess.run(
            ["promtool", *args], capture_output=True, text=True, check=False, cwd=tmp_path
        )
        assert out.returncode == 0, out.stdout + out.stderr


def _metric_names_in_chart() -> set[str]:
    text = (CHART / "files" / "alerts.yaml").read_text() + (
        CHART / "files" / "dashboard.json"
    ).read_text()
    names = set(re.findall(r"\b(nodewarden_[a-z_]+)", text))
    return {re.sub(r"_(bucket|count|sum)$", "", n) for n in names}


# --- install on the API server, the operator with the chart's RBAC ------------------------


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
        "--set",
        f"image.repository={REPOSITORY}",
        "--wait=false",
        kubeconfig=cluster.kubeconfig,
    )
    sa = cluster.get_json(namespace, "serviceaccount", "nw-nodewarden")
    assert sa["metadata"]["name"] == "nw-nodewarden"
    pdb = cluster.get_json(namespace, "poddisruptionbudget", "nw-nodewarden")
    assert pdb["spec"]["maxUnavailable"] == 1
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
    config = yaml.safe_load(cm["data"]["config.yaml"])
    config["http"].pop("metrics_port")  # one free port for this host process (--http-port)
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(config))

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
