"""Races in the worker pool: the cloud sync does not take a VM for vanished when its create
returned while the list was on its way; a destroy asked for while the create was in flight
is carried out once the instance exists."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import SecretBytes

from nodewarden.cloud.model import CloudInstance, InstanceState
from nodewarden.cloud.tags import TagKeys
from nodewarden.config import DispatchSettings
from nodewarden.ownership import DISPATCHER_LABEL
from nodewarden.pool.workers import Worker, WorkerPool
from nodewarden.scheduling.instancetypes import InstanceType

SMALL = InstanceType(name="small", provider_type="t3.small", vcpus=2, ram=4 * 2**30, price=0.02)

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
    pool = WorkerPool(
        kube=None,  # type: ignore[arg-type]
        cloud=None,
        prober=None,  # type: ignore[arg-type]
        namespace="ns",
        dispatcher_id="d",
        settings=DispatchSettings(),
        client_key=None,
        master=None,
        takeover_after=lambda: timedelta(hours=1),
        default_policy=None,
        clock=lambda: clock[0],
        on_change=lambda: None,
    )
    forgotten: list[str] = []

    async def forget(worker: Worker, why: str) -> None:
        forgotten.append(worker.name)

    async def gone(worker: Worker, at: datetime) -> None:
        pass

    class Cloud:
        list_managed_instances = staticmethod(list_call)

    pool.ctx.cloud = Cloud()  # type: ignore[assignment]
    pool.ctx.tags = TagKeys()
    pool.observer = type("O", (), {"listed": lambda *a: None, "gone": staticmethod(gone)})()  # type: ignore[assignment]
    pool.lifecycle.forget = forget  # type: ignore[method-assign]
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
        pool.ctx.workers["late"] = _worker("late", clock[0])
        return []

    pool, forgotten = _pool(clock, list_call)
    pool.ctx.workers["early"] = _worker("early", T0 - timedelta(seconds=30))
    asyncio.run(pool.sync_cloud())
    assert forgotten == ["early"]  # known before the list was asked for, and not in it
    assert "late" not in forgotten


def test_a_destroy_asked_for_while_the_create_was_in_flight_is_carried_out() -> None:
    clock = [T0]
    destroyed: list[str] = []
    probed: list[str] = []
    pool: WorkerPool

    class Key:
        public_key = "ssh-ed25519 AAAA test"

    class Prober:
        async def disconnect(self, name: str) -> None:
            pass

    async def create(request: Any) -> CloudInstance:
        # the power controller destroys the node while its create is on its way
        await pool.destroy(worker, "WORKER_DOWN")
        return _instance("i-new")

    async def destroy(instance: CloudInstance) -> None:
        destroyed.append(instance.id)

    pool, _ = _pool(clock, None)
    cloud: Any = pool.ctx.cloud
    cloud.create_request = lambda **kw: (kw, None)
    cloud.create = create
    cloud.destroy = destroy
    pool.ctx.master = SecretBytes(b"m" * 32)
    pool.ctx.client_key = Key()  # type: ignore[assignment]
    pool.ctx.prober = Prober()  # type: ignore[assignment]
    pool.probes.ensure = lambda w: probed.append(w.name)  # type: ignore[method-assign]
    worker = Worker(name="n1", instance_type=None, created_at=T0, creating=True)
    pool.ctx.workers["n1"] = worker

    asyncio.run(pool.lifecycle._create_instance(worker, SMALL))
    assert destroyed == ["i-new"]
    assert probed == []  # nothing is started on a node that is going


def test_a_vm_found_running_is_dated_from_when_this_process_found_it() -> None:
    """A WorkerNode of ours whose worker this process did not create (a restart) is
    `found_at` the moment it is first seen: its boot grace counts from there
    (`rules.vm`); one this process creates is not."""
    clock = [T0]
    pool, _ = _pool(clock, None)
    pool.ctx.cloud = None  # what the WorkerNode's instance type is plays no part here
    body = {
        "apiVersion": "nodewarden.io/v1alpha1",
        "kind": "WorkerNode",
        "metadata": {"name": "vm-a", "namespace": "ns", "labels": {DISPATCHER_LABEL: "d"}},
        "spec": {"nodeType": "CloudVM", "instanceType": "small"},
    }
    pool.nodes.observe_node(body)
    found = pool.ctx.workers["vm-a"]
    assert found.found_at == T0
    assert found.snapshot(None).found_at == T0
    clock[0] = T0 + timedelta(minutes=5)
    pool.nodes.observe_node(body)  # seen again: still found when first seen
    assert pool.ctx.workers["vm-a"].found_at == T0
    made = Worker(name="vm-b", instance_type=SMALL, created_at=T0, creating=True)
    assert made.found_at is None and made.snapshot(None).found_at is None
