"""`nodewarden_cloud_spend_per_hour` through 500 create/destroy cycles (issue 26), in
process with the real registry, the real worker pool and cloud adapter over the stub
cloud: never negative, and at every scrape equal to the summed prices of the instances
the stub cloud lists as ours -- booting (pending) and shutting down (stopping) included.

(Karpenter's per-pool cost gauge went negative after repeated start/stop,
kubernetes-sigs/karpenter#2938; ours is a sum read from the pool at each scrape, so this
guards a future change to an incremental one.)"""

from __future__ import annotations

import asyncio
import random
from datetime import timedelta
from typing import Any

import pytest

from cloud.cloud_peers import stub_facade
from memkube import MemoryKube
from nodewarden.clock import utc_now
from nodewarden.cloud.tags import TagKeys
from nodewarden.config import CreateLimits, DispatchSettings
from nodewarden.fleet.policies import PolicyBook
from nodewarden.metrics import REGISTRY
from nodewarden.pool.identity import master_secret
from nodewarden.pool.worker import PoolState
from nodewarden.pool.workers import WorkerPool
from nodewarden.scheduling.instancetypes import InstanceType
from nodewarden.ssh.credentials import SshClientKey
from nodewarden_doubles.stubcloud import StubCloud, StubFaults, WorkerSpec

pytestmark = pytest.mark.asyncio

CYCLES = 500
DISPATCHER = "spend"


class NoSsh:
    """A stub VM without an SSH server: the spend needs none, and 500 would cost seconds."""

    async def start(self) -> int:
        return 0

    async def stop(self) -> None:
        return None


class Unprobed:
    """The pool's prober, never used here (no VM is probed)."""

    async def disconnect(self, node: str) -> None:
        return None

    async def forget(self, node: str) -> None:
        return None


class Quiet:
    """The pool's observer (the power controller), not under test."""

    def listed(self, *args: Any) -> None: ...

    def list_failed(self, *args: Any) -> None: ...

    async def gone(self, *args: Any) -> None: ...

    def held(self, *args: Any) -> None: ...

    def probed(self, *args: Any) -> None: ...


def _no_ssh(spec: WorkerSpec) -> NoSsh:
    return NoSsh()


def scraped() -> float:
    value = REGISTRY.get_sample_value("nodewarden_cloud_spend_per_hour", {"currency": "EUR"})
    assert value is not None, "no spend series for the currency"
    return float(value)


async def test_the_spend_equals_the_listed_instances_through_500_cycles(
    catalogue: list[InstanceType],
) -> None:
    cloud = StubCloud(
        "spend-churn",
        faults=StubFaults(destroy_delay=3600.0),  # stopping until the test says it is gone
        catalogue=catalogue,
        worker_factory=_no_ssh,
    ).start()
    key = SshClientKey.generate()
    book = PolicyBook(namespace="ns", default_name="default")
    book.observe({"metadata": {"name": "default", "namespace": "ns", "generation": 1}, "spec": {}})
    facade = stub_facade(
        cloud, catalogue, dispatcher=DISPATCHER, currency="EUR", list_in_process=False
    )
    pool = WorkerPool(
        kube=MemoryKube(),  # type: ignore[arg-type]
        cloud=facade,
        prober=Unprobed(),  # type: ignore[arg-type]
        namespace="ns",
        dispatcher_id=DISPATCHER,
        settings=DispatchSettings(limits=CreateLimits(max_nodes=100, max_hourly_spend=1000)),
        client_key=key,
        master=master_secret(key),
        takeover_after=lambda: timedelta(minutes=10),
        default_policy="default",
        clock=utc_now,
        on_change=lambda: None,
        policies=book,
    )
    pool.observer = Quiet()  # type: ignore[assignment]
    tag = TagKeys().dispatcher
    dice = random.Random(26)
    prices = {t.provider_type: t.price for t in catalogue}
    scrapes = 0

    def check(what: str) -> None:
        nonlocal scrapes
        listed = cloud.api_list({f"tag:{tag}": DISPATCHER})
        want = sum(prices[v.size] for v in listed if v.state != "terminated")
        got = scraped()
        scrapes += 1
        assert got >= 0, f"{what}: negative spend {got}"
        assert got == pytest.approx(want, abs=1e-9), (
            what,
            got,
            want,
            [(v.id, v.state) for v in listed],
            [(w.name, w.state, w.instance is not None) for w in pool.workers.values()],
        )

    async def listed() -> None:
        await pool.sync.sync()  # the list now (the loop's pace would wait for its interval)

    async def settle() -> None:
        while pool.ctx.tasks:
            await asyncio.gather(*list(pool.ctx.tasks))

    try:
        check("empty")
        destroyed = 0
        while destroyed < CYCLES:
            for _ in range(dice.randint(1, 3)):
                assert pool.create(dice.choice(catalogue)) is not None
            await settle()  # the creates returned: booting instances are listed (pending)
            check("after creates")
            await listed()
            check("after a list")
            alive = [
                w
                for w in pool.workers.values()
                if w.instance is not None and w.state is not PoolState.SHUTTING_DOWN
            ]
            for worker in dice.sample(alive, k=min(len(alive), dice.randint(1, 3))):
                await pool.destroy(worker, "churn")
                destroyed += 1
            check("after destroys: stopping instances still listed and still billed")
            await listed()
            check("after a list while they stop")
            cloud.finish_destroys()
            await listed()  # they left the list: their workers go
            await settle()
            check("after they left the list")
        assert scrapes >= CYCLES
        assert cloud.api_calls.get("create", 0) >= CYCLES
    finally:
        await pool.close()
        await facade.close()
        cloud.close()
    # the pool closed: its source left the metric
    assert REGISTRY.get_sample_value("nodewarden_cloud_spend_per_hour", {"currency": "EUR"}) is None
