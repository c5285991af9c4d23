"""Power requests through `PowerControl` to the project's fake BMC: fenced, and signed.

A BMC cannot check a fencing token: the request is sent only while this replica's
leadership is valid, checked once the Redfish client is ready; every request names the
dispatcher and the replica in its User-Agent (what the BMC's audit log shows).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pydantic import SecretStr
from redfish_peers import StartFakeBmc

from fencekit import Clock, held
from nodewarden.api.workernode import WorkerNodeSpec
from nodewarden.compose import power_user_agent
from nodewarden.credentials import BmcCredentials
from nodewarden.policy.events import RequestAccepted, RequestErrored
from nodewarden.power.control import NodeRef, PowerControl

T0 = datetime(2026, 12, 1, tzinfo=UTC)


class OneBmc:
    """The credential resolver's answer for the one node (the resolver has its own tests)."""

    def __init__(self, creds: BmcCredentials) -> None:
        self.creds = creds

    async def bmc(self, node: str, spec: Any) -> BmcCredentials:
        return self.creds


def spec(endpoint: str) -> WorkerNodeSpec:
    return WorkerNodeSpec.model_validate(
        {
            "nodeType": "SideNode",
            "controlMethod": "Redfish",
            "capacity": {"vcpus": 4, "ram": "8Gi"},
            "bmc": {
                "endpoint": endpoint,
                "usernameSecretRef": {"name": "bmc", "key": "username"},
                "passwordSecretRef": {"name": "bmc", "key": "password"},
            },
        }
    )


async def test_a_power_request_is_sent_only_while_leading_and_names_its_replica(
    fake_bmc: StartFakeBmc,
) -> None:
    peer = await fake_bmc(initial_power="On")
    creds = BmcCredentials(
        endpoint=peer.bmc.url,
        username=peer.bmc.options.username,
        password=SecretStr(peer.bmc.options.password),
        ca_bundle_pem=peer.ca_pem,
    )
    lead = held(7, Clock())
    agent = power_user_agent("alpha", "pod-a-1234-abcdef")
    control = PowerControl(
        OneBmc(creds),  # type: ignore[arg-type]
        prober=None,
        nodes=None,
        clock=lambda: T0,
        fence=lead,
        user_agent=agent,
    )
    node = NodeRef("side-1", spec(peer.bmc.url))
    try:
        accepted = await control.request(node, "t-1", 1, "GracefulShutdown")
        assert isinstance(accepted, RequestAccepted), accepted
        assert [(r.reset_type, r.user_agent) for r in peer.bmc.resets] == [
            ("GracefulShutdown", agent)
        ]
        assert "dispatcher=alpha" in agent and "replica=pod-a-1234-abcdef" in agent
        lead.step_down("a newer leader acted")
        refused = await control.request(node, "t-1", 2, "On")
        assert isinstance(refused, RequestErrored) and refused.detail.startswith("not sent")
        assert len(peer.bmc.resets) == 1  # nothing more reached the BMC
    finally:
        await control.close()
