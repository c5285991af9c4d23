"""The pure cloud back-off: which creates wait, for how long, and why."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from nodewarden.cloud.backoff import BackoffSettings, CloudBackoff
from nodewarden.cloud.errors import (
    CapacityUnavailable,
    CloudError,
    CloudErrorKind,
    PermanentCloudError,
    QuotaExceeded,
    QuotaGroupExceeded,
    RateLimited,
    TransientCloudError,
)
from nodewarden.scheduling.instancetypes import InstanceType

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def s(seconds: float) -> timedelta:
    return timedelta(seconds=seconds)


def itype(name: str, group: str | None = "standard", preemptible: bool = False) -> InstanceType:
    return InstanceType(
        name=name,
        provider_type=name.removesuffix("-spot"),
        vcpus=2,
        ram="8Gi",
        price=0.1,
        quota_group=group,
        preemptible=preemptible,
    )


M5 = itype("m5.large")
C5 = itype("c5.large")
M5_SPOT = itype("m5.large-spot", preemptible=True)
G4 = itype("g4dn.xlarge", group="g")
CATALOGUE = [M5, C5, M5_SPOT, G4]


def err(cls: type[CloudError], **kw: object) -> CloudError:
    return cls("x", operation="create", observed_at=T0, **kw)  # type: ignore[arg-type]


def test_nothing_blocked_initially() -> None:
    b = CloudBackoff()
    p = b.may_create(M5, T0)
    assert p.allowed and p.blocked_by is None
    assert b.call_allowed_at(T0) is None
    assert b.blocked_types(CATALOGUE, T0) == set()


def test_quota_blocks_every_create_for_one_minute() -> None:
    b = CloudBackoff()
    b.record_error(err(QuotaExceeded), T0, M5)
    for t in CATALOGUE:
        p = b.may_create(t, T0 + s(59))
        assert not p.allowed
        assert p.blocked_by is CloudErrorKind.QUOTA
        assert p.retry_at == T0 + s(60)
        assert "quota" in p.reason
    assert b.may_create(C5, T0 + s(60)).allowed
    # Calls other than creates are not blocked by a quota error.
    assert b.call_allowed_at(T0 + s(1)) is None


def test_capacity_blocks_only_that_provider_type_and_market() -> None:
    b = CloudBackoff()
    b.record_error(err(CapacityUnavailable), T0, M5)
    assert not b.may_create(M5, T0 + s(30)).allowed
    assert b.may_create(M5_SPOT, T0 + s(30)).allowed  # spot capacity is separate
    assert b.may_create(C5, T0 + s(30)).allowed
    assert b.blocked_types(CATALOGUE, T0 + s(30)) == {"m5.large"}
    assert b.may_create(M5, T0 + s(60)).allowed


def test_quota_group_blocks_the_group() -> None:
    b = CloudBackoff()
    b.record_error(err(QuotaGroupExceeded), T0, G4)
    assert b.blocked_types(CATALOGUE, T0 + s(1)) == {"g4dn.xlarge"}
    b2 = CloudBackoff()
    b2.record_error(err(QuotaGroupExceeded), T0, M5)
    assert b2.blocked_types(CATALOGUE, T0 + s(1)) == {"m5.large", "c5.large", "m5.large-spot"}


def test_quota_group_without_group_blocks_all() -> None:
    b = CloudBackoff()
    ungrouped = itype("x1", group=None)
    b.record_error(err(QuotaGroupExceeded), T0, ungrouped)
    assert b.blocked_types(CATALOGUE, T0 + s(1)) == {t.name for t in CATALOGUE}


def test_rate_limit_delay_grows_x1_5_plus_1_and_is_clamped() -> None:
    b = CloudBackoff()
    now = T0
    delays = []
    for _ in range(12):
        b.record_error(err(RateLimited), now)
        until = b.call_allowed_at(now)
        assert until is not None
        delays.append((until - now).total_seconds())
    assert delays[:4] == [1.0, 2.5, 4.75, 8.125]
    assert max(delays) == 60.0 and delays[-1] == 60.0
    assert all(1.0 <= d <= 60.0 for d in delays)
    # A success resets the delay.
    b.record_success(now + s(61))
    assert b.call_allowed_at(now + s(61)) is None
    b.record_error(err(RateLimited), now + s(62))
    assert b.call_allowed_at(now + s(62)) == now + s(63)


def test_rate_limit_respects_retry_after() -> None:
    b = CloudBackoff()
    b.record_error(err(RateLimited, retry_at=T0 + s(30)), T0)
    assert b.call_allowed_at(T0) == T0 + s(30)
    p = b.may_create(M5, T0 + s(10))
    assert not p.allowed and p.blocked_by is CloudErrorKind.RATE_LIMIT
    assert p.retry_at == T0 + s(30)


def test_locally_throttled_errors_do_not_grow_the_delay() -> None:
    b = CloudBackoff()
    b.record_error(err(RateLimited), T0)
    b.record_error(err(RateLimited, locally_throttled=True, retry_at=T0 + s(1)), T0)
    assert b.rate_limit_delay == 1.0


def test_transient_errors_block_nothing_permanent_blocks_the_type() -> None:
    b = CloudBackoff()
    b.record_error(err(TransientCloudError), T0, M5)
    assert b.may_create(M5, T0).allowed
    b.record_error(err(PermanentCloudError), T0, C5)
    assert not b.may_create(C5, T0 + s(1)).allowed
    assert b.may_create(M5, T0 + s(1)).allowed


def test_settings_are_configurable() -> None:
    b = CloudBackoff(BackoffSettings(quota_block=5, rate_limit_min=2, rate_limit_max=3))
    b.record_error(err(QuotaExceeded), T0)
    assert b.may_create(M5, T0 + s(5)).allowed
    b.record_error(err(RateLimited), T0)
    assert b.call_allowed_at(T0) == T0 + s(2)
    for _ in range(5):
        b.record_error(err(RateLimited), T0)
    assert b.call_allowed_at(T0) == T0 + s(3)


def test_snapshot_is_json_friendly() -> None:
    import json

    b = CloudBackoff()
    b.record_error(err(CapacityUnavailable), T0, M5)
    b.record_error(err(QuotaGroupExceeded), T0, G4)
    snap = b.snapshot(T0 + s(1))
    assert json.loads(json.dumps(snap))["typesBlocked"] == {"m5.large": (T0 + s(60)).isoformat()}
    assert "g" in snap["quotaGroupsBlocked"]  # type: ignore[operator]
