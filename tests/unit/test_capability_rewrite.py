"""A capability rediscovery that finds the same as before is not a status change."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from nodewarden.policy.facts import CapabilityReading
from nodewarden.power.sensing import _same_capability, rediscovery_delay

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def _refused(at: datetime, why: str = "BMC endpoint not admitted") -> CapabilityReading:
    return CapabilityReading(
        source="resolver", observed_at=at, control_method="Redfish", refusal=why
    )


def test_only_the_time_moved() -> None:
    assert _same_capability(_refused(T0), _refused(T0 + timedelta(seconds=30)))


def test_a_new_finding_is_a_change() -> None:
    later = T0 + timedelta(seconds=30)
    assert not _same_capability(None, _refused(later))
    assert not _same_capability(_refused(T0), _refused(later, "Secret not designated"))
    allowed = CapabilityReading(
        source="redfish", observed_at=later, control_method="Redfish", allowable=("On",)
    )
    assert not _same_capability(_refused(T0), allowed)


def test_a_refused_or_failed_discovery_backs_off_to_the_capability_interval() -> None:
    delays = [rediscovery_delay(n, 600.0) for n in range(7)]
    assert delays == [30.0, 60.0, 120.0, 240.0, 480.0, 600.0, 600.0]
    assert rediscovery_delay(10_000, 600.0) == 600.0
    assert rediscovery_delay(0, 10.0) == 10.0  # never beyond a short capability interval
