"""`kube.events.EventRecorder`: repeats fold into one Event's series (core/v1 `count`),
the caller never waits, a full queue drops and counts, a chatty object is rate limited."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from kubernetes_asyncio.client.exceptions import ApiException

from calibration import scaled
from nodewarden.kube.client import Kube
from nodewarden.kube.events import EventRecorder, EventWrite
from nodewarden.metrics import EVENTS_DROPPED

T0 = datetime(2026, 1, 1, tzinfo=UTC)
NODE = {"apiVersion": "nodewarden.io/v1", "kind": "WorkerNode",
        "metadata": {"name": "n1", "namespace": "ns", "uid": "u1"}}  # fmt: skip


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


class Sink:
    """The API server's side: Events by name, each with its count."""

    def __init__(self) -> None:
        self.writes: list[EventWrite] = []
        self.events: dict[str, dict[str, object]] = {}
        self.gate = asyncio.Event()
        self.gate.set()
        self.entered = asyncio.Event()

    async def __call__(self, write: EventWrite) -> None:
        self.entered.set()
        await self.gate.wait()
        self.writes.append(write)
        if write.create:
            self.events[write.name] = {"count": write.count, "reason": write.reason}
        else:
            self.events[write.name]["count"] = write.count


def dropped(why: str) -> float:
    return EVENTS_DROPPED.labels(why)._value.get()


async def test_a_repeat_within_the_window_patches_the_series_not_a_new_event() -> None:
    sink, clock = Sink(), Clock()
    rec = EventRecorder(sink, clock=clock, patch_interval=0.0)
    rec.record(NODE, reason="PowerNoAction", message="NONE [ACTIVE_WORK]")
    await rec.flush()
    for _ in range(3):
        clock.now += timedelta(seconds=30)
        rec.record(NODE, reason="PowerNoAction", message="NONE [ACTIVE_WORK]")
        await rec.flush()
    (event,) = sink.events.values()
    assert event["count"] == 4
    assert [w.create for w in sink.writes] == [True, False, False, False]
    assert sink.writes[-1].last == clock.now and sink.writes[-1].first == T0
    await rec.close()


async def test_repeats_while_the_first_write_is_queued_cost_no_request() -> None:
    sink = Sink()
    rec = EventRecorder(sink, clock=Clock())
    for _ in range(5):
        rec.record(NODE, reason="PowerNoAction", message="same")
    await rec.flush()
    (write,) = sink.writes
    assert write.create and write.count == 5
    await rec.close()


async def test_repeats_after_the_first_write_are_patched_once_per_interval() -> None:
    sink, clock = Sink(), Clock()
    rec = EventRecorder(sink, clock=clock, patch_interval=3600.0)
    rec.record(NODE, reason="PowerDeferred", message="first")
    await rec.flush()
    for _ in range(5):
        clock.now += timedelta(seconds=10)
        rec.record(NODE, reason="PowerDeferred", message="first")
    await rec.flush()
    assert len(sink.writes) == 1  # not due: the count waits
    await rec.close()  # what is not sent goes out at the end
    assert [(w.create, w.count) for w in sink.writes] == [(True, 1), (False, 6)]
    assert sink.writes[-1].last == clock.now


async def test_another_reason_or_an_expired_window_is_a_new_event() -> None:
    sink, clock = Sink(), Clock()
    rec = EventRecorder(sink, clock=clock, window_seconds=600)
    rec.record(NODE, reason="PowerNoAction", message="a")
    rec.record(NODE, reason="PowerDeferred", message="a")
    await rec.flush()
    clock.now += timedelta(seconds=601)
    rec.record(NODE, reason="PowerNoAction", message="a")
    await rec.flush()
    assert len(sink.events) == 3 and all(w.create for w in sink.writes)
    await rec.close()


async def test_a_full_queue_drops_counts_and_never_blocks_the_caller() -> None:
    sink = Sink()
    sink.gate.clear()  # the API server does not answer
    rec = EventRecorder(sink, clock=Clock(), queue_size=3)
    before = dropped("queue_full")
    accepted = [
        rec.record(
            {**NODE, "metadata": {"name": f"n{i}", "namespace": "ns"}}, reason="R", message="m"
        )
        for i in range(10)
    ]  # synchronous: returns with the sink stuck on its first write
    # the drainer takes its first write and waits at the gate
    await asyncio.wait_for(sink.entered.wait(), scaled(5.0))
    assert accepted.count(True) == 3
    assert dropped("queue_full") - before == 7
    assert rec.record({**NODE, "metadata": {"name": "late", "namespace": "ns"}},
                      reason="R", message="m")  # fmt: skip
    sink.gate.set()
    await rec.flush()
    assert len(sink.writes) == 4
    await rec.close()


async def test_one_chatty_object_is_rate_limited_and_counted() -> None:
    sink, clock = Sink(), Clock()
    rec = EventRecorder(sink, clock=clock, burst=3, refill_seconds=60)
    before = dropped("rate_limited")
    results = [rec.record(NODE, reason="R", message=f"m{i}") for i in range(5)]
    assert results == [True, True, True, False, False]
    assert dropped("rate_limited") - before == 2
    other = {**NODE, "metadata": {"name": "n2", "namespace": "ns"}}
    assert rec.record(other, reason="R", message="m0")  # another object: its own bucket
    clock.now += timedelta(seconds=60)
    assert rec.record(NODE, reason="R", message="m9")  # refilled
    await rec.flush()
    assert len(sink.events) == 5
    await rec.close()


async def test_close_sends_what_is_queued_then_refuses() -> None:
    sink = Sink()
    rec = EventRecorder(sink, clock=Clock())
    rec.record(NODE, reason="R", message="m")
    await rec.close()
    assert len(sink.writes) == 1
    assert not rec.record(NODE, reason="R", message="n")


class FakeCore:
    """The two Event calls `Kube.send_event` makes, answered like the API server."""

    def __init__(self) -> None:
        self.events: dict[str, dict[str, object]] = {}
        self.calls: list[str] = []

    async def create_namespaced_event(self, namespace: str, body: object, **_: object) -> object:
        self.calls.append("create")
        name = body.metadata.name  # type: ignore[attr-defined]
        self.events[name] = {"count": body.count}  # type: ignore[attr-defined]

        class Resp:
            status = 201

            async def read(self) -> bytes:
                return b"{}"

            def release(self) -> None:
                return None

        return Resp()

    async def patch_namespaced_event(
        self, name: str, namespace: str, patch: dict[str, object], **_: object
    ) -> None:
        self.calls.append("patch")
        if name not in self.events:
            raise ApiException(status=404)
        self.events[name].update(count=patch["count"])


async def test_kube_emits_through_its_recorder_and_recreates_an_expired_series() -> None:
    kube = Kube.__new__(Kube)
    core = FakeCore()
    kube.core = core  # type: ignore[assignment]
    kube.events = EventRecorder(kube.send_event, clock=Clock(), patch_interval=0.0)
    await kube.emit_event(NODE, reason="PowerNoAction", message="m")  # returns at once
    await kube.events.flush()
    await kube.emit_event(NODE, reason="PowerNoAction", message="m")
    await kube.events.flush()
    (name,) = core.events
    assert core.events[name]["count"] == 2 and core.calls == ["create", "patch"]
    core.events.clear()  # the API server's TTL removed it
    await kube.emit_event(NODE, reason="PowerNoAction", message="m")
    await kube.events.close()
    assert core.calls == ["create", "patch", "patch", "create"]
    assert core.events[name]["count"] == 3
