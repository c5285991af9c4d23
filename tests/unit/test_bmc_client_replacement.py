"""One Redfish client per node, even when a poll and a discovery ask at once.

Before: both found no client (or the client of the old credentials) and each made one;
the one overwritten was never closed and its session stayed on the BMC.
"""

from __future__ import annotations

import asyncio
import ssl
from datetime import UTC, datetime

import trustme
from pydantic import SecretStr

from nodewarden.api.workernode import WorkerNodeSpec
from nodewarden.credentials import LABEL, CredentialResolver
from nodewarden.credentials.settings import CredentialsConfig
from nodewarden.kube.client import SecretRecord
from nodewarden.power.control import NodeRef, PowerControl
from nodewarden_doubles.fakebmc import FakeBmc, FakeBmcOptions


class Secrets:
    def __init__(self) -> None:
        self.records: dict[str, SecretRecord] = {}

    def put(self, name: str, **values: str) -> None:
        self.records[name] = SecretRecord(
            name, {LABEL: "bmc"}, {k: SecretStr(v) for k, v in values.items()}
        )

    async def read_secret_record(self, namespace: str, name: str) -> SecretRecord | None:
        return self.records.get(name)


async def test_concurrent_first_uses_and_a_credential_change_leave_no_session() -> None:
    ca = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    bmc = FakeBmc(
        FakeBmcOptions(username="bmc-user-77", password="bmc-password-1", initial_power="On"),
        ssl_context=context,
    )
    await bmc.start()
    secrets = Secrets()
    pem = ca.cert_pem.bytes().decode()
    secrets.put("bmc", username="bmc-user-77", password="bmc-password-1", caBundle=pem)
    resolver = CredentialResolver(
        secrets, "ns", CredentialsConfig(bmc_endpoints=[f"127.0.0.1:{bmc.port}"], secret_ttl="0s")
    )
    spec = WorkerNodeSpec.model_validate(
        {
            "nodeType": "SideNode",
            "controlMethod": "Redfish",
            "capacity": {"vcpus": 4, "ram": "8Gi"},
            "bmc": {
                "endpoint": bmc.url,
                "usernameSecretRef": {"name": "bmc", "key": "username"},
                "passwordSecretRef": {"name": "bmc", "key": "password"},
                "caBundleSecretRef": {"name": "bmc", "key": "caBundle"},
            },
        }
    )
    control = PowerControl(resolver, None, None, lambda: datetime.now(tz=UTC))
    node = NodeRef("n1", spec)
    try:
        await asyncio.gather(control.read_power(node), control.discover(node, ssh_works=False))
        assert bmc.logins == 1 and bmc.live_sessions == 1
        # the password changes (on the BMC and in the Secret): one new client, the old closed
        bmc.change_password("bmc-password-2")
        secrets.put("bmc", username="bmc-user-77", password="bmc-password-2", caBundle=pem)
        await asyncio.gather(*(control.read_power(node) for _ in range(3)))
        assert bmc.logins == 2 and bmc.live_sessions == 1
    finally:
        await control.close()
        await bmc.stop()
    assert bmc.live_sessions == 0
