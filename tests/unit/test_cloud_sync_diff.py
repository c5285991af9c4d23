"""The pool's cloud sync against its last list (pool/listdiff.py, pool/cloudsync.py) and
its pace (pool/syncpace.py): only new, changed or vanished instances reach the takeover
and remove paths, the power controller hears every list, and the list runs fast while
something is outstanding and slow at rest."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from nodewarden.cloud.model import CloudInstance, InstanceState
from nodewarden.cloud.tags import TagKeys
from nodewarden.config import DispatchSettings
from nodewarden.pool.listdiff import diff_list, same
from nodewarden.pool.syncpace import SyncPace, next_sync_at
from nodewarden.pool.times import iso
from nodewarden.pool.workers import Worker, WorkerPool

T0 = datetime(2026, 1, 1, tzinfo=UTC)
KEYS = TagKeys()
TAKEOVER = timedelta(minutes=10)


def _vm(iid: str, owner: str = "d", stamp: datetime | None = None, **extra: str) -> CloudInstance:
    tags = {KEYS.dispatcher: owner, KEYS.node: iid, **extra}
    if stamp is not None:
        tags[KEYS.last_probe] = iso(stamp) or ""
    return CloudInstance(
        id=iid,
        name=iid,
        instance_type="small",
        provider_type="t3.small",
        state=InstanceState.RUNNING,
        tags=tags,
        private_ips=("10.0.0.1",),
        price=0.02,
        created_at=T0 - timedelta(hours=1),
        observed_at=T0,
        source="cloud:test",
    )


class Rig:
    """A WorkerPool with only what the sync touches, a listed cloud and counters."""

    def __init__(self, listing: list[CloudInstance]) -> None:
        self.now = T0
        self.listing = listing
        self.lists = 0
        self.next_sync: datetime | None = None
        self.claims: list[str] = []
        self.heard: list[tuple[set[str], datetime]] = []
        self.forgotten: list[str] = []
        self.pool = WorkerPool(
            kube=None,  # type: ignore[arg-type]
            cloud=None,
            prober=None,  # type: ignore[arg-type]
            namespace="ns",
            dispatcher_id="d",
            settings=DispatchSettings(sync_interval=10, sync_interval_at_rest=60),
            client_key=None,
            master=None,
            takeover_after=lambda: TAKEOVER,
            default_policy=None,
            clock=lambda: self.now,
            on_change=lambda: None,
        )
        rig = self

        class Cloud:
            async def list_managed_instances(self) -> list[CloudInstance]:
                rig.lists += 1
                return [i.model_copy(update={"observed_at": rig.now}) for i in rig.listing]

            def instance_type(self, name: str) -> None:
                return None

            async def set_tags(self, inst: CloudInstance, tags: Mapping[str, str]) -> None:
                rig.claims.append(inst.id)

        class Observer:
            def listed(self, ours: Mapping[str, CloudInstance], at: datetime) -> None:
                assert all(i.observed_at == at for i in ours.values())
                rig.heard.append((set(ours), at))

            def list_failed(self, at: datetime) -> None:
                pass

            async def gone(self, worker: Any, at: datetime) -> None:
                pass

        async def forget(worker: Worker, why: str) -> None:
            rig.forgotten.append(worker.name)
            del rig.pool.ctx.workers[worker.name]

        async def adopt(inst: CloudInstance, name: str) -> Worker | None:
            return None  # a claim's adoption needs a cluster; counted as a claim above

        self.pool.ctx.cloud = Cloud()  # type: ignore[assignment]
        self.pool.ctx.tags = KEYS
        self.pool.observer = Observer()  # type: ignore[assignment]
        self.pool.lifecycle.forget = forget  # type: ignore[method-assign]
        self.pool.sync._adopt = adopt  # type: ignore[method-assign]
        for inst in listing:
            if inst.tags[KEYS.dispatcher] == "d":
                worker = Worker(name=inst.id, instance_type=None, created_at=T0, instance=inst)
                self.pool.ctx.workers[inst.id] = worker

    def round(self, seconds: float = 0.0) -> None:
        """What the dispatcher's loop does each round, `seconds` later (`Loop.step`: it
        calls `sync_cloud` when asked or every `sync_interval`)."""
        self.now += timedelta(seconds=seconds)
        interval = timedelta(seconds=self.pool.ctx.settings.sync_interval)
        if self.pool.sync_requested() or self.next_sync is None or self.now >= self.next_sync:
            self.next_sync = self.now + interval
            asyncio.run(self.pool.sync_cloud())


def test_an_instance_is_the_same_when_only_its_list_time_changed() -> None:
    a = _vm("a")
    assert same(a, a.model_copy(update={"observed_at": T0 + timedelta(minutes=1)}))
    assert not same(a, _vm("a", extra_tag="x"))
    assert not same(a, a.model_copy(update={"state": InstanceState.STOPPED}))
    change = diff_list({"a": a, "b": _vm("b")}, [_vm("a"), _vm("c"), _vm("b", x="1")])
    assert [i.id for i in change.added] == ["c"]
    assert [i.id for i in change.changed] == ["b"]
    assert change.vanished == []
    gone = diff_list(change.view, [_vm("a")])
    assert sorted(i.id for i in gone.vanished) == ["b", "c"]
    assert diff_list(gone.view, [_vm("a")]).empty


def test_the_pace_is_fast_while_outstanding_slow_at_rest_and_a_takeover_wakes_it() -> None:
    pace = SyncPace.of_seconds(10, 60)
    assert next_sync_at(None, outstanding=False, takeover_due=None, pace=pace) is None
    at_rest = next_sync_at(T0, outstanding=False, takeover_due=None, pace=pace)
    assert at_rest == T0 + timedelta(seconds=60)
    busy = next_sync_at(T0, outstanding=True, takeover_due=None, pace=pace)
    assert busy == T0 + timedelta(seconds=10)
    soon = next_sync_at(T0, outstanding=False, takeover_due=T0 + timedelta(seconds=25), pace=pace)
    assert soon == T0 + timedelta(seconds=25)
    # never sooner than the fast pace; an at-rest interval below the fast one is the fast
    assert next_sync_at(T0, outstanding=False, takeover_due=T0, pace=pace) == busy
    assert SyncPace.of_seconds(10, 1).at_rest == timedelta(seconds=10)


def test_at_rest_the_cloud_is_listed_once_a_minute_and_every_list_is_heard() -> None:
    rig = Rig([_vm(f"v{i}") for i in range(20)])
    for _ in range(10 * 60):  # ten minutes of one-second rounds, nothing changing
        rig.round(1)
    assert rig.lists == 10  # the first at once, then one every 60 s
    assert len(rig.heard) == rig.lists  # every list confirmed to the power controller
    assert all(names == {f"v{i}" for i in range(20)} for names, _ in rig.heard)
    assert rig.forgotten == [] and rig.claims == []


def test_a_create_or_a_destroy_lists_at_the_fast_pace_and_a_request_at_once() -> None:
    rig = Rig([_vm("v0")])
    rig.round()
    assert rig.lists == 1
    rig.round(15)
    assert rig.lists == 1  # at rest
    rig.pool.sync.busy()  # what create / destroy / destroy_node call
    rig.round()
    assert rig.lists == 2  # 16 s since the last list: fast pace, due at once
    rig.round(5)
    assert rig.lists == 2
    rig.round(5)
    assert rig.lists == 2  # the list found nothing outstanding: back at rest
    rig.pool.request_sync()
    rig.round()
    assert rig.lists == 3


def test_a_vanished_instance_reaches_the_remove_path_once() -> None:
    rig = Rig([_vm("v0"), _vm("v1")])
    rig.round()
    rig.listing = [_vm("v0")]
    rig.pool.request_sync()
    rig.round(1)
    rig.pool.request_sync()
    rig.round(1)
    assert rig.forgotten == ["v1"]
    assert rig.heard[-1][0] == {"v0"}


def test_a_foreign_instance_is_claimed_when_its_takeover_comes_due_not_before() -> None:
    """A live dispatcher's instance (stamp refreshed) is never claimed; a dead one's is
    claimed at its due time, by a list the pace schedules for it."""
    live_stamp = T0
    rig = Rig([_vm("mine"), _vm("live", "e", stamp=live_stamp), _vm("dead", "e", stamp=T0)])
    for second in range(30 * 60):
        if second % 150 == 0:  # the other dispatcher's heartbeat (pool/probetag.py)
            live_stamp = T0 + timedelta(seconds=second)
            rig.listing[1] = _vm("live", "e", stamp=live_stamp)
        rig.round(1)
        if rig.claims:
            break
    assert rig.claims == ["dead"]
    claimed_at = rig.now
    assert T0 + TAKEOVER <= claimed_at <= T0 + TAKEOVER + timedelta(seconds=10)


def test_a_vm_that_stopped_answering_probes_keeps_the_fast_pace() -> None:
    rig = Rig([_vm("v0")])
    rig.round()
    worker = rig.pool.ctx.workers["v0"]
    worker.last_success = T0
    worker.attempts_since_success = 2
    rig.pool.request_sync()
    rig.round(1)
    lists = rig.lists
    rig.round(10)
    assert rig.lists == lists + 1  # fast: the list tells whether it stopped or is gone
    worker.attempts_since_success = 0
    rig.round(10)
    rig.round(10)
    assert rig.lists == lists + 2  # answering again: back at rest after that list
