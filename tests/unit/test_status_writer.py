"""NodeStatusWriter: one write per node at a time, so two writes of the same node never
conflict with each other (a false PowerStateConflict would make the controller drop a
power request and reload); a real second writer is still detected.

`FakeStatusApi` stands in for the API server's status subresource (merge patch with an
optional resourceVersion precondition); the same writer runs against the real API
server in tests/power."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from nodewarden.kube.client import Conflict
from nodewarden.power.status import NodeStatusWriter, PowerStateConflict


class FakeStatusApi:
    """Fake of the status subresource of one WorkerNode (see the module docstring)."""

    def __init__(self) -> None:
        self.rv = 1
        self.status: dict[str, Any] = {}
        self.patches: list[dict[str, Any]] = []
        self.in_flight = asyncio.Event()

    def body(self) -> dict[str, Any]:
        return {"metadata": {"name": "n1", "resourceVersion": str(self.rv)}, "status": self.status}

    async def patch_status(
        self,
        kind: Any,
        namespace: str,
        name: str,
        status: dict[str, Any],
        resource_version: str | None = None,
    ) -> dict[str, Any]:
        self.in_flight.set()
        await asyncio.sleep(0.01)  # a request in flight: another write may start meanwhile
        if resource_version is not None and resource_version != str(self.rv):
            raise Conflict("conflict", 409)
        self.patches.append(dict(status))
        self.status = {**self.status, **status}
        self.rv += 1
        return self.body()

    async def get(self, kind: Any, namespace: str, name: str) -> dict[str, Any]:
        return self.body()


def power_state(seq: int) -> dict[str, Any]:
    return {"state": "ON_IDLE", "seq": seq}


def test_a_flush_and_a_persist_of_one_node_do_not_conflict() -> None:
    async def scenario() -> None:
        api = FakeStatusApi()
        writer = NodeStatusWriter(api, "ns")  # type: ignore[arg-type]
        writer.observe("n1", api.body())
        writer.contribute("n1", {"powerState": power_state(1), "state": "Idle"})
        flushing = asyncio.ensure_future(writer.flush())
        await api.in_flight.wait()  # the flush's request is in flight
        writer.contribute("n1", {"powerState": power_state(2)})
        await writer.persist("n1")  # must not raise PowerStateConflict
        await flushing
        assert api.status["powerState"]["seq"] == 2
        assert [p.get("powerState", {}).get("seq") for p in api.patches] == [1, 2]

    asyncio.run(scenario())


def test_another_writer_advancing_the_power_state_is_a_conflict() -> None:
    async def scenario() -> None:
        api = FakeStatusApi()
        writer = NodeStatusWriter(api, "ns")  # type: ignore[arg-type]
        writer.observe("n1", api.body())
        api.status = {"powerState": power_state(7)}  # someone else wrote (rv moves on)
        api.rv += 1
        writer.contribute("n1", {"powerState": power_state(1)})
        with pytest.raises(PowerStateConflict):
            await writer.persist("n1")
        assert api.status["powerState"]["seq"] == 7

    asyncio.run(scenario())


def test_a_held_node_is_written_at_the_next_flush_in_one_patch() -> None:
    async def scenario() -> None:
        api = FakeStatusApi()
        writer = NodeStatusWriter(api, "ns")  # type: ignore[arg-type]
        writer.observe("n1", api.body())
        writer.contribute("n1", {"state": "Off", "powerState": power_state(1)})
        await writer.flush(hold={"n1"})
        assert api.patches == []  # held: nothing sent
        writer.contribute("n1", {"powerState": power_state(2)})
        await writer.flush()
        assert api.patches == [{"state": "Off", "powerState": power_state(2)}]
        await writer.flush()
        assert len(api.patches) == 1  # nothing left to write

    asyncio.run(scenario())
