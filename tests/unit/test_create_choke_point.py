"""Every create passes `WorkerPool.admit`: declared CloudVMs beyond a cap keep waiting with
the cap named, get their instance once the cap allows it, and nothing is created while
the default policy is missing (in process; the cluster test counts at the stub cloud)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from nodewarden.cloud.backoff import CreatePermission
from nodewarden.cloud.tags import TagKeys
from nodewarden.config import CreateLimits, DispatchSettings
from nodewarden.fleet.policies import PolicyBook
from nodewarden.kube.client import Conflict
from nodewarden.pool.workers import WorkerPool
from nodewarden.scheduling.caps import Admission
from nodewarden.scheduling.instancetypes import InstanceType

GPU = InstanceType(name="gpu", provider_type="p4d", vcpus=8, ram=64 * 2**30, gpus=1, price=3.26)
T0 = datetime(2026, 1, 1, tzinfo=UTC)
NS = "ns"


class Kube:
    def __init__(self) -> None:
        self.conflicts: set[str] = set()

    async def get(self, kind: Any, ns: str, name: str) -> Any:
        return declared(name)

    async def patch(self, kind: Any, ns: str, name: str, body: Mapping[str, Any]) -> Any:
        if name in self.conflicts:
            self.conflicts.discard(name)
            raise Conflict(f"patch WorkerNode {ns}/{name}: conflict", 409)
        return {
            "metadata": {"name": name, "namespace": ns, **body["metadata"]},
            "spec": {"nodeType": "CloudVM", "instanceType": "gpu", "idleBehavior": "hold"},
        }


class Cloud:
    tag_keys = TagKeys()

    def __init__(self) -> None:
        self.blocked: str | None = None

    def instance_type(self, name: str) -> InstanceType | None:
        return GPU if name == "gpu" else None

    def may_create(self, itype: InstanceType, now: datetime) -> CreatePermission:
        if self.blocked:
            return CreatePermission(False, self.blocked)
        return CreatePermission(True, "")


class Observer:
    def __init__(self) -> None:
        self.holds: dict[str, Admission | None] = {}

    def held(self, name: str, refusal: Admission | None) -> None:
        self.holds[name] = refusal


def declared(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": NS, "resourceVersion": "1"},
        "spec": {"nodeType": "CloudVM", "instanceType": "gpu", "idleBehavior": "hold"},
    }


def policy_body(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "default", "namespace": NS, "generation": 1}, "spec": spec}


def make_pool(limits: CreateLimits, book: PolicyBook) -> tuple[WorkerPool, list[str], Observer]:
    created: list[str] = []
    pool = WorkerPool(
        kube=Kube(),  # type: ignore[arg-type]
        cloud=Cloud(),  # type: ignore[arg-type]
        prober=None,  # type: ignore[arg-type]
        namespace=NS,
        dispatcher_id="d",
        settings=DispatchSettings(limits=limits),
        client_key=None,
        master=None,
        takeover_after=lambda: None,  # type: ignore[arg-type, return-value]
        default_policy=None,
        clock=lambda: T0,
        on_change=lambda: None,
        policies=book,
    )

    async def create_instance(worker: Any, itype: InstanceType) -> None:
        created.append(worker.name)

    pool.lifecycle._create_instance = create_instance  # type: ignore[method-assign]
    observer = Observer()
    pool.observer = observer  # type: ignore[assignment]
    for i in range(50):
        pool.observe_node(declared(f"gpu-{i:02d}"))
    return pool, created, observer


async def settle(pool: WorkerPool) -> None:
    await pool.adopt_declared()
    while pool.ctx.tasks:
        await asyncio.gather(*pool.ctx.tasks)


async def test_fifty_declared_vms_beyond_a_ceiling_get_exactly_that_many() -> None:
    book = PolicyBook(namespace=NS, default_name="default")
    book.observe(policy_body(maxNodes=40, maxHourlySpend=1000))
    pool, created, observer = make_pool(CreateLimits(max_nodes=7), book)
    await settle(pool)
    assert len(created) == 7
    held = {name for name, refusal in observer.holds.items() if refusal is not None}
    assert len(held) == 43 and held.isdisjoint(created)
    refusal = observer.holds[next(iter(held))]
    assert refusal is not None and "limits.maxNodes (7)" in refusal.message
    # rounds go by: nobody else gets one
    await settle(pool)
    assert len(created) == 7
    # the administrator raises the ceiling: creation resumes, up to the policy's 40
    pool.ctx.settings = DispatchSettings(limits=CreateLimits(max_nodes=100))
    await settle(pool)
    assert len(created) == 40
    assert all(observer.holds[name] is None for name in created[7:])
    assert "PowerPolicy 'default' maxNodes (40)" in next(
        r.message for r in observer.holds.values() if r is not None
    )


async def test_spend_ceiling_holds_the_dearest_gpus() -> None:
    book = PolicyBook(namespace=NS, default_name="default")
    book.observe(policy_body())
    pool, created, observer = make_pool(CreateLimits(max_hourly_spend=10.0), book)
    await settle(pool)
    assert len(created) == 3  # 3 x 3.26 = 9.78/h; a fourth would be 13.04/h
    assert pool.admissions.fleet().hourly_spend < 10.0
    assert sum(1 for r in observer.holds.values() if r is not None) == 47


async def test_no_default_policy_no_create_and_the_condition_says_why() -> None:
    book = PolicyBook(namespace=NS, default_name="default")
    pool, created, observer = make_pool(CreateLimits(max_nodes=100), book)
    await settle(pool)
    assert created == []
    refusal = observer.holds["gpu-00"]
    assert refusal is not None and "does not exist" in refusal.message
    assert pool.create(GPU) is None  # a planned create is refused at the same point
    book.observe(policy_body(cooldown="99999999999h"))  # invalid: still stopped
    await settle(pool)
    assert created == []
    refusal = observer.holds["gpu-00"]
    assert refusal is not None and "is invalid" in refusal.message
    book.observe(policy_body(maxNodes=2))
    await settle(pool)
    assert len(created) == 2


async def test_the_clouds_back_off_holds_declared_vms_too() -> None:
    book = PolicyBook(namespace=NS, default_name="default")
    book.observe(policy_body())
    pool, created, observer = make_pool(CreateLimits(), book)
    cloud: Any = pool.ctx.cloud
    cloud.blocked = "quota exceeded; retry after 60s"
    await settle(pool)
    assert created == []
    refusal = observer.holds["gpu-00"]
    assert refusal is not None and "quota exceeded" in refusal.message


async def test_a_declared_vm_whose_label_patch_conflicts_is_tried_again() -> None:
    """Its status was written meanwhile (a resourceVersion conflict): it is read again and
    taken in the next round -- before, it waited for a watch event that might never come,
    with neither an instance nor a condition."""
    book = PolicyBook(namespace=NS, default_name="default")
    book.observe(policy_body())
    pool, created, _ = make_pool(CreateLimits(max_nodes=2), book)
    kube: Any = pool.ctx.kube
    kube.conflicts = {"gpu-00"}
    await settle(pool)
    assert created == ["gpu-01", "gpu-02"]
    assert "gpu-00" in pool.declared  # not dropped: tried again in the next round
    await settle(pool)
    refusal = pool.holds.get("gpu-00")
    assert refusal is not None and "maxNodes (2)" in refusal.message
