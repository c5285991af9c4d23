"""What `make e2e` does on the data plane, and what it asserts (the steps print as they go).

The same on every `dataplane.envs.Environment` (network namespaces here, kind elsewhere):

1. Cluster: a node with a real kubelet (`dataplane.node` here), the operator image known
   to it under two tags.
2. Cloud and side node: the stub cloud server (test double) in a network namespace of
   its own; the operator Pods reach it through `nwe2e_routedcloud`
   (`dataplane.routedcloud`), copied with the doubles into a directory mounted
   read-only into the Pods (never into the image). Beside it, the side-node process
   (`dataplane.sidenodes`: one GPU side node behind a fake Redfish BMC, its SSH server
   up only while the BMC says On), reached by the Pods at the same routed address.
3. `helm install` of helm/nodewarden with the locally built image, 2 replicas, status
   API token, ServiceMonitor + PrometheusRule, `credentials.*` admitting exactly the side
   node's BMC and SSH endpoints (`secretNames`: its two designated Secrets): CRDs come
   from the chart; both Pods Running and Ready as ordinary Pods (own Pod IPs) with the
   chart's securityContext (read-only root filesystem, non-root), exactly one leader on
   the Lease.
4. Monitoring: Debian's prometheus configured from the chart's ServiceMonitor and
   PrometheusRule (`dataplane.monitoring`) scrapes both Pods through the metrics Service.
5. Status API: every Pod answers (the standby relays to the leader), through the Service
   too; a missing or wrong token is refused by either; metrics and probes live on their
   own port.
6. Batch: the demo's containers; while they run, the leader's container is killed
   (SIGKILL, no goodbye): another replica holds the Lease within the lease time, every
   container completes, and the stub cloud saw each container started exactly once.
7. Upgrade (full run only): a chart copy with a changed CRD (a new field) and a new image
   tag. The CRDs are applied the documented way (`helm show crds | kubectl apply
   --server-side`), then `helm upgrade`: a rolling update while a second batch runs,
   without losing or repeating a container; the new field is kept (not pruned).
8. Side-node power cycle, through the operator Pods: the side node's designated Secrets,
   its own fast PowerPolicy and its WorkerNode go in (only now, so the batches above
   never had a side node to run on). The idle node is drained and switched off: a
   policy-made Shutdown PowerIntent Succeeded (POWER_OFF_CONFIRMED) whose request record
   passed every gate, exactly one GracefulShutdown in the BMC's own log, and OFF read
   no earlier than the BMC applied it (the fake BMC applies a reset seconds after
   accepting it). Then a GPU container of a GPU model no instance type has (it fits
   only the side node) wakes it: once the BMC has the On and the node is WAKING, the
   leader Pod is killed; the replica that takes over resumes from
   `WorkerNode.status.powerState` and confirms On itself. The container runs on the
   side node exactly once (never on the cloud); the one Wake intent Succeeded with
   POWER_ON_CONFIRMED + READY_CONFIRMED, admission opened after On and ready were
   observed and the container started after that; the BMC received exactly one On. The
   node's energy figures (its fake BMC reports a draw and a kWh counter) count the off
   period and the shutdown, and the Wake's record carries the measured saving.
9. Dashboards and alerts: after a last short batch, the idle VMs' shutdown decisions and
   the power cycle (the energy panels need the side node's readings), every PromQL
   expression of every dashboard panel returns data, and the alert rules are loaded and
   evaluate without error.

The trimmed form (`make test`) runs all but 7, with four short containers.
"""

from __future__ import annotations

import copy
import ipaddress
import json
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from calibration import scaled
from dataplane import sidenodes
from dataplane.envs import Environment
from dataplane.monitoring import Prometheus, dashboard_queries
from localcluster import REPO, binaries_dir
from nodewarden.ssh.credentials import SshClientKey
from nodewarden_doubles.stubcloud.serverconfig import StubServerConfig, StubServerCredentials

CHART = REPO / "helm" / "nodewarden"
DEMO = REPO / "e2e" / "demo"
NAMESPACE = "nodewarden"
RELEASE = "nw"
DISPATCHER = "e2e"
PLUGIN_MODULE = "nwe2e_routedcloud"
PLUGIN_DIR_IN_POD = "/opt/nodewarden-e2e"
LEASE = f"nodewarden-{DISPATCHER}"
LEASE_DURATION = 15
RETRY_INTERVAL = 2


class E2EError(AssertionError):
    """An e2e assertion failed; the message says what was expected and what was seen."""


