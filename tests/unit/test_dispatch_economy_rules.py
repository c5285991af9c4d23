"""Dispatcher write and kill rules with a fake clock: a waiting container's changed
scheduling status is written at most once per scheduling_status_interval (a first write
or a spec change at once); a runner nobody wants (its ContainerDispatch deleted) gets
TERM, again every term_interval, KILL after term_timeout, nothing in between."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from nodewarden.config import DispatchSettings
from nodewarden.dispatch.dispatcher import Dispatcher
from nodewarden.dispatch.queue import Container, ContainerQueue
from nodewarden.fleet.policies import PolicyBook


@dataclass
class _Worker:
    name: str = "n1"
    probe_now: asyncio.Event = field(default_factory=asyncio.Event)

    def runner_signalled(self) -> None:
        self.probe_now.set()


class _Pool:
    async def target(self, worker: Any) -> object:
        return "target"


@dataclass
class _Prober:
    signals: list[tuple[str, str]] = field(default_factory=list)

    async def kill_runner(self, target: object, uuid: str, signal: str) -> None:
        self.signals.append((uuid, signal))


T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _dispatcher(now: list[datetime], prober: _Prober | None = None) -> Dispatcher:
    return Dispatcher(
        namespace="ns",
        dispatcher_id="d",
        settings=DispatchSettings(term_interval=10, term_timeout=60, scheduling_status_interval=30),
        queue=ContainerQueue(kube=None, namespace="ns", dispatcher_id="d"),  # type: ignore[arg-type]
        policies=PolicyBook(namespace="ns", default_name="default"),
        pool=_Pool(),  # type: ignore[arg-type]
        cloud=None,
        prober=prober,  # type: ignore[arg-type]
        clock=lambda: now[0],
    )


def _container(
    queue: ContainerQueue, generation: int, status: dict[str, Any], rv: str = "7"
) -> Container:
    queue.observe(
        {
            "metadata": {
                "name": "c",
                "namespace": "ns",
                "resourceVersion": rv,
                "generation": generation,
            },
            "spec": {
                "uuid": "zzzzz-dz642-000000000000001",
                "resources": {"vcpus": 1, "ram": "1Gi"},
            },
            "status": status,
        }
    )
    c = queue.get("c")
    assert c is not None
    return c


def test_a_changed_scheduling_status_waits_for_the_interval() -> None:
    now = [T0]
    dispatcher = _dispatcher(now)
    # a new container: its first write (acknowledgement) goes at once
    fresh = _container(dispatcher.queue, 1, {})
    assert dispatcher.outcomes.wait_changes(fresh, "waiting for a new small to boot")
    written = _container(
        dispatcher.queue,
        1,
        {
            "phase": "Queued",
            "schedulingStatus": "waiting for a new small to boot",
            "observedGeneration": 1,
        },
    )
    written.status_written_at = T0
    assert not dispatcher.outcomes.wait_changes(written, "waiting for a new small to boot")
    now[0] = T0 + timedelta(seconds=29)
    assert not dispatcher.outcomes.wait_changes(written, "waiting: every node is busy")
    now[0] = T0 + timedelta(seconds=30)
    assert dispatcher.outcomes.wait_changes(written, "waiting: every node is busy")
    # a spec change is acknowledged at once
    now[0] = T0 + timedelta(seconds=1)
    edited = _container(
        dispatcher.queue,
        2,
        {
            "phase": "Queued",
            "schedulingStatus": "waiting for a new small to boot",
            "observedGeneration": 1,
        },
    )
    assert edited.status_written_at == T0  # carried over from the previous version
    assert dispatcher.outcomes.wait_changes(edited, "waiting for a new small to boot")


def test_an_unwanted_runner_gets_term_every_interval_then_kill() -> None:
    now = [T0]
    prober = _Prober()
    dispatcher = _dispatcher(now, prober)
    worker = _Worker()

    async def round_at(seconds: float) -> None:
        now[0] = T0 + timedelta(seconds=seconds)
        await dispatcher.runners.kill_unwanted(worker, "u1")  # type: ignore[arg-type]

    async def scenario() -> None:
        for t in (0, 1, 5, 10, 11, 20, 59, 60, 61, 70):
            await round_at(t)

    asyncio.run(scenario())
    assert prober.signals == [
        ("u1", "TERM"),  # 0
        ("u1", "TERM"),  # 10
        ("u1", "TERM"),  # 20
        ("u1", "TERM"),  # 59 (30, 40, 50 had no round)
        ("u1", "KILL"),  # 70: term_timeout passed
    ]
    assert worker.probe_now.is_set()


class _RecordingCustom:
    def __init__(self) -> None:
        self.patches: list[dict[str, Any]] = []

    async def patch_namespaced_custom_object_status(self, *args: Any, **kw: Any) -> dict[str, Any]:
        patch: dict[str, Any] = args[5]
        self.patches.append(patch)
        return {"metadata": {"name": args[4], "namespace": args[2], "resourceVersion": "99"}}


class _RecordingKube:
    field_manager = "test"

    def __init__(self) -> None:
        self.custom = _RecordingCustom()

    def fenced_status(self, status: Any) -> dict[str, Any]:
        return dict(status)  # no leader election: no token

    def refused(self, err: Exception, what: str) -> Exception:
        return err


def test_a_write_that_would_conflict_or_became_pointless_is_not_sent() -> None:
    kube = _RecordingKube()
    queue = ContainerQueue(kube=kube, namespace="ns", dispatcher_id="d")  # type: ignore[arg-type]
    stale = _container(queue, 1, {})
    _container(queue, 1, {"phase": "Queued"}, rv="8")  # the watch brought a newer version

    async def scenario() -> list[bool]:
        return [
            # the cache moved on (resourceVersion 8): the API server would answer 409
            await queue.write(stale, {"phase": "Queued"}, precondition=True),
            # a start took the container while the write waited for its lane
            await queue.write(queue.by_name["c"], {"phase": "Queued"}, unless=lambda: True),
            # current: sent
            await queue.write(queue.by_name["c"], {"phase": "Queued"}, precondition=True),
        ]

    assert asyncio.run(scenario()) == [False, False, True]
    assert kube.custom.patches == [
        {"status": {"phase": "Queued"}, "metadata": {"resourceVersion": "8"}}
    ]
