"""`nodewarden check` on the real control plane: a healthy installation, then each broken one.

Two namespaces share one stub cloud process and the peers of tests/check/conftest.py:

- *healthy*: designated Secrets, admitted endpoints, a side node whose BMC (fake BMC over
  TLS) and SSH server answer, the operator's ServiceAccount bound to a Role made of the
  permission table, a running operator (Lease, status API). Every line passes.
- *broken*: a wrong cloud secret, a node naming a Secret that does not exist, a node whose
  BMC is not admitted (a listener that must see no connection), a BMC whose CA is not
  the configured one, an SSH server with another host key, an invalid PowerPolicy, and
  the local clock faked 120 s ahead (NODEWARDEN_CHECK_CLOCK_OFFSET). Each gives its ✗
  line with the fix named.

A ServiceAccount bound to a Role lacking one verb gives the rbac ✗ naming that verb. The
checks run in-process (`run_checks`, and `check_main` for the command line and JSON).
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import trustme
import yaml
from checkpeers import Listener, Peers, SshServer

from admissionkit import requester_policy
from clusterkit import ClusterHandle, OperatorProcess, wait_for
from dispatchkit import CATALOGUE, DispatchEnv
from localcluster import OPERATOR_USER
from nodewarden.check.cli import check_main
from nodewarden.check.kubeapi import CLOCK_OFFSET_ENV
from nodewarden.check.result import Report, Status
from nodewarden.check.runner import CheckOptions, run_checks
from nodewarden.credentials import LABEL
from nodewarden.kube.permissions import REQUIRED_PERMISSIONS
from nodewarden_doubles.fakebmc import FakeBmc
from nodewarden_doubles.stubcloud.process import StubCloudProcess
from nodewarden_doubles.stubcloud.serverconfig import StubServerConfig, StubServerCredentials

pytestmark = pytest.mark.cluster

BMC_USER = "check-admin"
BMC_PASSWORD = "check-bmc-pw-" + uuid.uuid4().hex[:8]
DISPATCHER = "disp"
SHORT_VERB = ("nodewarden.io", "powerintents", "delete")
STATUS_TOKEN = "status-token-for-tests-0123456789"  # written by DispatchEnv


def _secret(name: str, data: dict[str, str], purpose: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if purpose:
        meta["labels"] = {LABEL: purpose}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "stringData": data}


def _side_node(
    name: str,
    bmc: FakeBmc | Listener,
    ssh: SshServer,
    *,
    bmc_secret: str,
    ssh_secret: str,
    user_key: str = "username",
) -> dict[str, Any]:
    return {
        "apiVersion": "nodewarden.io/v1alpha1",
        "kind": "WorkerNode",
        "metadata": {"name": name},
        "spec": {
            "nodeType": "SideNode",
            "controlMethod": "Redfish",
            "idleBehavior": "hold",
            "capacity": {"vcpus": 8, "ram": "32Gi"},
            "bmc": {
                "endpoint": bmc.url,
                "usernameSecretRef": {"name": bmc_secret, "key": user_key},
                "passwordSecretRef": {"name": bmc_secret, "key": "password"},
                "caBundleSecretRef": {"name": bmc_secret, "key": "caBundle"},
            },
            "ssh": {
                "address": "127.0.0.1",
                "port": ssh.port,
                "user": "nodewarden",
                "knownHostsSecretRef": {"name": ssh_secret, "key": "knownHosts"},
            },
        },
    }


def _role(name: str, drop: tuple[str, str, str] | None = None) -> list[dict[str, Any]]:
    """A Role made of the permission table (minus one verb), a ServiceAccount, a binding."""
    rules = []
    for perm in REQUIRED_PERMISSIONS:
        verbs = [v for v in perm.verbs if (perm.group, perm.resource, v) != drop]
        rule: dict[str, Any] = {
            "apiGroups": [perm.group],
            "resources": [perm.resource],
            "verbs": verbs,
        }
        if perm.resource_names:
            rule["resourceNames"] = [
                f"nodewarden-{DISPATCHER}" if n == "<lease>" else n for n in perm.resource_names
            ]
        rules.append(rule)
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": name},
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name}],
        },
    ]


def _apply(cluster: ClusterHandle, namespace: str, items: list[dict[str, Any]]) -> None:
    doc = json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
    cluster.kubectl("-n", namespace, "apply", "-f", "-", input=doc, timeout=120)


def _install(
    cluster: ClusterHandle,
    stub: StubCloudProcess,
    peers: Peers,
    tmp_path_factory: pytest.TempPathFactory,
    prefix: str,
) -> tuple[DispatchEnv, FakeBmc, SshServer]:
    """A namespace with the operator's Secrets, a default PowerPolicy and a config file
    (DispatchEnv) admitting one fake BMC and one SSH server, both started here."""
    namespace = f"{prefix}-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", namespace)
    bmc = peers.bmc(username=BMC_USER, password=BMC_PASSWORD, initial_power="On")
    ssh = peers.ssh_server()
    env = DispatchEnv.create(
        cluster, namespace, tmp_path_factory.mktemp(prefix), stub=stub, dispatcher_id=DISPATCHER
    )
    config = yaml.safe_load(env.config_path.read_text())
    config["credentials"] = {
        "bmc_endpoints": [f"127.0.0.1:{bmc.port}"],
        "ssh_endpoints": [f"127.0.0.1:{ssh.port}"],
    }
    # a healthy installation has the operator's hard caps (the chart's defaults)
    config["dispatch"]["limits"] = {
        "max_nodes": 50,
        "max_hourly_spend": 25,
        "max_per_instance_type": 20,
    }
    env.config_path.write_text(yaml.safe_dump(config))
    return env, bmc, ssh


def _bmc_secret(name: str, ca: trustme.CA, purpose: str | None = "bmc") -> dict[str, Any]:
    data = {
        "username": BMC_USER,
        "password": BMC_PASSWORD,
        "caBundle": ca.cert_pem.bytes().decode(),
    }
    return _secret(name, data, purpose)


def _check(namespace: str, cluster: ClusterHandle, config: Path, **options: Any) -> Report:
    return asyncio.run(
        run_checks(
            CheckOptions(
                kubeconfig=cluster.kubeconfig,
                namespace=namespace,
                config=config,
                timeout=10,
                **options,
            )
        )
    )


def _lines(report: Report, check: str, status: Status | None = None) -> list[str]:
    return [
        r.line()
        for r in report.results
        if check in r.check.split(", ") and (status is None or r.status is status)
    ]


def _recovered(operator: OperatorProcess) -> bool:
    request = urllib.request.Request(
        f"http://127.0.0.1:{operator.port}/api/v1/status",
        headers={"Authorization": f"Bearer {STATUS_TOKEN}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=2) as reply:
            return bool(json.loads(reply.read()).get("recovered"))
    except OSError:
        return False


@pytest.fixture(scope="module")
def stub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StubCloudProcess]:
    process = StubCloudProcess(
        StubServerConfig(
            name="stub-check",
            credentials=StubServerCredentials(key="AKIASTUBCHECK001", secret="stub-check-secret"),
            instance_types=list(CATALOGUE),
        ),
        workdir=tmp_path_factory.mktemp("stub"),
    )
    process.start()
    yield process
    process.stop()


@dataclass
class Installation:
    env: DispatchEnv
    report: Report
    operator: OperatorProcess | None = None


Install = Callable[[str], tuple[DispatchEnv, FakeBmc, SshServer]]


@pytest.fixture(scope="module")
def install(
    cluster: ClusterHandle,
    stub: StubCloudProcess,
    peers: Peers,
    tmp_path_factory: pytest.TempPathFactory,
) -> Install:
    return lambda prefix: _install(cluster, stub, peers, tmp_path_factory, prefix)


@pytest.fixture(scope="module")
def healthy(cluster: ClusterHandle, install: Install, bmc_ca: trustme.CA) -> Iterator[Installation]:
    env, bmc, ssh = install("chk-ok")
    namespace = env.namespace
    _apply(
        cluster,
        namespace,
        [
            _bmc_secret("bmc-creds", bmc_ca),
            _secret("node-ssh", {"knownHosts": ssh.known_hosts()}, "ssh"),
            _side_node("gpu-1", bmc, ssh, bmc_secret="bmc-creds", ssh_secret="node-ssh"),
            *_role("nw-operator"),
            *_role("nw-short", drop=SHORT_VERB),
        ],
    )
    operator = env.start_operator()
    admission = requester_policy(cluster, namespace, OPERATOR_USER)
    try:
        wait_for(lambda: operator.get("/readyz")[0] == 200, timeout=60, what="operator ready")
        wait_for(lambda: _recovered(operator), timeout=60, what="dispatcher recovered")
        report = _check(
            namespace,
            cluster,
            env.config_path,
            service_account="nw-operator",
            live=True,
            operator_url=f"http://127.0.0.1:{operator.port}",
        )
        yield Installation(env, report, operator)
    finally:
        admission.close()
        env.close(stop_stub=False)
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


@dataclass
class Broken(Installation):
    spy: Listener | None = None


@pytest.fixture(scope="module")
def broken(
    cluster: ClusterHandle, install: Install, peers: Peers, bmc_ca: trustme.CA
) -> Iterator[Broken]:
    env, bmc, ssh = install("chk-bad")
    namespace = env.namespace
    spy = peers.listener()  # listening, but not admitted: must see no connection at all
    stranger = peers.ssh_server()  # another host key
    stranger_hosts = f"[127.0.0.1]:{ssh.port} {stranger.public_key}\n"
    _apply(
        cluster,
        namespace,
        [
            _secret("nodewarden-cloud", {"key": "AKIASTUBCHECK001", "secret": "not-the-secret"}),
            _bmc_secret("bmc-creds", bmc_ca),
            _bmc_secret("bmc-other-ca", trustme.CA()),
            _secret("node-ssh", {"knownHosts": ssh.known_hosts()}, "ssh"),
            _secret("node-ssh-stranger", {"knownHosts": stranger_hosts}, "ssh"),
            _side_node("missing-secret", bmc, ssh, bmc_secret="absent", ssh_secret="node-ssh"),
            _side_node("unadmitted", spy, ssh, bmc_secret="bmc-creds", ssh_secret="node-ssh"),
            _side_node("unknown-ca", bmc, ssh, bmc_secret="bmc-other-ca", ssh_secret="node-ssh"),
            _side_node(
                "wrong-hostkey", bmc, ssh, bmc_secret="bmc-creds", ssh_secret="node-ssh-stranger"
            ),
            # a node of the release before fixed key names: its key is listed to rename
            _secret(
                "bmc-old-keys", {"user": "admin", "password": "x" * 12, "caBundle": "-"}, "bmc"
            ),
            _side_node(
                "old-keys",
                bmc,
                ssh,
                bmc_secret="bmc-old-keys",
                ssh_secret="node-ssh",
                user_key="user",
            ),
            {
                "apiVersion": "nodewarden.io/v1alpha1",
                "kind": "PowerPolicy",
                "metadata": {"name": "switch-off-at-once"},
                "spec": {"idleThreshold": "0s"},
            },
        ],
    )
    try:
        with mock.patch.dict(os.environ, {CLOCK_OFFSET_ENV: "120"}):
            report = _check(namespace, cluster, env.config_path)
        yield Broken(env, report, spy=spy)
    finally:
        env.close(stop_stub=False)
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


# --- the healthy installation ---------------------------------------------------------------

EVERY_CHECK = (
    "config",
    "kubeconfig",
    "api-server",
    "version",
    "clock",
    "crds",
    "rbac",
    "requesters",
    "cloud",
    "policies",
    "caps",
    "secrets",
    "bmc",
    "ssh",
    "lease",
    "live",
)


def test_a_healthy_installation_passes_every_check(healthy: Installation) -> None:
    report = healthy.report
    text = "\n".join(r.line() for r in report.results)
    assert report.exit_code == 0, text
    assert [r for r in report.results if r.status is not Status.PASS] == [], text
    for check in EVERY_CHECK:
        assert _lines(report, check, Status.PASS), f"no passing {check} line:\n{text}"
    assert any("service root with the configured CA" in line for line in _lines(report, "bmc")), (
        text
    )
    assert any("known host key" in line for line in _lines(report, "ssh")), text
    assert any("accepts the credentials" in line for line in _lines(report, "cloud")), text
    assert any("holds all" in line for line in _lines(report, "rbac")), text
    assert any("held by" in line for line in _lines(report, "lease")), text
    assert any("recovered" in line for line in _lines(report, "live")), text


def test_a_missing_verb_is_named_with_the_fix(
    cluster: ClusterHandle, healthy: Installation
) -> None:
    out, err = io.StringIO(), io.StringIO()
    level = logging.getLogger("nodewarden").level
    code = check_main(
        [
            f"--kubeconfig={cluster.kubeconfig}",
            f"--namespace={healthy.env.namespace}",
            f"--config={healthy.env.config_path}",
            "--as-serviceaccount=nw-short",
            "-o",
            "json",
        ],
        out,
        err,
    )
    assert logging.getLogger("nodewarden").level == level, "check_main leaked its log level"
    doc = json.loads(out.getvalue())
    rbac = [c for c in doc["checks"] if c["check"] == "rbac"]
    assert code == 1 and doc["exitCode"] == 1
    assert [c["status"] for c in rbac] == ["fail"], rbac
    assert "lacks 1 of" in rbac[0]["message"]
    assert "delete powerintents.nodewarden.io" in rbac[0]["message"]
    assert "Role" in rbac[0]["fix"]
    assert len(err.getvalue().splitlines()) == 1 and "rbac" in err.getvalue()


# --- the broken installation -------------------------------------------------------------------


def _failed(broken: Broken, check: str) -> list[str]:
    return _lines(broken.report, check, Status.FAIL)


def test_the_broken_installation_exits_1(broken: Broken) -> None:
    assert broken.report.exit_code == 1


def test_a_wrong_cloud_credential_fails_with_the_secret_named(broken: Broken) -> None:
    lines = _failed(broken, "cloud")
    assert len(lines) == 1, lines
    assert "rejected the credentials" in lines[0]
    assert "fix: put valid credentials into Secret nodewarden-cloud" in lines[0]
    assert "not-the-secret" not in "\n".join(r.line() for r in broken.report.results)


def test_a_missing_secret_fails_with_the_label_command(broken: Broken) -> None:
    lines = [line for line in _failed(broken, "secrets") if "missing-secret" in line]
    assert lines, _failed(broken, "secrets")
    assert any("spec.bmc.passwordSecretRef" in line for line in lines)
    assert any(f"label secret absent {LABEL}=bmc" in line for line in lines)


def test_a_key_this_release_does_not_read_is_listed_with_the_rename(broken: Broken) -> None:
    lines = [line for line in _failed(broken, "secrets") if "old-keys" in line]
    assert len(lines) == 1 and "spec.bmc.usernameSecretRef" in lines[0], lines
    assert "rename key 'user' of Secret 'bmc-old-keys' to 'username'" in lines[0]
    assert "nodewarden.io/credential-keys" in lines[0]


def test_without_the_requester_policy_check_says_overrides_are_refused(broken: Broken) -> None:
    (line,) = _lines(broken.report, "requesters", Status.WARN)
    assert "not in force" in line and "every override is refused" in line
    assert "requesters.admissionPolicy" in line


def test_an_unadmitted_bmc_fails_and_receives_nothing(broken: Broken) -> None:
    lines = [line for line in _failed(broken, "secrets") if "unadmitted" in line]
    assert len(lines) == 1 and "EndpointNotAdmitted" in lines[0], lines
    assert "fix: admit it in credentials.bmc_endpoints" in lines[0]
    assert broken.spy is not None and broken.spy.connections == 0
    assert not any("unadmitted" in line for line in _lines(broken.report, "bmc"))


def test_a_bmc_with_an_unknown_ca_fails_with_the_ca_secret_named(broken: Broken) -> None:
    lines = _failed(broken, "bmc")
    assert len(lines) == 1 and "WorkerNode unknown-ca" in lines[0], lines
    assert "not signed by the CA in spec.bmc.caBundleSecretRef" in lines[0]
    assert "fix: put the CA that signed the BMC's certificate" in lines[0]
    assert BMC_PASSWORD not in lines[0]


def test_an_ssh_endpoint_with_an_unknown_host_key_fails(broken: Broken) -> None:
    lines = _failed(broken, "ssh")
    assert len(lines) == 1 and "WorkerNode wrong-hostkey" in lines[0], lines
    assert "not in spec.ssh.knownHostsSecretRef" in lines[0]
    assert "ssh-keyscan" in lines[0]


def test_an_invalid_power_policy_fails(broken: Broken) -> None:
    lines = _failed(broken, "policies")
    assert len(lines) == 1 and "PowerPolicy switch-off-at-once" in lines[0], lines
    assert "spec.idleThreshold" in lines[0] and "fix:" in lines[0]


def test_a_skewed_clock_fails_with_the_fix(broken: Broken) -> None:
    lines = _failed(broken, "clock")
    assert len(lines) == 1, _lines(broken.report, "clock")
    assert "ahead of the API server" in lines[0] and "chrony" in lines[0]


def test_the_other_checks_still_pass_on_the_broken_installation(broken: Broken) -> None:
    """The faults are named by their own lines only: the rest of the run is unaffected."""
    for check in ("kubeconfig", "api-server", "version", "crds", "config"):
        assert _lines(broken.report, check, Status.PASS), check
    assert _lines(broken.report, "bmc", Status.PASS)  # the nodes with a good BMC setup


# --- the command line and a user without cluster-wide reads ----------------------------------------


def test_a_config_that_does_not_parse_fails_the_config_line(
    cluster: ClusterHandle, healthy: Installation, tmp_path: Path
) -> None:
    bad = tmp_path / "nw.yaml"
    bad.write_text("dispatcher_id: Not_A_Label\n")
    out, err = io.StringIO(), io.StringIO()
    code = check_main(
        [f"--kubeconfig={cluster.kubeconfig}", f"-n={healthy.env.namespace}", f"--config={bad}"],
        out,
        err,
    )
    assert code == 1
    failed = [line for line in out.getvalue().splitlines() if line.startswith("✗")]
    assert len(failed) == 1 and f"config file {bad}: dispatcher_id" in failed[0], out.getvalue()
    assert err.getvalue().count("\n") == 1 and str(bad) in err.getvalue()
    assert "not checked: the operator config does not parse" in out.getvalue()


def test_crds_are_found_without_a_cluster_wide_read(
    cluster: ClusterHandle, healthy: Installation, tmp_path: Path
) -> None:
    """A user who may read nothing cluster-wide: discovery still finds the CRDs; the schema
    comparison says it could not be made; the RBAC line lists what that user lacks."""
    namespace = healthy.env.namespace
    cluster.kubectl("-n", namespace, "create", "serviceaccount", "viewer")
    token = cluster.kubectl("-n", namespace, "create", "token", "viewer").stdout.strip()
    kubeconfig = yaml.safe_load(cluster.kubeconfig.read_text())
    kubeconfig["users"] = [{"name": "viewer", "user": {"token": token}}]
    kubeconfig["contexts"][0]["context"]["user"] = "viewer"
    path = tmp_path / "viewer.kubeconfig"
    path.write_text(yaml.safe_dump(kubeconfig))
    report = asyncio.run(run_checks(CheckOptions(kubeconfig=path, namespace=namespace)))
    crd_lines = [r for r in report.results if r.check == "crds"]
    assert [r.status for r in crd_lines] == [Status.WARN], crd_lines
    assert "served at nodewarden.io/v1alpha1" in crd_lines[0].message
    assert "could not be compared" in crd_lines[0].message and "403" in crd_lines[0].message
    [rbac_line] = [r for r in report.results if r.check == "rbac"]
    assert rbac_line.status is Status.FAIL and "the current user lacks" in rbac_line.message
