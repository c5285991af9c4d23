"""BMC observations across the fleet are bounded (`power.bmc_observation_concurrency`).

The Redfish client is replaced by a stand-in that counts the reads in flight: what is
tested is the controller-side bound, not the wire (the fake-BMC tests cover that).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest

from nodewarden.api.workernode import WorkerNodeSpec
from nodewarden.power.control import NodeRef, PowerControl
from nodewarden.redfish.facts import PowerStateObservation, RedfishPowerState

T0 = datetime(2026, 12, 1, tzinfo=UTC)
SPEC = WorkerNodeSpec.model_validate(
    {
        "nodeType": "SideNode",
        "controlMethod": "Redfish",
        "capacity": {"vcpus": 4, "ram": "8Gi"},
        "bmc": {
            "endpoint": "https://127.0.0.1:1",
            "usernameSecretRef": {"name": "bmc", "key": "username"},
            "passwordSecretRef": {"name": "bmc", "key": "password"},
        },
    }
)


class CountingClient:
    def __init__(self, tally: dict[str, int], gate: asyncio.Event) -> None:
        self.tally = tally
        self.gate = gate
        self.source = "stand-in"

    async def read_power_state(self) -> PowerStateObservation:
        self.tally["now"] += 1
        self.tally["most"] = max(self.tally["most"], self.tally["now"])
        try:
            await self.gate.wait()
        finally:
            self.tally["now"] -= 1
        return PowerStateObservation("1", RedfishPowerState.ON, "On", self.source, T0)


@pytest.mark.parametrize("bound", [1, 5])
async def test_reads_in_flight_never_exceed_the_bound(bound: int) -> None:
    control = PowerControl(
        credentials=None,  # type: ignore[arg-type]  # _redfish is replaced below
        prober=None,
        nodes=None,
        clock=lambda: T0,
        observation_concurrency=bound,
    )
    tally = {"now": 0, "most": 0}
    gate = asyncio.Event()
    client = CountingClient(tally, gate)

    async def redfish(node: NodeRef) -> Any:
        return client

    control._redfish = redfish  # type: ignore[method-assign]
    reads = [asyncio.create_task(control.read_power(NodeRef(f"n{i}", SPEC))) for i in range(20)]
    for _ in range(50):  # let every task reach the bound
        await asyncio.sleep(0)
    assert tally["now"] == bound
    gate.set()
    readings = await asyncio.gather(*reads)
    assert tally["most"] == bound
    assert all(r is not None and getattr(r, "power", None) == "On" for r in readings)
