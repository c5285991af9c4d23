"""Issue 20 acceptance on the real control plane, as a user who may write nodewarden objects
but not read Secrets.

`test_every_key_of_every_secret_through_every_field` -- one scenario, all combinations at
once, one sweep at the end. Designated `bmc`, `ssh` and `wol` Secrets hold the keys of their
roles plus a `token` and a `passphrase` no field reads (some values shorter than 8
characters, too short to be redacted). The attacker creates one WorkerNode per credential
field and Secret key, naming that key through that field (every other field right), each
BMC-field combination with a fake BMC of its own, so that a value used in the wrong role
would reach a login and its error message. The operator runs at DEBUG with its dispatcher
probing the nodes over SSH. One node is right in every field: its BMC's password is then
rotated on the BMC (its session ends, its re-login is refused) -- at most one failed login
reaches the BMC until the credentials Secret changes, and no session is left on any BMC.
The sweep: no value of a secret-class key and no line of a private key appears in any
WorkerNode or PowerIntent status, Event, log line or metric; a public value (knownHosts,
caBundle) appears in no status or Event of a node that named it through a secret-class
field.

`test_requesters_are_who_the_api_server_says` -- the chart's admission policy on the real
API server: a forged requestedBy, a forged source Policy and an override without the RBAC
grant are refused; a member of the group bound to powerintents/override may override.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trustme
import yaml

from admissionkit import intent, requester_policy
from clusterkit import ClusterHandle, OperatorProcess, start_operator, wait_for_async
from localcluster import OPERATOR_USER
from nodewarden.credentials import LABEL
from nodewarden.credentials.designation import CREDENTIAL_FIELDS, PUBLIC_ROLES
from nodewarden.ssh import SshClientKey
from nodewarden_doubles.fakebmc import FakeBmc, FakeBmcOptions
from nodewarden_doubles.ports import unused_loopback_port
from nodewarden_doubles.stubworker import StubWorker, StubWorkerConfig

pytestmark = pytest.mark.cluster

ATTACKER = "node-author"
OPERATOR_KEY = SshClientKey.generate()
NODE_KEY = SshClientKey.generate()
BMC_USER = "Qz7kPw"  # 6 characters: never redacted, kept out structurally
BMC_PASSWORD = "bmc-password-9d3e71c0"
ROTATED = "bmc-password-rotated-44ab"
Secrets = dict[str, tuple[str, dict[str, str]]]
SECRETS: Secrets = {
    "fleet-bmc": (
        "bmc",
        {
            "username": BMC_USER,
            "password": BMC_PASSWORD,
            "caBundle": "(the listeners' CA, set at run time)",
            "token": "tK9xq",
            "passphrase": "pP2vz",
        },
    ),
    "fleet-ssh": (
        "ssh",
        {
            "privateKey": NODE_KEY.export_private().get_secret_value(),
            "knownHosts": "(the stub worker's line, set at run time)",
            "token": "ssh-token-51e0a7d2",
            "passphrase": "Vb8nQ",
        },
    ),
    "fleet-wol": ("wol", {"secureOn": "0a:1b:2c:3d:4e:5f", "token": "wol-token-7c1e90aa"}),
}
"""caBundle and knownHosts (public class) are filled in once the listeners exist."""
SECRET_CLASS = {"username", "password", "privateKey", "secureOn", "token", "passphrase"}
RIGHT = {
    "spec.bmc.usernameSecretRef": ("fleet-bmc", "username"),
    "spec.bmc.passwordSecretRef": ("fleet-bmc", "password"),
    "spec.bmc.caBundleSecretRef": ("fleet-bmc", "caBundle"),
    "spec.ssh.privateKeySecretRef": ("fleet-ssh", "privateKey"),
    "spec.ssh.knownHostsSecretRef": ("fleet-ssh", "knownHosts"),
    "spec.wakeOnLan.secureOnSecretRef": ("fleet-wol", "secureOn"),
}


@dataclass
class Combo:
    name: str
    field: str
    secret: str
    key: str
    bmc: FakeBmc


@dataclass
class Peers:
    ca_pem: str
    context: ssl.SSLContext
    shared: FakeBmc
    rotating: FakeBmc
    own: dict[str, FakeBmc]
    worker: StubWorker
    ssh_port: int
    udp_port: int

    @property
    def bmcs(self) -> list[FakeBmc]:
        return [self.shared, self.rotating, *self.own.values()]


def combo_names() -> list[tuple[str, str, str, str, bool]]:
    """(node name, field, Secret, key, whether it gets a fake BMC of its own)."""
    out = []
    for field in CREDENTIAL_FIELDS:
        for secret, (_, values) in SECRETS.items():
            for key in values:
                name = f"x-{field.rsplit('.', 1)[-1][:-9].lower()}-{secret[6:]}-{key.lower()}"
                own = field.startswith("spec.bmc.") and secret == "fleet-bmc"
                out.append((name, field, secret, key, own))
    return out


def combos(peers: Peers) -> list[Combo]:
    return [
        Combo(name, field, secret, key, peers.own[name] if own else peers.shared)
        for name, field, secret, key, own in combo_names()
    ]


def worker_node(
    name: str, bmc: FakeBmc, peers: Peers, refs: dict[str, tuple[str, str]]
) -> dict[str, Any]:
    def ref(path: str) -> dict[str, str]:
        secret, key = refs[path]
        return {"name": secret, "key": key}

    return {
        "apiVersion": "nodewarden.io/v1alpha1",
        "kind": "WorkerNode",
        "metadata": {"name": name},
        "spec": {
            "nodeType": "SideNode",
            "controlMethod": "Redfish",
            "power": "On",
            "capacity": {"vcpus": 4, "ram": "8Gi"},
            "bmc": {
                "endpoint": bmc.url,
                "usernameSecretRef": ref("spec.bmc.usernameSecretRef"),
                "passwordSecretRef": ref("spec.bmc.passwordSecretRef"),
                "caBundleSecretRef": ref("spec.bmc.caBundleSecretRef"),
            },
            "wakeOnLan": {
                "mac": "52:54:00:aa:bb:cc",
                "broadcastAddress": "127.0.0.1",
                "port": peers.udp_port,
                "secureOnSecretRef": ref("spec.wakeOnLan.secureOnSecretRef"),
            },
            "ssh": {
                "address": "127.0.0.1",
                "port": peers.ssh_port,
                "user": "nodewarden",
                "privateKeySecretRef": ref("spec.ssh.privateKeySecretRef"),
                "knownHostsSecretRef": ref("spec.ssh.knownHostsSecretRef"),
            },
        },
    }


@pytest.fixture
async def peers() -> AsyncIterator[Peers]:
    ca = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    started: list[FakeBmc] = []

    async def bmc() -> FakeBmc:
        fake = FakeBmc(
            FakeBmcOptions(username=BMC_USER, password=BMC_PASSWORD, initial_power="On"),
            ssl_context=context,
        )
        await fake.start()
        started.append(fake)
        return fake

    shared, rotating = await bmc(), await bmc()
    keys = (OPERATOR_KEY.public_key, NODE_KEY.public_key)
    worker = StubWorker(StubWorkerConfig(authorized_keys=keys))
    ssh_port = await worker.start()
    placeholder = Peers("", context, shared, rotating, {}, worker, ssh_port, unused_loopback_port())
    for name, _, _, _, own in combo_names():
        if own:
            placeholder.own[name] = await bmc()
    placeholder.ca_pem = ca.cert_pem.bytes().decode()
    try:
        yield placeholder
    finally:
        await worker.stop()
        for fake in started:
            await fake.stop()


def operator_config(path: Path, ns: str, peers: Peers) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "namespace": ns,
                "log_level": "DEBUG",
                "dispatch": {
                    "ssh_private_key_secret": {"name": "operator-ssh", "key": "id"},
                    "ssh_user": "nodewarden",
                    "probe_interval": 3,
                },
                "credentials": {
                    "bmc_endpoints": [f"127.0.0.1:{b.port}" for b in peers.bmcs],
                    "ssh_endpoints": [f"127.0.0.1:{peers.ssh_port}"],
                    "wake_on_lan_targets": [f"127.0.0.1:{peers.udp_port}"],
                    "secret_ttl": "1s",
                },
                "power": {
                    "power_poll_interval": 1,
                    "power_poll_interval_at_rest": 1,
                    "evaluate_interval": 2,
                },
            }
        )
    )
    return path


def secret(name: str, purpose: str | None, values: dict[str, str]) -> str:
    meta: dict[str, Any] = {"name": name}
    if purpose:
        meta["labels"] = {LABEL: purpose}
    return json.dumps(
        {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "stringData": values}
    )


def status_of(cluster: ClusterHandle, ns: str, name: str) -> dict[str, Any]:
    return cluster.get_json(ns, "wn", name).get("status") or {}


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c["type"] == kind), {})


async def test_every_key_of_every_secret_through_every_field(
    cluster: ClusterHandle, namespace: str, tmp_path: Path, peers: Peers
) -> None:
    ns = namespace
    secrets: Secrets = {name: (use, dict(values)) for name, (use, values) in SECRETS.items()}
    secrets["fleet-bmc"][1]["caBundle"] = peers.ca_pem
    secrets["fleet-ssh"][1]["knownHosts"] = peers.worker.known_hosts_line()
    for name, (purpose, values) in secrets.items():
        cluster.kubectl("-n", ns, "apply", "-f", "-", input=secret(name, purpose, values))
    op_key = {"id": OPERATOR_KEY.export_private().get_secret_value()}
    cluster.kubectl("-n", ns, "apply", "-f", "-", input=secret("operator-ssh", None, op_key))
    cluster.kubectl("-n", ns, "create", "serviceaccount", ATTACKER)
    cluster.kubectl(
        "-n", ns, "create", "role", "wn-author",
        "--verb=get,list,watch,create,update,patch", "--resource=workernodes.nodewarden.io",
    )  # fmt: skip
    cluster.kubectl(
        "-n", ns, "create", "rolebinding", "wn-author", "--role=wn-author",
        f"--serviceaccount={ns}:{ATTACKER}",
    )  # fmt: skip
    attacker = f"--as=system:serviceaccount:{ns}:{ATTACKER}"
    assert (
        "forbidden"
        in cluster.kubectl("-n", ns, attacker, "get", "secret", "fleet-bmc", check=False).stderr
    )

    all_combos = combos(peers)
    nodes = []
    for combo in all_combos:
        refs = {**RIGHT, combo.field: (combo.secret, combo.key)}
        nodes.append(worker_node(combo.name, combo.bmc, peers, refs))
    nodes.append(worker_node("good", peers.rotating, peers, RIGHT))
    doc = json.dumps({"apiVersion": "v1", "kind": "List", "items": nodes})
    cluster.kubectl("-n", ns, attacker, "create", "-f", "-", input=doc)

    config = operator_config(tmp_path / "op.yaml", ns, peers)
    op = start_operator(cluster, ns, tmp_path, f"--config={config}", name="op-sweep")
    try:
        await sweep_run(cluster, ns, peers, all_combos, op, secrets)
        metrics = op.get("/metrics")[1]
    finally:
        # in a thread: the fake BMCs live on this loop and answer the operator's logouts
        await asyncio.to_thread(op.stop)
    assert all(b.live_sessions == 0 for b in peers.bmcs), [b.live_sessions for b in peers.bmcs]
    assert_nothing_leaked(cluster, ns, secrets, all_combos, op.logs(), metrics)


async def sweep_run(
    cluster: ClusterHandle,
    ns: str,
    peers: Peers,
    all_combos: list[Combo],
    op: OperatorProcess,
    secrets: Secrets,
) -> None:
    names = [c.name for c in all_combos] + ["good"]

    def unjudged() -> list[str]:
        items = {i["metadata"]["name"]: i for i in cluster.get_json(ns, "wn")["items"]}
        return [n for n in names if not condition(items.get(n, {}).get("status") or {}, "Valid")]

    left: list[str] = []

    def all_judged() -> bool:
        left[:] = unjudged()
        return not left

    try:
        await wait_for_async(all_judged, timeout=90, interval=1, what="every node validated")
    except AssertionError:
        raise AssertionError(f"not validated: {left}") from None
    # the node that is right everywhere logs in; the right-key combinations too
    await wait_for_async(
        lambda: condition(status_of(cluster, ns, "good"), "PowerSource").get("status") == "True",
        timeout=60,
        what="the good node's BMC answers",
    )
    await wait_for_async(
        lambda: peers.worker.auth_attempts > 0, timeout=60, what="SSH probes with the node key"
    )
    # -- no lockout: the password is rotated on the BMC, the Secret not yet -------------------
    rotating = peers.rotating
    rotating.change_password(ROTATED)
    await wait_for_async(
        lambda: (
            "logins to this BMC are stopped"
            in condition(status_of(cluster, ns, "good"), "PowerSource").get("message", "")
        ),
        timeout=60,
        what="the good node's PowerSource says logins stopped",
    )
    seen = len(rotating.requests)
    metric = 'nodewarden_bmc_errors_total{class="auth"}'

    def auth_errors() -> float:
        text = op.get("/metrics")[1]
        line = next((ln for ln in text.splitlines() if ln.startswith(metric)), f"{metric} 0")
        return float(line.rsplit(" ", 1)[1])

    before = auth_errors()
    await wait_for_async(
        lambda: auth_errors() >= before + 3, timeout=60, what="three more polls refused locally"
    )
    assert rotating.failed_auth == 1, rotating.failed_auth  # one refused login, not one per poll
    assert len(rotating.requests) == seen  # nothing at all reached the BMC meanwhile
    # the Secret changes: logins resume
    secrets["fleet-bmc"][1]["password"] = ROTATED
    cluster.kubectl(
        "-n", ns, "apply", "-f", "-", input=secret("fleet-bmc", "bmc", secrets["fleet-bmc"][1])
    )
    await wait_for_async(
        lambda: condition(status_of(cluster, ns, "good"), "PowerSource").get("status") == "True",
        timeout=60,
        what="the good node logs in again after the Secret changed",
    )
    assert rotating.failed_auth == 1


def assert_nothing_leaked(
    cluster: ClusterHandle,
    ns: str,
    secrets: Secrets,
    all_combos: list[Combo],
    log: str,
    metrics: str,
) -> None:
    values = {k: v for _, kv in secrets.values() for k, v in kv.items()}
    old_password = BMC_PASSWORD
    secret_values = [v for k, v in values.items() if k in SECRET_CLASS] + [old_password]
    pieces = set()
    for value in secret_values:
        pieces.add(value)
        pieces.update(ln.strip() for ln in value.splitlines() if len(ln.strip()) >= 16)
    nodes = cluster.get_json(ns, "wn")["items"]
    intents = cluster.get_json(ns, "pi")["items"]
    events = cluster.get_json(ns, "events")["items"]
    texts = {
        "WorkerNode statuses": json.dumps([n.get("status") for n in nodes]),
        "PowerIntent statuses": json.dumps([i.get("status") for i in intents]),
        "Events": json.dumps(events),
        "operator log": log,
        "metrics": metrics,
    }
    assert '"level": "DEBUG"' in log and len(events) > len(all_combos)  # the run said a lot
    for where, text in texts.items():
        for piece in pieces:
            assert piece not in text, f"{where} leaks a secret value ({len(piece)} chars)"
    # public values named through a secret-class field appear nowhere for that node
    by_name = {n["metadata"]["name"]: n for n in nodes}
    for combo in all_combos:
        role = CREDENTIAL_FIELDS[combo.field][1]
        if role in PUBLIC_ROLES or combo.key not in ("caBundle", "knownHosts"):
            continue
        public = secrets[combo.secret][1][combo.key]
        mine = json.dumps(by_name[combo.name].get("status")) + json.dumps(
            [e for e in events if e["involvedObject"]["name"] == combo.name]
        )
        for line in public.splitlines():
            if len(line.strip()) >= 16:
                assert line.strip() not in mine, (combo.name, combo.key)


def test_requesters_are_who_the_api_server_says(cluster: ClusterHandle, namespace: str) -> None:
    ns = namespace
    oncall = {"kind": "Group", "name": "oncall", "apiGroup": "rbac.authorization.k8s.io"}
    policy = requester_policy(cluster, ns, OPERATOR_USER, override_subjects=[oncall])
    try:
        cluster.kubectl(
            "-n", ns, "create", "role", "intents", "--verb=create,get",
            "--resource=powerintents.nodewarden.io",
        )  # fmt: skip
        for who in ("oncall", "users"):
            cluster.kubectl(
                "-n", ns, "create", "rolebinding", f"{who}-intents", "--role=intents",
                f"--group={who}",
            )  # fmt: skip

        def create(obj: dict[str, Any], user: str, group: str) -> Any:
            return cluster.kubectl(
                "-n", ns, f"--as={user}", f"--as-group={group}", "create", "-f", "-",
                input=json.dumps(obj), check=False,
            )  # fmt: skip

        override = {"inhibitors": True, "justification": "the lock holder agreed on the phone"}
        forged = create(intent("forged", "oncall-lead@example.org"), "mallory", "users")
        assert forged.returncode != 0
        assert 'write requestedBy: "mallory"' in forged.stderr
        policy_made = create(intent("policy", "mallory", source="Policy"), "mallory", "users")
        assert (
            policy_made.returncode != 0 and "source: Policy is written only" in policy_made.stderr
        )
        no_grant = create(intent("no-grant", "mallory", override=override), "mallory", "users")
        assert no_grant.returncode != 0 and "may not override a safety gate" in no_grant.stderr
        mine = create(intent("mine", "mallory"), "mallory", "users")
        assert mine.returncode == 0, mine.stderr
        granted = create(intent("granted", "alice", override=override), "alice", "oncall")
        assert granted.returncode == 0, granted.stderr
        stored = cluster.get_json(ns, "pi", "granted")["spec"]
        assert stored["requestedBy"] == "alice" and stored["override"]["inhibitors"] is True
    finally:
        policy.close()
