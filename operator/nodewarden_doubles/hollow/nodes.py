"""What a test or benchmark needs to point the operator's power code at hollow side nodes:
the WorkerNode spec of one (its BMC the hollow endpoint, `systemId` its name) and the
Secret reader that answers its BMC login (a fake password: the hollow BMC checks none)."""

from __future__ import annotations

from pydantic import SecretStr

from nodewarden.api.workernode import WorkerNodeSpec
from nodewarden.credentials import LABEL
from nodewarden.kube.client import SecretRecord
from nodewarden_doubles.hollow.bmc import HOLLOW_BMC_ENDPOINT

BMC_SECRET = "bmc"
"""The Secret every hollow side node's BMC login names."""


def side_node_spec(name: str) -> WorkerNodeSpec:
    """A Redfish side node whose BMC is the hollow one (system `name`)."""
    return WorkerNodeSpec.model_validate(
        {
            "nodeType": "SideNode",
            "controlMethod": "Redfish",
            "capacity": {"vcpus": 4, "ram": "8Gi"},
            "bmc": {
                "endpoint": HOLLOW_BMC_ENDPOINT,
                "systemId": name,
                "usernameSecretRef": {"name": BMC_SECRET, "key": "username"},
                "passwordSecretRef": {"name": BMC_SECRET, "key": "password"},
            },
        }
    )


class HollowBmcSecrets:
    """A `CredentialResolver`'s Secret reader: every Secret is the hollow BMC login."""

    async def read_secret_record(self, namespace: str, name: str) -> SecretRecord | None:
        values = {"username": "hollow", "password": "not-a-real-password"}
        return SecretRecord(name, {LABEL: BMC_SECRET}, {k: SecretStr(v) for k, v in values.items()})
