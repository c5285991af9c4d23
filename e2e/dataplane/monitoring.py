"""Debian's prometheus, configured from the chart's ServiceMonitor and PrometheusRule.

prometheus-operator cannot be installed here (no registry, no internet), so this module
does its part for the ServiceMonitor and PrometheusRule the chart creates, the way the
operator would: a scrape job per ServiceMonitor endpoint whose targets are the endpoints
of the Services it selects, from their EndpointSlices, on the named port, with the labels
prometheus-operator gives its targets (`namespace`, `service`, `pod`, and `job` = the
Service name), and a rules file with the PrometheusRule's groups. Debian builds
prometheus without Kubernetes service discovery, so a thread here reads the
EndpointSlices every 2 s and writes them to a `file_sd` file (what `kubernetes_sd`
would do). The two CRDs are skeletons (`x-kubernetes-preserve-unknown-fields`): a
stand-in for prometheus-operator's CRDs, which cannot be fetched here, only so the
chart's objects can be created and read.

Prometheus listens on the node namespace's loopback and reaches the Pods by their IPs
through the Pod bridge; nothing leaves the namespaces.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from nodewarden_doubles.ports import unused_loopback_port

Kubectl = Callable[..., str]

_SKELETON_CRDS = [("servicemonitors", "ServiceMonitor"), ("prometheusrules", "PrometheusRule")]


def _crd(plural: str, kind: str) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.monitoring.coreos.com"},
        "spec": {
            "group": "monitoring.coreos.com",
            "names": {"plural": plural, "singular": kind.lower(), "kind": kind},
            "scope": "Namespaced",
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                }
            ],
        },
    }


def _label_name(key: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", key)


def dashboard_queries(configmap: dict[str, Any]) -> list[str]:
    """Every PromQL expression of every panel of the dashboard(s) in a ConfigMap."""
    queries: list[str] = []
    for text in configmap["data"].values():
        for panel in json.loads(text)["panels"]:
            queries += [t["expr"] for t in panel.get("targets", []) if t.get("expr")]
    return queries


class Prometheus:
    """One prometheus process with its own data directory and a free loopback port."""

    def __init__(self, workdir: Path, kubeconfig: Path) -> None:
        self.workdir = workdir
        self.kubeconfig = kubeconfig
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = unused_loopback_port()
        self.url = f"http://127.0.0.1:{self.port}"

    @staticmethod
    def install_monitoring_crds(kubectl: Kubectl) -> None:
        docs = "\n---\n".join(json.dumps(_crd(p, k)) for p, k in _SKELETON_CRDS)
        kubectl("apply", "-f", "-", input=docs)
        kubectl("wait", "--for=condition=Established", "--timeout=60s",
                *[f"crd/{p}.monitoring.coreos.com" for p, _ in _SKELETON_CRDS])  # fmt: skip

    def configure_from(self, kubectl: Kubectl, namespace: str) -> None:
        """Scrape jobs and rules from the namespace's ServiceMonitors and PrometheusRules."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._kubectl, self._namespace = kubectl, namespace
        monitors = json.loads(kubectl("-n", namespace, "get", "servicemonitors", "-o", "json"))
        rules = json.loads(kubectl("-n", namespace, "get", "prometheusrules", "-o", "json"))
        jobs = []
        self._monitors: list[tuple[Path, dict[str, str], str]] = []
        for sm in monitors["items"]:
            for i, endpoint in enumerate(sm["spec"]["endpoints"]):
                targets = self.workdir / f"targets-{sm['metadata']['name']}-{i}.json"
                self._monitors.append(
                    (targets, sm["spec"]["selector"]["matchLabels"], endpoint["port"])
                )
                jobs.append(
                    {
                        "job_name": f"serviceMonitor/{namespace}/{sm['metadata']['name']}/{i}",
                        "scrape_interval": endpoint.get("interval", "30s"),
                        "metrics_path": endpoint.get("path", "/metrics"),
                        "file_sd_configs": [{"files": [str(targets)], "refresh_interval": "5s"}],
                    }
                )
        groups = [g for rule in rules["items"] for g in rule["spec"]["groups"]]
        (self.workdir / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
        config = {
            "global": {"scrape_interval": "5s", "evaluation_interval": "5s"},
            "rule_files": [str(self.workdir / "rules.yaml")],
            "scrape_configs": jobs,
        }
        (self.workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        if not jobs or not groups:
            raise AssertionError(f"chart created no ServiceMonitor ({len(jobs)}) or rules")
        self.discover()

    def discover(self) -> None:
        """Write each job's targets: ready endpoints of the selected Services, named port."""
        for targets, selector, port_name in self._monitors:
            labels = ",".join(f"{k}={v}" for k, v in selector.items())
            services = json.loads(
                self._kubectl("-n", self._namespace, "get", "services", "-l", labels, "-o", "json")
            )["items"]
            groups = []
            for svc in services:
                name = svc["metadata"]["name"]
                slices = json.loads(
                    self._kubectl("-n", self._namespace, "get", "endpointslices", "-l",
                                  f"kubernetes.io/service-name={name}", "-o", "json")
                )["items"]  # fmt: skip
                for sl in slices:
                    ports = [p["port"] for p in sl.get("ports") or [] if p.get("name") == port_name]
                    for ep in sl.get("endpoints") or []:
                        if not (ep.get("conditions") or {}).get("ready", True) or not ports:
                            continue
                        pod = (ep.get("targetRef") or {}).get("name", "")
                        groups += [
                            {
                                "targets": [f"{address}:{ports[0]}"],
                                "labels": {
                                    "namespace": self._namespace,
                                    "service": name,
                                    "pod": pod,
                                    "job": name,
                                },
                            }
                            for address in ep["addresses"]
                        ]
            partial = targets.with_suffix(".tmp")
            partial.write_text(json.dumps(groups))
            partial.replace(targets)

    def _discovery_loop(self) -> None:
        while not self._stopping.wait(2.0):
            try:
                self.discover()
            except Exception as exc:  # the API server may be restarting: try again
                print(f">> prometheus discovery: {exc}", flush=True)

    def start(self, timeout: float = 60) -> None:
        log = (self.workdir / "prometheus.log").open("ab")
        self.proc = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={self.workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--storage.tsdb.retention.time=1d",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"prometheus exited: {self.workdir / 'prometheus.log'}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:  # noqa: S310
                    if r.status == 200:
                        self.start_discovery()
                        return
            except OSError:
                pass
            time.sleep(0.5)
        raise AssertionError("prometheus not ready")

    def start_discovery(self) -> None:
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._discovery_loop, daemon=True)
        self._thread.start()

    def _api(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        url = f"{self.url}/api/v1/{path}" + (f"?{query}" if query else "")
        with urllib.request.urlopen(url, timeout=10) as answer:  # noqa: S310
            return json.loads(answer.read())["data"]

    def up_targets(self) -> list[str]:
        """Pod names of the targets whose last scrape succeeded."""
        active = self._api("targets", state="active")["activeTargets"]
        return sorted(t["labels"].get("pod", "?") for t in active if t["health"] == "up")

    def query(self, expr: str) -> list[Any]:
        result: list[Any] = self._api("query", query=expr)["result"]
        return result

    def rule_health(self) -> dict[str, str]:
        """Rule name -> health ("ok", "err", "unknown") of every loaded rule."""
        groups = self._api("rules")["groups"]
        return {r["name"]: r["health"] for g in groups for r in g["rules"]}

    def stop(self) -> None:
        if getattr(self, "_stopping", None) is not None:
            self._stopping.set()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