def log(msg: str) -> None:
    print(f">> [e2e {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class NotYet(str):
    """What a `wait_for` check returns while its condition does not hold yet (the reason)."""


def wait_for(what: str, check: Callable[[], Any], timeout: float, interval: float = 1.0) -> Any:
    """Poll `check` until it returns something truthy that is not `NotYet`; E2EError
    naming `what` and the last answer after `timeout` (scaled by the calibration figure)."""
    timeout = scaled(timeout)
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = check()
        except (OSError, urllib.error.URLError, subprocess.SubprocessError) as exc:
            last = NotYet(f"{type(exc).__name__}: {exc}")
        if last and not isinstance(last, NotYet):
            return last
        if time.monotonic() >= deadline:
            raise E2EError(f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}")
        time.sleep(interval)


@dataclass
class Http:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def http_get(url: str, headers: dict[str, str] | None = None, timeout: float = 10) -> Http:
    request = urllib.request.Request(url, headers=headers or {})  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:  # noqa: S310
            return Http(answer.status, dict(answer.headers), answer.read())
    except urllib.error.HTTPError as exc:
        return Http(exc.code, dict(exc.headers), exc.read())


@dataclass
class Scenario:
    state: Path
    env: Environment
    trimmed: bool
    report: dict[str, Any] = field(default_factory=dict)
    started: bool = False
    prometheus: Prometheus | None = None
    token: str = field(default_factory=lambda: secrets.token_hex(16))
    helm_bin: Path = field(default_factory=lambda: binaries_dir() / "helm")
    cleanup_paths: list[Path] = field(default_factory=list)
    ssh_key: SshClientKey = field(default_factory=SshClientKey.generate)
    bmc_password: str = field(default_factory=sidenodes.new_bmc_password)
    side_state: dict[str, Any] = field(default_factory=dict)

    # --- plumbing ------------------------------------------------------------------------

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        return self.env.kubectl(*args, input=input, check=check)

    def get(self, *what: str) -> Any:
        return json.loads(self.kubectl("-n", NAMESPACE, "get", *what, "-o", "json"))

    def helm(self, *args: str, timeout: float = 600) -> str:
        proc = subprocess.run(
            [str(self.helm_bin), *args, f"--kubeconfig={self.env.kubeconfig}"],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if proc.returncode != 0:
            raise E2EError(f"helm {' '.join(args[:2])} failed: {proc.stderr.strip()}")
        return proc.stdout

    def timed(self, name: str, started: float) -> None:
        self.report.setdefault("seconds", {})[name] = round(time.monotonic() - started, 1)

    # --- 1. cluster ----------------------------------------------------------------------

    def start_cluster(self) -> None:
        self.plugins = self.plugin_dir()
        self.env.start(self.plugins)
        self.started = True
        for name, seconds in self.env.timings.items():
            self.report.setdefault("seconds", {})[name] = round(seconds, 1)
        log("cluster up: node Ready, images known to the node")

    # --- 2. cloud ------------------------------------------------------------------------

    def start_cloud(self) -> None:
        self.cloud_key, self.cloud_secret = "AKIAE2ESTUBCLOUD001", secrets.token_hex(20)
        config = StubServerConfig(
            name="e2e",
            credentials=StubServerCredentials(key=self.cloud_key, secret=self.cloud_secret),
            instance_types=yaml.safe_load((DEMO / "catalogue.yaml").read_text()),
            faults={"boot_delay": 2.0, "seed": 1},
        )
        self.cloud_url = self.env.start_cloud(config, self.state / "stub-cloud")
        # A few refused calls, so the dashboards' cloud error panel has something to show.
        self.env.cloud_admin(lambda admin: admin.force_rate_limit(3, retry_after=1))
        log(f"stub cloud started, reached by the Pods at {self.cloud_url}")

    def start_side_nodes(self) -> None:
        """The side-node process beside the cloud; before the install, whose values admit
        exactly its endpoints. Its WorkerNode comes in step 9 (until then it is no
        placement target, so the batches run on the cloud only)."""
        config = sidenodes.process_config(self.ssh_key.public_key, self.bmc_password)
        side = self.env.start_side_nodes(config, self.state / "side-nodes")
        self.side_state = side.state
        info = side.node_info(sidenodes.NODE)
        log(f"side node {sidenodes.NODE} started: BMC {info['power']['endpoint']}, "
            f"SSH {info['ssh']['host']}:{info['ssh']['port']}")  # fmt: skip

    # --- 3. install ----------------------------------------------------------------------

    def plugin_dir(self) -> Path:
        """The test doubles + the routed driver, for a read-only hostPath in the Pods (in a
        directory uid 65532 can reach: the state directory may sit under a private one)."""
        target = Path(tempfile.mkdtemp(prefix="nwe2e-plugins-"))
        self.cleanup_paths.append(target)
        shutil.copytree(
            REPO / "operator" / "nodewarden_doubles",
            target / "nodewarden_doubles",
            ignore=shutil.ignore_patterns("__pycache__"),
        )
        shutil.copy(Path(__file__).with_name("routedcloud.py"), target / f"{PLUGIN_MODULE}.py")
        for path in [*target.rglob("*"), target]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        return target

    def values(self, image_ref: str) -> dict[str, Any]:
        repository, tag = image_ref.rsplit(":", 1)
        config = yaml.safe_load((REPO / "e2e" / "demo-config.yaml").read_text())
        return {
            "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
            "dispatcherId": DISPATCHER,
            "resyncInterval": "10s",
            "management": {"tokenSecretName": "nodewarden-status"},
            "leaderElection": {
                "leaseDuration": LEASE_DURATION,
                "renewInterval": 5,
                "retryInterval": RETRY_INTERVAL,
            },
            "dispatch": config["dispatch"],
            "cloud": {
                **config["cloud"],
                "driver": "nodewarden-stub-routed",
                "driver_plugin": f"{PLUGIN_MODULE}:plugin",
                "driver_params": {"cloud": self.cloud_url},
                "instance_types": yaml.safe_load((DEMO / "catalogue.yaml").read_text()),
            },
            "extraEnv": [{"name": "PYTHONPATH", "value": PLUGIN_DIR_IN_POD}, *self.env.pod_env()],
            "extraVolumes": [{"name": "e2e-plugins", **self.env.plugin_volume(self.plugins)}],
            "extraVolumeMounts": [
                {"name": "e2e-plugins", "mountPath": PLUGIN_DIR_IN_POD, "readOnly": True}
            ],
            "metrics": {"serviceMonitor": {"enabled": True, "interval": "5s"}},
            "alerts": {"enabled": True, "alertLabels": {"team": "e2e"}},
            **sidenodes.chart_values(self.side_state),
        }

    def write_secrets(self) -> None:
        for name, data in {
            "nodewarden-ssh": {"id": self.ssh_key.export_private().get_secret_value()},
            "nodewarden-cloud": {"key": self.cloud_key, "secret": self.cloud_secret},
            "nodewarden-status": {"token": self.token},
        }.items():
            secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}}
            secret["stringData"] = data
            self.kubectl("-n", NAMESPACE, "apply", "-f", "-", input=json.dumps(secret))

    def install(self) -> None:
        t0 = time.monotonic()
        self.kubectl("create", "namespace", NAMESPACE)
        self.write_secrets()
        Prometheus.install_monitoring_crds(self.kubectl)
        values = self.state / "values.yaml"
        values.write_text(yaml.safe_dump(self.values(self.env.image_ref)))
        self.helm("install", RELEASE, str(CHART), "-n", NAMESPACE, "-f", str(values),
                  "--wait", "--timeout=5m")  # fmt: skip
        self.kubectl("-n", NAMESPACE, "apply", "-f", str(DEMO / "policy-default.yaml"))
        pods = self.check_pods(self.env.image_ref)
        self.timed("helm_install_to_ready", t0)
        self.report["pods"] = [
            {"name": p["metadata"]["name"], "ip": p["status"]["podIP"]} for p in pods
        ]
        log(f"helm install: {len(pods)} operator Pods Running and Ready: {self.report['pods']}")

    def operator_pods(self) -> list[dict[str, Any]]:
        items = self.get("pods", "-l", f"app.kubernetes.io/instance={RELEASE}")["items"]
        return [p for p in items if not p["metadata"].get("deletionTimestamp")]

    def check_pods(self, image_ref: str) -> list[dict[str, Any]]:
        def ready_pods() -> list[dict[str, Any]] | NotYet:
            pods = self.operator_pods()
            ready = [
                p
                for p in pods
                if p["status"].get("phase") == "Running"
                and all(c.get("ready") for c in p["status"].get("containerStatuses", []))
                and p["spec"]["containers"][0]["image"] == image_ref
            ]
            done = len(ready) == 2 and len(pods) == 2
            return ready if done else NotYet(f"{len(ready)} of {len(pods)} ready")

        pods: list[dict[str, Any]] = wait_for("2 Ready operator Pods", ready_pods, timeout=180)
        ips = set()
        for pod in pods:
            spec = pod["spec"]
            sc = spec["containers"][0]["securityContext"]
            if not (sc.get("readOnlyRootFilesystem") and sc.get("runAsNonRoot")):
                raise E2EError(f"{pod['metadata']['name']}: not the chart's securityContext {sc}")
            if spec.get("hostNetwork"):
                raise E2EError("operator Pods must be ordinary Pods, not hostNetwork")
            ip = pod["status"]["podIP"]
            if ipaddress.ip_address(ip) not in self.env.pod_network:
                raise E2EError(f"Pod IP {ip} is not in the Pod network {self.env.pod_network}")
            ips.add(ip)
        if len(ips) != 2:
            raise E2EError(f"the two replicas share an address: {ips}")
        return pods

    # --- leader ----------------------------------------------------------------------------

    def lease(self) -> dict[str, Any]:
        return dict(self.get("lease", LEASE))

    def leader_pod(self) -> dict[str, Any] | NotYet:
        """The operator Pod whose identity holds the Lease (identity = <hostname>-<pid>-...)."""
        holder = str(self.lease()["spec"].get("holderIdentity") or "")
        for pod in self.operator_pods():
            if holder.startswith(pod["metadata"]["name"] + "-"):
                return pod
        return NotYet(f"holder {holder!r} is no running operator Pod")

    # --- 4. status API ----------------------------------------------------------------------

    def check_status_api(self) -> None:
        t0 = time.monotonic()
        leader = wait_for("a leader Pod", self.leader_pod, timeout=60)
        holder = self.lease()["spec"]["holderIdentity"]
        wait_for(
            "the leader's signed status URL on the Lease",
            lambda: (
                "nodewarden.io/status-url" in (self.lease()["metadata"].get("annotations") or {})
            ),
            timeout=30,
        )
        auth = {"Authorization": f"Bearer {self.token}"}
        answers = {}
        for pod in self.operator_pods():
            ip = pod["status"]["podIP"]
            name = pod["metadata"]["name"]
            ok = http_get(f"http://{ip}:8080/api/v1/status", auth)
            if ok.status != 200 or ok.headers.get("X-Nodewarden-Served-By") != holder:
                raise E2EError(f"status API on {name}: {ok.status} {ok.body[:300]!r}")
            answers[name] = sorted(ok.json())
            for bad in ({}, {"Authorization": "Bearer wrong"}):
                refused = http_get(f"http://{ip}:8080/api/v1/status", bad)
                if refused.status != 401:
                    raise E2EError(f"{name} answered {refused.status} without the right token")
            if http_get(f"http://{ip}:8081/metrics").status != 200:
                raise E2EError(f"{name}: no /metrics on the metrics port")
            if http_get(f"http://{ip}:8081/api/v1/status", auth).status != 404:
                raise E2EError(f"{name}: the status API must not be served on the metrics port")
            if http_get(f"http://{ip}:8080/metrics").status != 404:
                raise E2EError(f"{name}: metrics must not be served on the status API port")
        service = self.get("service", f"{RELEASE}-nodewarden-metrics")["spec"]["clusterIP"]
        through_service = [
            http_get(f"http://{service}:8080/api/v1/status", auth).status for _ in range(10)
        ]
        if set(through_service) != {200}:
            raise E2EError(f"status API through the Service: {through_service}")
        self.timed("status_api_checks", t0)
        self.report["status_api"] = {
            "leader": leader["metadata"]["name"],
            "answered_by_every_pod": sorted(answers),
            "through_service": through_service,
        }
        log(f"status API: leader {leader['metadata']['name']}; both Pods and the Service answer")

    # --- 5. batch and leader crash ---------------------------------------------------------

    def batch(self, prefix: str, count: int, max_seconds: int) -> list[dict[str, Any]]:
        docs = [d for d in yaml.safe_load_all((DEMO / "containers.yaml").read_text()) if d]
        out = []
        for i, doc in enumerate(docs[:count]):
            cd = copy.deepcopy(doc)
            cd["metadata"] = {"name": f"{prefix}-{i:02d}"}
            cd["spec"]["uuid"] = f"zzzzz-dz642-{prefix}{i:0{15 - len(prefix)}d}"
            runtime = cd["spec"].setdefault("runtime", {})
            runtime["durationHintSeconds"] = min(
                max_seconds, runtime.get("durationHintSeconds", 10)
            )
            out.append(cd)
        return out

    def submit(self, containers: list[dict[str, Any]]) -> None:
        text = "\n---\n".join(json.dumps(c) for c in containers)
        self.kubectl("-n", NAMESPACE, "apply", "-f", "-", input=text)

    def phases(self, names: set[str]) -> dict[str, str]:
        items = self.get("cd")["items"]
        return {
            c["metadata"]["name"]: (c.get("status") or {}).get("phase", "")
            for c in items
            if c["metadata"]["name"] in names
        }

    def kill_leader(self) -> float:
        """SIGKILL the leader's container (a crash: no lease release); seconds to handover."""
        leader = wait_for("a leader Pod", self.leader_pod, timeout=60)
        old = self.lease()["spec"]["holderIdentity"]
        container_id = leader["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
        killed = time.monotonic()
        self.env.kill_container(container_id)
        log(f"killed the leader {leader['metadata']['name']} (SIGKILL)")

        def new_holder() -> str | None:
            spec = self.lease()["spec"]
            holder = spec.get("holderIdentity")
            return holder if holder and holder != old else None

        holder = wait_for("another replica to take the Lease", new_holder, 3 * LEASE_DURATION, 0.5)
        seconds = time.monotonic() - killed
        limit = LEASE_DURATION + RETRY_INTERVAL + 3  # lease time + one retry + API latency
        if seconds > limit:
            raise E2EError(f"handover took {seconds:.1f}s, more than {limit}s")
        log(f"handover to {holder} in {seconds:.1f}s (lease {LEASE_DURATION}s)")
        return seconds

    def run_batch(
        self, prefix: str, count: int, max_seconds: int, during: Callable[[], None]
    ) -> None:
        """Submit a batch, call `during` once a container runs, assert all complete once."""
        t0 = time.monotonic()
        containers = self.batch(prefix, count, max_seconds)
        names = {c["metadata"]["name"] for c in containers}
        self.submit(containers)
        wait_for(
            "a container of the batch to run",
            lambda: "Running" in self.phases(names).values(),
            timeout=180,
        )
        during()

        def all_done() -> dict[str, str] | NotYet:
            phases = self.phases(names)
            pending = {n: p for n, p in phases.items() if p != "Complete"}
            if any(p in ("Failed", "Cancelled") for p in pending.values()):
                raise E2EError(f"containers did not complete: {pending}")
            return phases if not pending and len(phases) == len(names) else NotYet(str(pending))

        wait_for(f"{len(names)} containers to complete", all_done, timeout=420, interval=2)
        runs = self.env.cloud_admin(lambda admin: admin.runs())
        wanted = {c["spec"]["uuid"] for c in containers}
        starts: dict[str, int] = {}
        for run in runs:
            if run["uuid"] in wanted:
                starts[run["uuid"]] = starts.get(run["uuid"], 0) + 1
        if starts != {u: 1 for u in wanted}:
            raise E2EError(f"each container must start exactly once on the cloud: {starts}")
        self.timed(f"batch_{prefix}", t0)
        self.report.setdefault("batches", {})[prefix] = {
            "containers": len(names),
            "started_once_each": True,
        }
        log(f"batch {prefix}: {len(names)} containers complete, each started exactly once")

    # --- 6. monitoring ---------------------------------------------------------------------

    def start_prometheus(self) -> None:
        self.prometheus = Prometheus(self.state / "prometheus", self.env.kubeconfig)
        self.prometheus.configure_from(self.kubectl, NAMESPACE)
        self.prometheus.start()
        wait_for(
            "prometheus to scrape both operator Pods through the Service",
            lambda: self.prometheus is not None and len(self.prometheus.up_targets()) == 2,
            timeout=90,
        )
        log("prometheus scrapes both operator Pods (ServiceMonitor -> metrics Service)")

    def check_dashboards(self) -> None:
        assert self.prometheus is not None
        t0 = time.monotonic()
        manifest = self.get("configmap", f"{RELEASE}-nodewarden-dashboard")
        queries = dashboard_queries(manifest)
        prometheus = self.prometheus

        def empty() -> list[str] | None:
            missing = [q for q in queries if not prometheus.query(q)]
            return missing or None

        def all_answer() -> bool | NotYet:
            missing = empty()
            return True if missing is None else NotYet(f"no data yet: {missing}")

        wait_for("every dashboard query to return data", all_answer, timeout=240, interval=5)
        rules = prometheus.rule_health()
        bad = {name: health for name, health in rules.items() if health != "ok"}
        if not rules or bad:
            raise E2EError(f"alert rules not loaded or failing: {rules}")
        self.timed("dashboards_answer", t0)
        self.report["monitoring"] = {
            "dashboard_queries": len(queries),
            "all_return_data": True,
            "alert_rules": sorted(rules),
            "targets": prometheus.up_targets(),
        }
        log(f"all {len(queries)} dashboard queries return data; {len(rules)} rules healthy")

    # --- 7. upgrade ------------------------------------------------------------------------

    def next_chart(self) -> Path:
        """A copy of the chart with a new version and a changed CRD (a new optional field)."""
        target = self.state / "chart-next"
        shutil.copytree(CHART, target)
        meta = yaml.safe_load((target / "Chart.yaml").read_text())
        meta["version"] = meta["version"] + "-next"
        (target / "Chart.yaml").write_text(yaml.safe_dump(meta))
        crd_path = target / "crds" / "nodewarden.io_containerdispatches.yaml"
        crd = yaml.safe_load(crd_path.read_text())
        spec_schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        spec_schema["properties"]["e2eUpgradeMarker"] = {
            "type": "string",
            "description": "Added by the e2e upgrade test: proves the CRD change was applied.",
        }
        crd_path.write_text(yaml.safe_dump(crd, sort_keys=False))
        return target

    def upgrade(self) -> None:
        t0 = time.monotonic()
        chart = self.next_chart()
        # The documented path (chart README, "Upgrading"): CRDs first, then helm upgrade.
        crds = self.helm("show", "crds", str(chart))
        self.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=crds)
        crd = json.loads(
            self.kubectl("get", "crd", "containerdispatches.nodewarden.io", "-o", "json")
        )
        props = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        if "e2eUpgradeMarker" not in props["properties"]:
            raise E2EError("the upgraded CRD was not applied")
        values = self.state / "values-next.yaml"
        values.write_text(yaml.safe_dump(self.values(self.env.next_image_ref)))
        old_pods = {p["metadata"]["name"] for p in self.operator_pods()}

        def roll() -> None:
            self.helm("upgrade", RELEASE, str(chart), "-n", NAMESPACE, "-f", str(values),
                      "--wait", "--timeout=5m")  # fmt: skip
            pods = self.check_pods(self.env.next_image_ref)
            if old_pods & {p["metadata"]["name"] for p in pods}:
                raise E2EError("the rolling update kept an old Pod")
            log("helm upgrade: rolled to the new image tag")

        self.run_batch("upg", 6, 25, during=roll)
        marked = self.batch("mark", 1, 5)[0]
        marked["spec"]["e2eUpgradeMarker"] = "kept"
        self.submit([marked])
        kept = self.get("cd", marked["metadata"]["name"])["spec"].get("e2eUpgradeMarker")
        if kept != "kept":
            raise E2EError("a field of the upgraded CRD was pruned: the CRD was not upgraded")
        self.timed("upgrade", t0)
        self.report["upgrade"] = {"crd_field_applied": True, "image": self.env.next_image_ref}

    # --- 8. side-node power cycle ---------------------------------------------------------

    def intents(self, node: str, action: str) -> list[dict[str, Any]]:
        items = [
            i
            for i in self.get("pi")["items"]
            if i["spec"]["nodeName"] == node and i["spec"]["action"] == action
        ]
        return sorted(items, key=lambda i: str(i["metadata"]["creationTimestamp"]))

    def node_status(self, node: str) -> dict[str, Any]:
        return dict(self.get("wn", node).get("status") or {})

    def bmc_resets(self) -> list[dict[str, Any]]:
        """What the side node's fake BMC received (its own log: what was really sent)."""
        log_ = self.env.side_admin(lambda admin: admin.bmc_log(sidenodes.NODE))
        return list(log_["resets"])

    def bmc_wall_time(self, monotonic: float) -> datetime:
        """A time of the side-node process's monotonic clock (its BMC log) as wall time,
        through a node event that carries both."""
        events = self.env.side_admin(lambda admin: admin.events(sidenodes.NODE))
        ref = events[-1]
        return sidenodes.parse_time(ref["at"]) + timedelta(
            seconds=monotonic - float(ref["monotonic"])
        )

    def side_node_power_cycle(self) -> None:
        """Step 9 (module docstring): the side node's WorkerNode, Secrets and policy go in;
        it is drained and switched off; a GPU container that fits only it wakes it (the
        leader is killed while it is WAKING) and runs there exactly once."""
        t0 = time.monotonic()
        node = sidenodes.NODE
        objects = sidenodes.objects(self.side_state, self.bmc_password)
        self.kubectl("-n", NAMESPACE, "apply", "-f", "-",
                     input="\n---\n".join(json.dumps(o) for o in objects))  # fmt: skip

        def succeeded(action: str) -> dict[str, Any] | NotYet:
            found = self.intents(node, action)
            phases = [(i.get("status") or {}).get("phase") for i in found]
            done = [i for i in found if (i.get("status") or {}).get("phase") == "Succeeded"]
            return done[-1] if done else NotYet(f"{action} intents {phases}")

        shutdown = wait_for(f"{node} idle -> Shutdown Succeeded", lambda: succeeded("Shutdown"),
                            timeout=180)  # fmt: skip

        def off() -> dict[str, Any] | NotYet:
            status = self.node_status(node)
            return status if status.get("state") == "Off" else NotYet(str(status.get("state")))

        status = wait_for(f"{node} Off", off, timeout=30)
        if status.get("admission") != "Closed" or status.get("observedPower") != "Off":
            raise E2EError(f"{node} is Off with admission {status.get('admission')}, observed "
                           f"power {status.get('observedPower')}")  # fmt: skip
        resets = self.bmc_resets()
        bmc = self.side_state["nodes"][node]["power"]["endpoint"]
        problems, summary = sidenodes.check_shutdown(shutdown, resets, bmc, self.bmc_wall_time)
        if problems:
            raise E2EError(f"shutdown {summary['intent']}: {'; '.join(problems)}")
        report: dict[str, Any] = {"shutdown": summary}
        self.timed("side_node_off", t0)
        log(f"side node {node}: drained and switched off (one GracefulShutdown at its BMC)")

        t1 = time.monotonic()
        uuid = "zzzzz-dz642-sidegpu00000001"
        self.submit([sidenodes.gpu_container("side-gpu", uuid, 3)])

        def waking() -> bool | NotYet:
            sent = [r["reset_type"] for r in self.bmc_resets()]
            state = self.node_status(node).get("state")
            return ("On" in sent and state == "Waking") or NotYet(f"{state}, BMC got {sent}")

        wait_for(f"{node} WAKING with On sent to its BMC", waking, timeout=120, interval=0.3)
        report["leader_killed_while"] = "Waking"
        report["handover_seconds"] = round(self.kill_leader(), 1)
        took_over_at = sidenodes.parse_time(self.lease()["spec"]["acquireTime"])
        if self.node_status(node).get("state") not in ("Waking", "Idle", "Active"):
            raise E2EError(f"{node}: unexpected state after the handover {self.node_status(node)}")

        def complete() -> dict[str, Any] | NotYet:
            container = self.get("cd", "side-gpu")
            phase = (container.get("status") or {}).get("phase")
            if phase in ("Failed", "Cancelled"):
                raise E2EError(f"the GPU container ended {phase}: {container['status']}")
            return container if phase == "Complete" else NotYet(str(phase))

        container = wait_for("the GPU container Complete", complete, timeout=180, interval=1)
        if container["status"].get("node") != node:
            raise E2EError(f"the GPU container ran on {container['status'].get('node')}")
        runs = self.env.side_admin(lambda admin: admin.runs(node))
        on_side = [r for r in runs if r["uuid"] == uuid]
        on_cloud = [r for r in self.env.cloud_admin(lambda a: a.runs()) if r["uuid"] == uuid]
        if len(on_side) != 1 or on_cloud:
            raise E2EError(f"the GPU container started {len(on_side)} times on {node} and "
                           f"{len(on_cloud)} times on the cloud (want 1 and 0)")  # fmt: skip
        wakes = self.intents(node, "Wake")
        if len(wakes) != 1:
            raise E2EError(f"{len(wakes)} Wake intents for {node}, want 1")
        problems, report["wake"] = sidenodes.check_wake(wakes[0], container, took_over_at)
        if problems:
            raise E2EError(f"wake {report['wake']['intent']}: {'; '.join(problems)}")
        sent = [r["reset_type"] for r in self.bmc_resets()]
        # after its container the node is idle again and may already be switched off anew
        if sent[:2] != ["GracefulShutdown", "On"] or sent.count("On") != 1:
            raise E2EError(f"{node}'s BMC received {sent}: want one On for the one wake")
        report["bmc_resets"] = sent
        report["energy"] = self.check_energy(node, wakes[0])
        self.timed("side_node_wake_and_run", t1)
        self.timed("side_node_power_cycle", t0)
        self.report["side_node_power_cycle"] = report
        log(f"side node {node}: woken by the GPU container (one On at its BMC, the leader "
            "killed while WAKING), ready, ran it exactly once")  # fmt: skip

    def check_energy(self, node: str, wake: dict[str, Any]) -> dict[str, Any]:
        """The side node's energy figures after its power cycle (docs/energy.md)."""

        def counted() -> dict[str, Any] | NotYet:
            energy = self.node_status(node).get("energy") or {}
            done = energy.get("shutdowns", 0) >= 1 and energy.get("offSeconds", 0) > 0
            return energy if done else NotYet(str(energy)[:300])

        energy = wait_for(f"{node}'s energy figures", counted, timeout=120, interval=2)
        problems = []
        if energy.get("method") != "Cumulative" or "EnergykWh" not in str(energy.get("source")):
            problems.append(f"method {energy.get('method')} from {energy.get('source')}")
        if not energy.get("usedKwh"):
            problems.append("no energy used")
        measured = ((wake.get("status") or {}).get("requestRecord") or {}).get("energy") or {}
        if measured.get("kind") != "Measured" or not measured.get("offSeconds"):
            problems.append(f"the Wake's record carries no measured saving: {measured}")
        if problems:
            raise E2EError(f"{node} energy: {'; '.join(problems)}")
        return {k: energy.get(k) for k in ("method", "usedKwh", "offSeconds", "savedKwh")}

    # --- the whole run ---------------------------------------------------------------------

    def run(self) -> None:
        self.start_cluster()
        self.start_cloud()
        self.start_side_nodes()
        self.install()
        self.start_prometheus()
        self.check_status_api()
        count, longest = (4, 20) if self.trimmed else (12, 45)
        self.report["handover_seconds"] = None

        def crash_leader() -> None:
            self.report["handover_seconds"] = round(self.kill_leader(), 1)

        self.run_batch("batch", count, longest, during=crash_leader)
        self.check_status_api()
        if not self.trimmed:
            self.upgrade()
        # Counters live in a process: a short batch under the replicas running now, so
        # the per-second panels have samples from a live target. The refused calls of
        # start_cloud were counted by the leader killed above (its series goes stale
        # once the rate window passes, on a slow machine before the check): a few more
        # refused calls now, counted by the leader in place, for the cloud error panel.
        self.env.cloud_admin(lambda admin: admin.force_rate_limit(3, retry_after=1))
        self.run_batch("final", 2, 8, during=lambda: None)
        # the dashboards after the power cycle: the energy panels need the side node's
        # readings (its fake BMC reports power) and its time off
        self.side_node_power_cycle()
        self.check_dashboards()

    def diagnostics(self) -> str:
        if not self.started:
            return ""
        out = self.kubectl("get", "pods,deploy,lease,cd,wn", "-A", "-o", "wide", check=False)
        logs = self.kubectl("-n", NAMESPACE, "logs", "-l", f"app.kubernetes.io/instance={RELEASE}",
                            "--tail=40", "--prefix", check=False)  # fmt: skip
        return out + "\n" + logs

    def stop(self) -> None:
        if self.prometheus is not None:
            self.prometheus.stop()
        self.env.stop()
        for path in self.cleanup_paths:
            shutil.rmtree(path, ignore_errors=True)


def run_scenario(
    state_dir: Path, env: Environment, trimmed: bool, report_path: Path, prepare_seconds: float
) -> int:
    """Run the scenario on `env`; write the report; 0 if every assertion held."""
    scenario = Scenario(state_dir, env, trimmed)
    scenario.report = {"trimmed": trimmed, "prepare_seconds": prepare_seconds}
    t0 = time.monotonic()
    code = 0
    try:
        scenario.run()
        scenario.report["passed"] = True
    except (E2EError, Exception) as exc:
        code = 1
        scenario.report["passed"] = False
        scenario.report["error"] = f"{type(exc).__name__}: {exc}"
        log(f"FAILED: {exc}")
        try:
            print(scenario.diagnostics(), file=sys.stderr)
        except Exception as diag_exc:
            log(f"(no diagnostics: {diag_exc})")
    finally:
        scenario.report.setdefault("seconds", {})["scenario_total"] = round(
            time.monotonic() - t0, 1
        )
        scenario.stop()
        report_path.write_text(json.dumps(scenario.report, indent=2))
    return code
