"""The credential resolver against an in-memory Secret source: what it reads, refuses, caches."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import SecretStr

from nodewarden.api.workernode import WorkerNodeSpec
from nodewarden.credentials import LABEL, CredentialResolver, Refusal
from nodewarden.credentials.resolver import BmcCredentials, SshCredentials, WolCredentials
from nodewarden.credentials.settings import CredentialsConfig
from nodewarden.kube.client import SecretRecord
from nodewarden.logs import redact
from nodewarden.ssh.credentials import SshClientKey

KEY = SshClientKey.generate()
HOST_KEY = SshClientKey.generate().public_key


class Secrets:
    """An in-memory Secret source that counts reads."""

    def __init__(self) -> None:
        self.records: dict[str, SecretRecord] = {}
        self.reads: list[str] = []

    def put(self, name: str, use: str | None, **values: str) -> None:
        labels = {LABEL: use} if use else {}
        self.records[name] = SecretRecord(
            name, labels, {k: SecretStr(v) for k, v in values.items()}
        )

    async def read_secret_record(self, namespace: str, name: str) -> SecretRecord | None:
        self.reads.append(name)
        return self.records.get(name)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def spec(**over: Any) -> WorkerNodeSpec:
    body: dict[str, Any] = {
        "nodeType": "SideNode",
        "controlMethod": "Redfish",
        "capacity": {"vcpus": 4, "ram": "8Gi"},
        "bmc": {
            "endpoint": "https://127.0.0.1:8443",
            "usernameSecretRef": {"name": "bmc", "key": "username"},
            "passwordSecretRef": {"name": "bmc", "key": "password"},
        },
        "ssh": {
            "address": "127.0.0.1",
            "port": 2222,
            "knownHostsSecretRef": {"name": "hosts", "key": "knownHosts"},
        },
    }
    body.update(over)
    return WorkerNodeSpec.model_validate(body)


def resolver(secrets: Secrets, clock: Clock | None = None, **cfg: Any) -> CredentialResolver:
    config = CredentialsConfig(
        bmc_endpoints=cfg.get("bmc", ["127.0.0.1:8443"]),
        ssh_endpoints=cfg.get("ssh", ["127.0.0.1:2222"]),
        wake_on_lan_targets=cfg.get("wol", ["127.0.0.1:9999"]),
        secret_ttl="30s",
    )
    return CredentialResolver(
        secrets,
        "ns",
        config,
        reserved=frozenset({"operator-ssh", "status-token"}),
        operator_key=KEY,
        clock=clock or Clock(),
    )


@pytest.fixture
def secrets() -> Secrets:
    s = Secrets()
    s.put("bmc", "bmc", username="admin", password="bmc-password-1")
    s.put("hosts", "ssh", knownHosts=f"[127.0.0.1]:2222 {HOST_KEY}")
    return s


async def test_designated_and_admitted_gives_the_credentials(secrets: Secrets) -> None:
    r = resolver(secrets)
    bmc = await r.bmc("n", spec())
    assert isinstance(bmc, BmcCredentials)
    assert bmc.username == "admin" and bmc.password.get_secret_value() == "bmc-password-1"
    assert "bmc-password-1" not in repr(bmc)
    ssh = await r.ssh("n", spec())
    assert isinstance(ssh, SshCredentials)
    assert ssh.client_key is KEY and (ssh.host, ssh.port) == ("127.0.0.1", 2222)
    assert not ssh.target("n").trust.trusted_for("127.0.0.1", 2222).empty  # type: ignore[union-attr]
    assert await r.check("n", spec()) == []


async def test_secret_values_are_masked_public_ones_are_not(secrets: Secrets) -> None:
    secrets.put("bmc", "bmc", username="bmc-operator-7", password="bmc-password-2")
    secrets.put(
        "hosts", "ssh", knownHosts=f"[127.0.0.1]:2222 {HOST_KEY}", token="unused-token-value-9"
    )
    assert isinstance(await resolver(secrets).bmc("n", spec()), BmcCredentials)
    assert isinstance(await resolver(secrets).ssh("n", spec()), SshCredentials)
    # the user name is of the secret class too; a key no field reads is masked as well
    line = "login bmc-operator-7 / bmc-password-2 / unused-token-value-9"
    assert redact(line) == "login *** / *** / ***"
    assert redact(f"host key {HOST_KEY}") == f"host key {HOST_KEY}"


async def test_an_unlabelled_secret_is_refused_and_its_value_never_returned(
    secrets: Secrets,
) -> None:
    secrets.put("bmc", None, username="admin", password="bmc-password-1")
    refused = await resolver(secrets).bmc("n", spec())
    assert isinstance(refused, Refusal)
    assert refused.reason == "CredentialsNotDesignated"
    assert refused.field == "spec.bmc.usernameSecretRef"


async def test_a_reserved_secret_is_never_read_even_when_labelled(secrets: Secrets) -> None:
    secrets.put("status-token", "bmc", username="x", password="status-token-value")
    node = spec(
        bmc={
            "endpoint": "https://127.0.0.1:8443",
            "usernameSecretRef": {"name": "status-token", "key": "username"},
            "passwordSecretRef": {"name": "status-token", "key": "password"},
        }
    )
    refused = await resolver(secrets).bmc("n", node)
    assert isinstance(refused, Refusal) and refused.reason == "CredentialsNotDesignated"
    assert "status-token" not in secrets.reads


async def test_a_non_admitted_endpoint_is_refused_before_any_secret_is_read(
    secrets: Secrets,
) -> None:
    node = spec(
        bmc={
            "endpoint": "https://127.0.0.1:9443",
            "usernameSecretRef": {"name": "bmc", "key": "username"},
            "passwordSecretRef": {"name": "bmc", "key": "password"},
        }
    )
    refused = await resolver(secrets).bmc("n", node)
    assert isinstance(refused, Refusal) and refused.reason == "EndpointNotAdmitted"
    assert "127.0.0.1:9443" in refused.message and "bmc_endpoints" in refused.message
    assert secrets.reads == []


async def test_ssh_needs_an_admitted_address_and_known_hosts(secrets: Secrets) -> None:
    r = resolver(secrets)
    for ssh, field in (
        ({"address": "127.0.0.1", "port": 2223}, "spec.ssh.address"),
        ({"port": 2222}, "spec.ssh.address"),
        ({"address": "127.0.0.1", "port": 2222}, "spec.ssh.knownHostsSecretRef"),
    ):
        refused = await r.ssh("n", spec(ssh=ssh))
        assert isinstance(refused, Refusal) and refused.field == field, (ssh, refused)
    secrets.put("hosts", "ssh", knownHosts=f"[127.0.0.1]:2299 {HOST_KEY}")
    r.forget()
    refused = await r.ssh("n", spec())
    assert isinstance(refused, Refusal) and refused.reason == "CredentialsInvalid"


async def test_wake_on_lan_target_and_secure_on(secrets: Secrets) -> None:
    secrets.put("wol", "wol", secureOn="01:02:03:04:05:06")
    node = spec(
        controlMethod="WakeOnLan",
        bmc=None,
        wakeOnLan={
            "mac": "52:54:00:12:34:56",
            "broadcastAddress": "127.0.0.1",
            "port": 9999,
            "secureOnSecretRef": {"name": "wol", "key": "secureOn"},
        },
    )
    got = await resolver(secrets).wol("n", node)
    assert isinstance(got, WolCredentials)
    assert got.secure_on is not None and got.secure_on.get_secret_value() == bytes(range(1, 7))
    refused = await resolver(secrets, wol=["127.0.0.1:9"]).wol("n", node)
    assert isinstance(refused, Refusal) and refused.reason == "EndpointNotAdmitted"


async def test_secrets_are_cached_for_the_ttl(secrets: Secrets) -> None:
    clock = Clock()
    r = resolver(secrets, clock)
    for _ in range(5):
        assert isinstance(await r.bmc("n", spec()), BmcCredentials)
    assert secrets.reads == ["bmc"]
    secrets.put("bmc", None, username="admin", password="bmc-password-1")  # designation removed
    clock.now = 29.0
    assert isinstance(await r.bmc("n", spec()), BmcCredentials)
    clock.now = 31.0
    assert isinstance(await r.bmc("n", spec()), Refusal)
    assert secrets.reads == ["bmc", "bmc"]


async def test_a_ca_bundle_that_is_not_pem_is_refused_not_raised(secrets: Secrets) -> None:
    """Before: the Redfish client's constructor raised from inside the power poll."""
    secrets.put("bmc-ca", "bmc", caBundle="not a certificate at all, just words")
    node = spec(
        bmc={
            "endpoint": "https://127.0.0.1:8443",
            "usernameSecretRef": {"name": "bmc", "key": "username"},
            "passwordSecretRef": {"name": "bmc", "key": "password"},
            "caBundleSecretRef": {"name": "bmc-ca", "key": "caBundle"},
        }
    )
    refused = await resolver(secrets).bmc("n", node)
    assert isinstance(refused, Refusal) and refused.reason == "CredentialsInvalid"
    assert refused.field == "spec.bmc.caBundleSecretRef"
    assert "just words" not in refused.message and "'bmc-ca'" in refused.message
