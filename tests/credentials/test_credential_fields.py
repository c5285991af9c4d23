"""Issue 20, item 1, the per-field cases in process: every key of every designated Secret
named through every credential field.

For each of the six credential fields and each key of a designated ``bmc``, ``ssh`` and
``wol`` Secret (the role keys plus a ``token`` and a ``passphrase`` no field reads), a
WorkerNode names that key through that field (the other fields are right). The resolver
validates and resolves it exactly as the operator does; where it hands out BMC
credentials, the Redfish client logs in to the project's fake BMC (once refused, once
accepted). Every refusal message and every log line (the operator's JSON format, with its
redaction) is collected. No value of a secret-class key appears in any of them, and a
public value (knownHosts, caBundle) appears nowhere it was named through a field of the
secret class. With values of fewer than 8 characters -- too short to be redacted -- the
same holds: messages never carry anything derived from a Secret's content.
"""

from __future__ import annotations

import io
import logging
import ssl
from collections.abc import Iterator
from typing import Any

import pytest
import trustme
from pydantic import SecretStr

from nodewarden.api.workernode import WorkerNodeSpec
from nodewarden.credentials import LABEL, CredentialResolver, Refusal
from nodewarden.credentials.designation import CREDENTIAL_FIELDS, PUBLIC_ROLES
from nodewarden.credentials.resolver import BmcCredentials
from nodewarden.credentials.settings import CredentialsConfig
from nodewarden.kube.client import SecretRecord
from nodewarden.logs import MIN_REDACTED, JsonFormatter, redact
from nodewarden.redfish import RedfishClient, RedfishError
from nodewarden.ssh.credentials import KnownHostKeys, SshClientKey
from nodewarden_doubles.fakebmc import FakeBmc, FakeBmcOptions

CLIENT_KEY = SshClientKey.generate().export_private().get_secret_value()
HOST_KEY = SshClientKey.generate().public_key
SECRET_CLASS = frozenset({"username", "password", "privateKey", "secureOn", "token", "passphrase"})


def values(short: bool, ca_pem: str, port: int) -> dict[str, tuple[str, dict[str, str]]]:
    """Secret name -> (use, key -> value). `short`: the free-text values are 5-6 chars."""
    free = (
        {"u": "Qz7kP", "p": "pW3x!9", "t1": "tK9$q", "f1": "pP2@z", "t2": "Jx4&w", "f2": "Vb8%n"}
        if short
        else {
            "u": "bmc-user-6a1f0c",
            "p": "bmc-password-d41f77",
            "t1": "bmc-token-9e2b55a0",
            "f1": "bmc-passphrase-71c3",
            "t2": "ssh-token-5d0e91aa",
            "f2": "ssh-passphrase-2b8e",
        }
    )
    return {
        "fleet-bmc": (
            "bmc",
            {
                "username": free["u"],
                "password": free["p"],
                "caBundle": ca_pem,
                "token": free["t1"],
                "passphrase": free["f1"],
            },
        ),
        "fleet-ssh": (
            "ssh",
            {
                "privateKey": CLIENT_KEY,
                "knownHosts": f"[127.0.0.1]:2222 {HOST_KEY}",
                "token": free["t2"],
                "passphrase": free["f2"],
            },
        ),
        "fleet-wol": ("wol", {"secureOn": "0a:1b:2c:3d:4e:5f", "token": "wol-token-3e7d1c90"}),
    }


class Secrets:
    def __init__(self, table: dict[str, tuple[str, dict[str, str]]]) -> None:
        self.records = {
            name: SecretRecord(name, {LABEL: use}, {k: SecretStr(v) for k, v in kv.items()})
            for name, (use, kv) in table.items()
        }

    async def read_secret_record(self, namespace: str, name: str) -> SecretRecord | None:
        return self.records.get(name)


CORRECT = {
    "spec.bmc.usernameSecretRef": ("fleet-bmc", "username"),
    "spec.bmc.passwordSecretRef": ("fleet-bmc", "password"),
    "spec.bmc.caBundleSecretRef": ("fleet-bmc", "caBundle"),
    "spec.ssh.privateKeySecretRef": ("fleet-ssh", "privateKey"),
    "spec.ssh.knownHostsSecretRef": ("fleet-ssh", "knownHosts"),
    "spec.wakeOnLan.secureOnSecretRef": ("fleet-wol", "secureOn"),
}
assert set(CORRECT) == set(CREDENTIAL_FIELDS)


def node(port: int, field: str, secret: str, key: str) -> WorkerNodeSpec:
    refs = dict(CORRECT)
    refs[field] = (secret, key)

    def ref(path: str) -> dict[str, str]:
        name, k = refs[path]
        return {"name": name, "key": k}

    return WorkerNodeSpec.model_validate(
        {
            "nodeType": "SideNode",
            "controlMethod": "Redfish",
            "capacity": {"vcpus": 4, "ram": "8Gi"},
            "bmc": {
                "endpoint": f"https://127.0.0.1:{port}",
                "usernameSecretRef": ref("spec.bmc.usernameSecretRef"),
                "passwordSecretRef": ref("spec.bmc.passwordSecretRef"),
                "caBundleSecretRef": ref("spec.bmc.caBundleSecretRef"),
            },
            "wakeOnLan": {
                "mac": "52:54:00:12:34:56",
                "broadcastAddress": "127.0.0.1",
                "port": 9999,
                "secureOnSecretRef": ref("spec.wakeOnLan.secureOnSecretRef"),
            },
            "ssh": {
                "address": "127.0.0.1",
                "port": 2222,
                "privateKeySecretRef": ref("spec.ssh.privateKeySecretRef"),
                "knownHostsSecretRef": ref("spec.ssh.knownHostsSecretRef"),
            },
        }
    )


