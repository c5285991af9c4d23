"""Issue 9 acceptance: a user who may create WorkerNodes but not read Secrets cannot steal one.

On the real control plane, impersonating a ServiceAccount that may create WorkerNodes and
Secrets but not read Secrets:

- a WorkerNode naming an admin's (undesignated) Secret, and one naming a designated Secret
  but a BMC endpoint outside the allow-list, both get Valid=False with a clear message and
  a Warning Event;
- the Redfish client, the SSH prober and the Wake-on-LAN sender, driven through the
  credential resolver for those nodes, send nothing to the recording listeners (the
  project's fake BMC as an HTTPS listener whose CA is in a Secret the attacker made, a stub
  SSH worker, a UDP socket);
- once an administrator designates the Secret and admits the endpoints, the same calls
  reach the listeners with the right credentials;
- editing a valid node's endpoint to a non-admitted host is refused at admission once the
  node is enrolled, and the resolver refuses such a spec;
- no secret value appears in the operator's DEBUG log, the statuses or the Events.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trustme
import yaml

from clusterkit import ClusterHandle, OperatorProcess, start_operator, wait_for_async
from nodewarden.api.workernode import WorkerNodeSpec
from nodewarden.credentials import LABEL, CredentialResolver, Refusal
from nodewarden.credentials.resolver import BmcCredentials, SshCredentials, WolCredentials
from nodewarden.credentials.settings import CredentialsConfig
from nodewarden.kube.client import Kube, api_client_from
from nodewarden.redfish import RedfishClient
from nodewarden.ssh import LoopbackOnlyResolver, SshClientKey, SshProber
from nodewarden.wol import WakeOnLanSender
from nodewarden_doubles.fakebmc import FakeBmc, FakeBmcOptions
from nodewarden_doubles.ports import unused_loopback_port
from nodewarden_doubles.stubworker import StubWorker, StubWorkerConfig

pytestmark = pytest.mark.cluster

BMC_USER = "fleet-admin"
BMC_PASSWORD = "bmc-password-of-the-fleet-7f3a9c"
OPERATOR_KEY = SshClientKey.generate()
MAC = "52:54:00:aa:bb:cc"
SECURE_ON = "0a:0b:0c:0d:0e:0f"


class Udp(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.packets: list[bytes] = []

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.packets.append(data)


def kubectl_as(cluster: ClusterHandle, ns: str, user: str, *args: str, **kw: Any) -> Any:
    return cluster.kubectl("-n", ns, f"--as=system:serviceaccount:{ns}:{user}", *args, **kw)


def apply(cluster: ClusterHandle, ns: str, obj: dict[str, Any], as_user: str | None = None) -> None:
    doc = json.dumps(obj)
    if as_user is None:
        cluster.kubectl("-n", ns, "apply", "-f", "-", input=doc)
    else:
        kubectl_as(cluster, ns, as_user, "create", "-f", "-", input=doc)


def valid(cluster: ClusterHandle, ns: str, name: str) -> dict[str, Any] | None:
    body = cluster.get_json(ns, "wn", name)
    for cond in (body.get("status") or {}).get("conditions", []):
        if cond["type"] == "Valid":
            return cond  # type: ignore[no-any-return]
    return None


def condition(cluster: ClusterHandle, ns: str, name: str, kind: str) -> dict[str, Any]:
    status = cluster.get_json(ns, "wn", name).get("status") or {}
    return next((c for c in status.get("conditions") or [] if c["type"] == kind), {})


def side_node(name: str, bmc_url: str, secret: str, ssh_port: int, udp_port: int) -> dict[str, Any]:
    return {
        "apiVersion": "nodewarden.io/v1alpha1",
        "kind": "WorkerNode",
        "metadata": {"name": name},
        "spec": {
            "nodeType": "SideNode",
            "controlMethod": "Redfish",
            "capacity": {"vcpus": 4, "ram": "8Gi"},
            "bmc": {
                "endpoint": bmc_url,
                "usernameSecretRef": {"name": secret, "key": "username"},
                "passwordSecretRef": {"name": secret, "key": "password"},
                "caBundleSecretRef": {"name": "my-ca", "key": "caBundle"},
            },
            "wakeOnLan": {
                "mac": MAC,
                "broadcastAddress": "127.0.0.1",
                "port": udp_port,
                "secureOnSecretRef": {"name": secret, "key": "secureOn"},
            },
            "ssh": {
                "address": "127.0.0.1",
                "port": ssh_port,
                "user": "nodewarden",
                "knownHostsSecretRef": {"name": "my-ca", "key": "knownHosts"},
            },
        },
    }


@pytest.fixture
async def listeners() -> AsyncIterator[dict[str, Any]]:
    ca = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    options = FakeBmcOptions(username=BMC_USER, password=BMC_PASSWORD, initial_power="On")
    bmc = FakeBmc(options, ssl_context=context)
    other = FakeBmc(FakeBmcOptions(password=BMC_PASSWORD), ssl_context=context)
    worker = StubWorker(StubWorkerConfig(authorized_keys=(OPERATOR_KEY.public_key,)))
    await bmc.start()
    await other.start()
    ssh_port = await worker.start()
    udp = Udp()
    loop = asyncio.get_running_loop()
    udp_port = unused_loopback_port()
    transport, _ = await loop.create_datagram_endpoint(lambda: udp, ("127.0.0.1", udp_port))
    try:
        yield {
            "ca": ca.cert_pem.bytes().decode(),
            "bmc": bmc,
            "other": other,
            "worker": worker,
            "ssh_port": ssh_port,
            "udp": udp,
            "udp_port": udp_port,
        }
    finally:
        transport.close()
        await worker.stop()
        await bmc.stop()
        await other.stop()


def operator_config(path: Path, ns: str, bmc: list[str], ssh: list[str], wol: list[str]) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "namespace": ns,
                "log_level": "DEBUG",
                "dispatch": {
                    "enabled": False,
                    "ssh_private_key_secret": {"name": "operator-ssh", "key": "id"},
                },
                "credentials": {
                    "bmc_endpoints": bmc,
                    "ssh_endpoints": ssh,
                    "wake_on_lan_targets": wol,
                    "secret_ttl": "1s",
                },
                "power": {
                    "power_poll_interval": 1,
                    "power_poll_interval_at_rest": 1,
                    "evaluate_interval": 1,
                },
            }
        )
    )
    return path


async def drive(
    resolver: CredentialResolver, name: str, spec: WorkerNodeSpec, env: dict[str, Any]
) -> dict[str, Any]:
    """Use every adapter for node `name` exactly as the operator does: through the resolver."""
    out: dict[str, Any] = {}
    bmc = await resolver.bmc(name, spec)
    out["bmc"] = bmc
    if isinstance(bmc, BmcCredentials):
        async with RedfishClient(bmc.redfish_config(request_timeout=10.0)) as client:
            out["power"] = (await client.read_power_state()).state.value
    ssh = await resolver.ssh(name, spec)
    out["ssh"] = ssh
    if isinstance(ssh, SshCredentials):
        prober = SshProber(resolver=LoopbackOnlyResolver())
        try:
            out["ready"] = (await prober.probe(ssh.target(name))).ready.ready
        finally:
            await prober.aclose()
    wol = await resolver.wol(name, spec)
    out["wol"] = wol
    if isinstance(wol, WolCredentials):
        await WakeOnLanSender().send(
            wol.mac, destination=wol.destination, port=wol.port, secure_on=wol.secure_on
        )
    return out


async def test_a_worker_node_author_cannot_make_nodewarden_send_a_secret(
    cluster: ClusterHandle, namespace: str, tmp_path: Path, listeners: dict[str, Any]
) -> None:
    ns = namespace
    bmc: FakeBmc = listeners["bmc"]
    other: FakeBmc = listeners["other"]
    worker: StubWorker = listeners["worker"]
    udp: Udp = listeners["udp"]
    # -- the administrator's Secret (not designated) and the attacker's identity ---------
    cluster.kubectl(
        "-n", ns, "create", "secret", "generic", "fleet-bmc",
        f"--from-literal=username={BMC_USER}",
        f"--from-literal=password={BMC_PASSWORD}",
        f"--from-literal=secureOn={SECURE_ON}",
    )  # fmt: skip
    cluster.kubectl(
        "-n", ns, "create", "secret", "generic", "operator-ssh",
        f"--from-literal=id={OPERATOR_KEY.export_private().get_secret_value()}",
    )  # fmt: skip
    cluster.kubectl("-n", ns, "create", "serviceaccount", "attacker")
    cluster.kubectl(
        "-n", ns, "create", "role", "wn-author",
        "--verb=get,list,watch,create,update,patch", "--resource=workernodes.nodewarden.io",
    )  # fmt: skip
    cluster.kubectl(
        "-n", ns, "create", "role", "secret-creator", "--verb=create", "--resource=secrets"
    )
    for role in ("wn-author", "secret-creator"):
        cluster.kubectl(
            "-n", ns, "create", "rolebinding", f"attacker-{role}", f"--role={role}",
            f"--serviceaccount={ns}:attacker",
        )  # fmt: skip
    denied = kubectl_as(cluster, ns, "attacker", "get", "secret", "fleet-bmc", check=False)
    assert denied.returncode != 0 and "forbidden" in denied.stderr.lower()
    # the attacker's Secret: the CA of their listener and a host key of their SSH server
    known_hosts = worker.known_hosts_line()
    apply(
        cluster,
        ns,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "my-ca"},
            "stringData": {"caBundle": listeners["ca"], "knownHosts": known_hosts},
        },
        as_user="attacker",
    )
    steal_secret = side_node(
        "steal-secret", bmc.url, "fleet-bmc", listeners["ssh_port"], listeners["udp_port"]
    )
    steal_endpoint = side_node(
        "steal-endpoint", other.url, "fleet-bmc", listeners["ssh_port"], listeners["udp_port"]
    )
    apply(cluster, ns, steal_secret, as_user="attacker")
    apply(cluster, ns, steal_endpoint, as_user="attacker")

    # -- the operator admits the first BMC, the SSH worker and the UDP target -------------
    admitted_config = CredentialsConfig(
        bmc_endpoints=[f"127.0.0.1:{bmc.port}"],
        ssh_endpoints=[f"127.0.0.1:{listeners['ssh_port']}"],
        wake_on_lan_targets=[f"127.0.0.1:{listeners['udp_port']}"],
    )
    config = operator_config(
        tmp_path / "op.yaml",
        ns,
        admitted_config.bmc_endpoints,
        admitted_config.ssh_endpoints,
        admitted_config.wake_on_lan_targets,
    )
    op = start_operator(cluster, ns, tmp_path, f"--config={config}", name="op-creds")
    try:
        cond = await wait_for_async(
            lambda: (c := valid(cluster, ns, "steal-secret")) and c["status"] == "False" and c,
            timeout=30,
            what="steal-secret Valid=False",
        )
        assert cond["reason"] == "CredentialsNotDesignated"
        assert "spec.bmc.passwordSecretRef: Secret 'fleet-bmc'" in cond["message"]
        assert f"{LABEL}=bmc" in cond["message"]
        cond = await wait_for_async(
            lambda: (c := valid(cluster, ns, "steal-endpoint")) and c["status"] == "False" and c,
            timeout=30,
            what="steal-endpoint Valid=False",
        )
        assert f"spec.bmc.endpoint: 127.0.0.1:{other.port} is not an admitted" in cond["message"]
        events = cluster.get_json(ns, "events")["items"]
        warned = {e["involvedObject"]["name"] for e in events if e["type"] == "Warning"}
        assert {"steal-secret", "steal-endpoint"} <= warned
        # the power controller looked at both nodes and was refused their credentials
        for name in ("steal-secret", "steal-endpoint"):
            await wait_for_async(
                lambda name=name: (
                    condition(cluster, ns, name, "PowerSource").get("reason")
                    == "CredentialsRefused"
                ),
                timeout=30,
                what=f"{name} PowerSource=CredentialsRefused",
            )
        assert bmc.requests == [] and other.requests == []  # the operator sent nothing

        # -- the adapters, driven through the resolver, send nothing ------------------------
        api = await api_client_from(cluster.kubeconfig)
        kube = Kube(api)
        try:
            resolver = CredentialResolver(kube, ns, admitted_config, operator_key=OPERATOR_KEY)
            for name, body in (("steal-secret", steal_secret), ("steal-endpoint", steal_endpoint)):
                spec = WorkerNodeSpec.model_validate(body["spec"])
                got = await drive(resolver, name, spec, listeners)
                assert all(isinstance(got[k], Refusal) for k in ("bmc", "ssh", "wol")), got
            assert bmc.requests == [] and other.requests == []
            assert worker.connections_accepted == 0 and worker.auth_attempts == 0
            assert udp.packets == []

            # -- an administrator designates the Secrets ------------------------------------
            cluster.kubectl("-n", ns, "label", "secret", "fleet-bmc", f"{LABEL}=bmc")
            cluster.kubectl("-n", ns, "label", "secret", "my-ca", f"{LABEL}=ssh")
            # one Secret serves one use: the CA moves to a bmc Secret of its own
            cluster.kubectl(
                "-n", ns, "create", "secret", "generic", "fleet-ca",
                f"--from-literal=caBundle={listeners['ca']}",
            )  # fmt: skip
            cluster.kubectl("-n", ns, "label", "secret", "fleet-ca", f"{LABEL}=bmc")
            cluster.kubectl(
                "-n", ns, "create", "secret", "generic", "fleet-wol",
                f"--from-literal=secureOn={SECURE_ON}",
            )  # fmt: skip
            cluster.kubectl("-n", ns, "label", "secret", "fleet-wol", f"{LABEL}=wol")
            fixed = json.loads(json.dumps(steal_secret))
            fixed["spec"]["bmc"]["caBundleSecretRef"] = {"name": "fleet-ca", "key": "caBundle"}
            fixed["spec"]["wakeOnLan"]["secureOnSecretRef"] = {
                "name": "fleet-wol",
                "key": "secureOn",
            }
            apply(cluster, ns, fixed)
            resolver.forget()  # the designation is read again (the operator: after secretTtl)
            spec = WorkerNodeSpec.model_validate(fixed["spec"])
            got = await drive(resolver, "steal-secret", spec, listeners)
            assert got["power"] == "On" and got["ready"] is True, got
            assert bmc.requests and all(r.status < 400 for r in bmc.requests)
            assert bmc.failed_logins == 0  # the right credentials
            assert worker.auth_attempts >= 1 and worker.connections_accepted >= 1
            for _ in range(500):  # the datagram is delivered on a later loop turn
                if udp.packets:
                    break
                await asyncio.sleep(0.01)
            assert len(udp.packets) == 1 and udp.packets[0].endswith(bytes.fromhex("0a0b0c0d0e0f"))
            await wait_for_async(
                lambda: (c := valid(cluster, ns, "steal-secret")) and c["status"] == "True",
                timeout=30,
                what=f"steal-secret valid once designated ({valid(cluster, ns, 'steal-secret')})",
            )
            # ... and the operator itself now reads the BMC with the right credentials
            await wait_for_async(
                lambda: (
                    condition(cluster, ns, "steal-secret", "PowerSource").get("status") == "True"
                ),
                timeout=60,
                what="the operator's power controller reaches the designated BMC",
            )
            node_status = cluster.get_json(ns, "wn", "steal-secret")["status"]
            assert (
                f"127.0.0.1:{bmc.port}" in node_status.get("powerControl", {}).get("source", "")
                or node_status.get("observedPower") == "On"
            ), node_status
            assert bmc.failed_logins == 0

            # -- editing the valid node's endpoint to a non-admitted host ---------------------
            # refused at admission once the node is enrolled (one machine, one BMC) ...
            await wait_for_async(
                lambda: cluster.get_json(ns, "wn", "steal-secret")["status"].get("enrolment"),
                timeout=30,
                what="steal-secret enrolled",
            )
            seen = len(other.requests)
            fixed["spec"]["bmc"]["endpoint"] = other.url
            edit = cluster.kubectl(
                "-n", ns, "apply", "-f", "-", input=json.dumps(fixed), check=False
            )  # fmt: skip
            assert edit.returncode != 0 and "one machine, one BMC" in edit.stderr
            # ... and the resolver, asked with such a spec, refuses it and sends nothing
            spec = WorkerNodeSpec.model_validate(fixed["spec"])
            refused = await resolver.bmc("steal-secret", spec)
            assert isinstance(refused, Refusal) and refused.reason == "EndpointNotAdmitted"
            assert len(other.requests) == seen
        finally:
            await kube.close()
    finally:
        op.stop()
    assert_no_secret_anywhere(cluster, ns, op)


def assert_no_secret_anywhere(cluster: ClusterHandle, ns: str, op: OperatorProcess) -> None:
    secrets = (BMC_PASSWORD, SECURE_ON, SECURE_ON.replace(":", ""))
    private = OPERATOR_KEY.export_private().get_secret_value()
    texts = {
        "log": op.logs(),
        "nodes": json.dumps(cluster.get_json(ns, "wn")),
        "events": json.dumps(cluster.get_json(ns, "events")),
    }
    for where, text in texts.items():
        for secret in secrets:
            assert secret not in text, f"{where} leaks a secret"
        for line in private.splitlines():
            if len(line) >= 16:
                assert line not in text, f"{where} leaks the SSH key"
