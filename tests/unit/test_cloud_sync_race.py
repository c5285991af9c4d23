"""The cloud sync does not take a VM for vanished when its create returned while the list
was on its way (the list was asked for before the instance existed)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from nodewarden.cloud.model import CloudInstance, InstanceState
from nodewarden.cloud.tags import TagKeys
from nodewarden.dispatch.workers import Worker, WorkerPool

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _instance(iid: str) -> CloudInstance:
    return CloudInstance(
        id=iid,
        name=iid,
        instance_type="small",
        provider_type="t3.small",
        state=InstanceState.RUNNING,
        price=0.02,
        created_at=T0 - timedelta(minutes=10),
        observed_at=T0,
        source="cloud:test",
    )


def _pool(clock: list[datetime], list_call: Any) -> tuple[WorkerPool, list[str]]:
    """A WorkerPool with only what `sync_cloud` touches: the rest of it needs a cluster."""
    pool = WorkerPool.__new__(WorkerPool)
    forgotten: list[str] = []

    async def forget(worker: Worker, why: str) -> None:
        forgotten.append(worker.name)

    async def gone(worker: Worker, at: datetime) -> None:
        pass

    class Cloud:
        list_managed_instances = staticmethod(list_call)

    pool.cloud = Cloud()  # type: ignore[assignment]
    pool.clock = lambda: clock[0]  # type: ignore[method-assign]
    pool.tags = TagKeys()
    pool.dispatcher_id = "d"
    pool.workers = {}
    pool.observer = type("O", (), {"listed": lambda *a: None, "gone": staticmethod(gone)})()  # type: ignore[assignment]
    pool.on_change = lambda: None  # type: ignore[method-assign]
    pool._forget = forget  # type: ignore[method-assign]
    return pool, forgotten


def _worker(name: str, known_at: datetime) -> Worker:
    w = Worker(name=name, instance_type=None, created_at=known_at - timedelta(seconds=90))
    w.instance = _instance(f"i-{name}")
    w.instance_known_at = known_at
    return w


def test_an_instance_created_while_the_list_was_on_its_way_is_not_gone() -> None:
    clock = [T0]
    pool: WorkerPool

    async def list_call() -> list[CloudInstance]:
        # the create of "late" returns while the list is in flight
        clock[0] = T0 + timedelta(seconds=2)
        pool.workers["late"] = _worker("late", clock[0])
        return []

    pool, forgotten = _pool(clock, list_call)
    pool.workers["early"] = _worker("early", T0 - timedelta(seconds=30))
    asyncio.run(pool.sync_cloud())
    assert forgotten == ["early"]  # known before the list was asked for, and not in it
    assert "late" not in forgotten