@pytest.fixture
def operator_log() -> Iterator[io.StringIO]:
    """The operator's own log format (JSON, redacted), every logger at DEBUG."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    old = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield stream
    finally:
        root.removeHandler(handler)
        root.setLevel(old)


@pytest.mark.parametrize("short", [False, True], ids=["long-values", "short-values"])
async def test_every_key_through_every_field_leaves_no_value_anywhere(
    short: bool, operator_log: io.StringIO
) -> None:
    ca = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    ca_pem = ca.cert_pem.bytes().decode()
    refused_bmc = FakeBmc(
        FakeBmcOptions(username="someone-else", password="x" * 12), ssl_context=context
    )
    await refused_bmc.start()
    table = values(short, ca_pem, refused_bmc.port)
    accepting = FakeBmc(
        FakeBmcOptions(
            username=table["fleet-bmc"][1]["username"], password=table["fleet-bmc"][1]["password"]
        ),
        ssl_context=context,
    )
    await accepting.start()
    config = CredentialsConfig(
        bmc_endpoints=[f"127.0.0.1:{refused_bmc.port}", f"127.0.0.1:{accepting.port}"],
        ssh_endpoints=["127.0.0.1:2222"],
        wake_on_lan_targets=["127.0.0.1:9999"],
    )
    resolver = CredentialResolver(Secrets(table), "ns", config)
    texts: list[tuple[str, str, str, str]] = []  # (field, secret, key, text)
    handed_out = 0
    try:
        for field in CREDENTIAL_FIELDS:
            for secret, (_, kv) in table.items():
                for key in kv:
                    for bmc in (refused_bmc, accepting):
                        spec = node(bmc.port, field, secret, key)
                        name = f"n-{field.rsplit('.', 1)[-1]}-{secret}-{key}".lower()
                        found: list[Any] = list(await resolver.check(name, spec))
                        found += [await resolver.bmc(name, spec), await resolver.ssh(name, spec)]
                        found.append(await resolver.wol(name, spec))
                        for item in found:
                            if isinstance(item, Refusal):
                                texts.append((field, secret, key, item.message))
                            elif isinstance(item, BmcCredentials):
                                handed_out += 1
                                texts.append((field, secret, key, repr(item)))
                                texts.append((field, secret, key, await read(item)))
    finally:
        await refused_bmc.stop()
        await accepting.stop()
    log_text = operator_log.getvalue()
    assert handed_out >= 2 and log_text  # the right keys did resolve, and the log was captured
    secret_values = {k: v for _, kv in table.values() for k, v in kv.items() if k in SECRET_CLASS}
    for field, secret, key, text in texts:
        for role_key, value in secret_values.items():
            for piece in [value, *(ln for ln in value.splitlines() if len(ln) >= 16)]:
                assert piece not in text, (field, secret, key, role_key, text)
        role = CREDENTIAL_FIELDS[field][1]
        if role not in PUBLIC_ROLES:
            for public in ("caBundle", "knownHosts"):
                value = table["fleet-bmc" if public == "caBundle" else "fleet-ssh"][1][public]
                for line in value.splitlines():
                    if len(line.strip()) >= 16:
                        assert line.strip() not in text, (field, secret, key, public)
    for role_key, value in secret_values.items():
        for piece in [value, *(ln for ln in value.splitlines() if len(ln) >= 16)]:
            assert piece not in log_text, (role_key, "operator log")
    if short:
        # the structural rule, not redaction, kept them out: too short to be registered
        for role_key in ("username", "password", "token", "passphrase"):
            value = table["fleet-bmc"][1][role_key]
            assert len(value) < MIN_REDACTED and redact(value) == value


async def read(creds: BmcCredentials) -> str:
    """Log in and read the power state; the text of what happened."""
    try:
        async with RedfishClient(creds.redfish_config(request_timeout=10.0)) as client:
            return str(await client.read_power_state())
    except RedfishError as exc:
        return f"{exc!r} {exc}"


@pytest.mark.parametrize(
    "text", ["hunter2-passphrase-line", "[127.0.0.1]:22 ssh-ed25519 not-a-key-tok3n-value"]
)
def test_known_hosts_errors_never_quote_the_text(text: str) -> None:
    """asyncssh's own message quotes the line it could not parse (issue 20)."""
    with pytest.raises(ValueError) as caught:
        KnownHostKeys(text)
    for piece in (text, *text.split()):
        if len(piece) >= 5:
            assert piece not in str(caught.value)
