"""NodeStatusWriter: one write per node at a time, so two writes of the same node never
conflict with each other (a false PowerStateConflict would make the controller drop a
power request and reload); a real second writer is still detected.

`FakeStatusApi` stands in for the API server's status subresource (merge patch with an
optional resourceVersion precondition); the same writer runs against the real API
server in tests/power."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest

from nodewarden.fleet.status import NodeStatusWriter, PowerStateConflict
from nodewarden.kube.client import Conflict, KubeError


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


class RefusingStatusApi(FakeStatusApi):
    """The server refuses every write while `refuse` is set (a 422 of a CEL rule)."""

    refuse = True

    async def patch_status(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        if self.refuse:
            self.patches.append({"refused": True})
            raise KubeError("WorkerNode n1 is invalid: status.fence: Invalid value", 422)
        return await super().patch_status(*args, **kwargs)


def test_a_refused_write_backs_off_instead_of_being_sent_at_every_round(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Old code sent the same refused patch at every flush (every ~80 ms on a busy
    controller); now at 0.5 s, 1 s, 2 s ... up to 60 s, logged once, and the first write
    that lands ends the back-off."""

    async def scenario() -> None:
        api = RefusingStatusApi()
        now = [0.0]
        writer = NodeStatusWriter(api, "ns", monotonic=lambda: now[0])  # type: ignore[arg-type]
        writer.observe("n1", api.body())
        writer.contribute("n1", {"state": "Off"})
        sent_at: list[float] = []
        for _ in range(2000):  # 200 s of flushes, one every 0.1 s
            before = len(api.patches)
            await writer.flush()
            if len(api.patches) > before:
                sent_at.append(now[0])
            now[0] = round(now[0] + 0.1, 1)
        gaps = [b - a for a, b in itertools.pairwise(sent_at)]
        assert len(sent_at) < 12, sent_at
        assert all(later >= earlier for earlier, later in itertools.pairwise(gaps))
        assert max(gaps) <= 60.1
        warnings = [r for r in caplog.records if "status write of WorkerNode" in r.message]
        assert len(warnings) == 1
        api.refuse = False
        now[0] += 60.0
        await writer.flush()
        assert api.status == {"state": "Off"}
        writer.contribute("n1", {"state": "Idle"})
        await writer.flush()  # no back-off left
        assert api.status == {"state": "Idle"}

    asyncio.run(scenario())
