"""The last-probe tag is a coarse heartbeat (pool/probetag.py): rewritten only when the
stamp known is `probe_tag_interval` old, counted over 10 fake minutes of probes, and a
live dispatcher's VM is never old enough for a takeover while a dead one's is."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

from nodewarden.cloud.model import CloudInstance, InstanceState
from nodewarden.cloud.tags import TagKeys
from nodewarden.config import DispatchSettings
from nodewarden.pool.probes import ProbeLoop
from nodewarden.pool.probetag import tag_due, tag_interval
from nodewarden.pool.times import iso, parse_time
from nodewarden.pool.worker import Worker

T0 = datetime(2026, 1, 1, tzinfo=UTC)
TAKEOVER = timedelta(minutes=10)
KEYS = TagKeys()


def _instance(iid: str, stamp: datetime | None = None) -> CloudInstance:
    tags = {KEYS.dispatcher: "d", KEYS.node: iid}
    if stamp is not None:
        tags[KEYS.last_probe] = iso(stamp) or ""
    return CloudInstance(
        id=iid,
        name=iid,
        instance_type="small",
        provider_type="t3.small",
        state=InstanceState.RUNNING,
        tags=tags,
        price=0.02,
        created_at=T0 - timedelta(minutes=1),
        observed_at=T0,
        source="cloud:test",
    )


class CountingCloud:
    """Keeps the last-probe tag each instance was given and counts the writes."""

    def __init__(self) -> None:
        self.writes = 0
        self.stamps: dict[str, datetime | None] = {}

    async def set_tags(self, instance: CloudInstance, tags: Mapping[str, str]) -> None:
        self.writes += 1
        self.stamps[instance.id] = parse_time(tags.get(KEYS.last_probe))


def _probes(cloud: CountingCloud, settings: DispatchSettings) -> ProbeLoop:
    ctx = SimpleNamespace(settings=settings, takeover_after=lambda: TAKEOVER, tags=KEYS)
    ctx.cloud_ = cloud
    return ProbeLoop(ctx)  # type: ignore[arg-type]


def test_the_default_interval_is_a_quarter_of_takeover_after() -> None:
    assert tag_interval(None, TAKEOVER) == timedelta(seconds=150)
    assert tag_interval(42.0, TAKEOVER) == timedelta(seconds=42)


def test_a_tag_is_due_only_once_the_newest_stamp_is_an_interval_old() -> None:
    interval = timedelta(seconds=150)
    assert tag_due(T0, written_at=None, listed_stamp=None, interval=interval)
    assert not tag_due(
        T0 + timedelta(seconds=149), written_at=T0, listed_stamp=None, interval=interval
    )
    assert tag_due(T0 + timedelta(seconds=150), written_at=T0, listed_stamp=None, interval=interval)
    # after a restart the listed tag counts: no rewrite of a fresh one
    assert not tag_due(
        T0 + timedelta(seconds=10), written_at=None, listed_stamp=T0, interval=interval
    )
    # the newer of the two decides
    assert not tag_due(
        T0 + timedelta(seconds=200),
        written_at=T0,
        listed_stamp=T0 + timedelta(seconds=100),
        interval=interval,
    )


def test_50_vms_probed_for_10_minutes_write_one_tag_per_interval() -> None:
    cloud = CountingCloud()
    settings = DispatchSettings()
    probes = _probes(cloud, settings)
    workers = [
        Worker(name=f"n{i}", instance_type=None, created_at=T0, instance=_instance(f"i-{i}"))
        for i in range(50)
    ]
    minutes = 10
    steps = int(minutes * 60 / settings.probe_interval)

    async def probe_for_ten_minutes() -> None:
        for step in range(steps):
            now = T0 + timedelta(seconds=step * settings.probe_interval)
            for worker in workers:
                await probes._maybe_tag_probe(worker, now)

    asyncio.run(probe_for_ten_minutes())
    interval = tag_interval(settings.probe_tag_interval, TAKEOVER).total_seconds()
    expected = 50 * minutes * 60 / interval  # 200 at a 150 s interval
    assert expected - 50 <= cloud.writes <= expected + 50
    assert cloud.writes < 50 * steps / 10  # not one a probe (3,000 probes)


def test_a_live_dispatcher_heartbeats_under_takeover_after_and_a_dead_one_does_not() -> None:
    """The other dispatcher's rule (`CloudSync._maybe_take_over`): claim when the stamp is
    `takeover_after` old. Probed every 10 s with the default interval the stamp's age
    never reaches it; once probes stop, it does."""
    cloud = CountingCloud()
    settings = DispatchSettings()
    probes = _probes(cloud, settings)
    worker = Worker(name="n0", instance_type=None, created_at=T0, instance=_instance("i-0", T0))
    cloud.stamps["i-0"] = T0

    async def run() -> timedelta:
        oldest = timedelta(0)
        for step in range(int(3600 / settings.probe_interval)):
            now = T0 + timedelta(seconds=step * settings.probe_interval)
            stamp = cloud.stamps["i-0"]
            assert stamp is not None
            oldest = max(oldest, now - stamp)
            await probes._maybe_tag_probe(worker, now)
        return oldest

    oldest = asyncio.run(run())
    assert oldest < TAKEOVER
    assert oldest <= tag_interval(None, TAKEOVER) + timedelta(seconds=settings.probe_interval)
