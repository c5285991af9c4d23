"""The energy rules (`rules.energy`, `rules.savings`), against hand computations: the
trapezoid between fresh readings, gaps never integrated, a cumulative counter, null
readings, the Off stretch at its reading, measured vs configured draws, the never-off
saving, "today" in a time zone, and VM hours avoided."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from nodewarden.rules.energy import (
    EnergyMeter,
    EnergySample,
    Phase,
    ReadPower,
    energy_read_due,
    enter,
    sample,
    start_meter,
)
from nodewarden.rules.savings import (
    EnergyClass,
    NodeEnergy,
    expected_saving,
    measured_saving,
    node_energy,
    policy_energy,
    saved_today_by_class,
    vm_count,
)

T0 = datetime(2026, 3, 1, 10, 0, tzinfo=UTC)
GAP = timedelta(minutes=2)
KWH = 3_600_000.0
CLASS = EnergyClass(
    idle_watts=150.0, off_watts=5.0, boot_energy_wh=10.0, shutdown_energy_wh=2.0, price_per_kwh=0.3
)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def reading(
    t: float, watts: float | None = None, kwh: float | None = None, power: ReadPower = "On"
) -> EnergySample:
    return EnergySample(
        source="fake#PowerWatts", observed_at=at(t), power=power, watts=watts, counter_kwh=kwh
    )


def feed(meter: EnergyMeter, samples: list[EnergySample]) -> EnergyMeter:
    for s in samples:
        meter = sample(meter, s, GAP)
    return meter


def test_the_trapezoid_between_fresh_readings_matches_a_hand_computation() -> None:
    # a draw rising linearly from 100 W to 400 W over 30 minutes, read every minute:
    # the trapezoid is exact for a linear draw -> 250 W x 1800 s
    meter = feed(
        start_meter(Phase.IDLE, T0),
        [reading(60 * i, watts=100 + 300 * i / 30) for i in range(31)],
    )
    assert meter.method == "Integrated"
    assert meter.used_joules == pytest.approx(250 * 1800, rel=1e-9)
    assert meter.gaps == 0 and meter.readings == 31
    assert meter.idle_watts == pytest.approx(250, rel=1e-9)
    assert meter.source == "fake#PowerWatts"


def test_a_reading_that_stops_is_a_gap_never_integrated() -> None:
    # 200 W read every minute; the reading stops for 10 minutes (after t=600), then
    # resumes at 300 W: the 11-minute stretch is a gap, not (200+300)/2 x 660 s
    samples = [reading(60 * i, watts=200) for i in range(11)]
    samples += [reading(1260 + 60 * i, watts=300) for i in range(6)]
    meter = feed(start_meter(Phase.BUSY, T0), samples)
    assert meter.gaps == 1
    assert meter.gap_seconds == pytest.approx(660)
    assert meter.used_joules == pytest.approx(200 * 600 + 300 * 300, rel=1e-9)


def test_null_watts_carry_nothing_and_leave_a_gap_if_too_long() -> None:
    samples = [reading(0, 100), reading(60, None), reading(120, None), reading(180, 100)]
    meter = feed(start_meter(Phase.IDLE, T0), samples)
    assert meter.null_readings == 2
    assert meter.used_joules == 0 and meter.gaps == 1 and meter.gap_seconds == 180
    assert meter.method == "Integrated"


def test_a_cumulative_counter_counts_across_gaps_and_a_reset_is_not_negative() -> None:
    samples = [reading(0, kwh=10.0), reading(60, kwh=10.01), reading(3660, kwh=10.5)]
    samples += [reading(3720, kwh=0.2), reading(3780, kwh=0.21)]  # the BMC reset its counter
    meter = feed(start_meter(Phase.BUSY, T0), samples)
    assert meter.method == "Cumulative"
    assert meter.used_joules == pytest.approx((0.5 + 0.01) * KWH, rel=1e-9)
    assert meter.gaps == 1 and meter.gap_seconds == 60


def test_the_off_stretch_counts_at_its_one_reading_and_time_off_is_exact() -> None:
    # idle at 150 W for 10 min; shut down at t=600 (Off at t=630); one Off reading of
    # 5 W at t=660; woken at t=4230 (boot), On at 150 W read at t=4260
    meter = start_meter(Phase.IDLE, T0)
    meter = feed(meter, [reading(60 * i, 150) for i in range(11)])
    meter = enter(meter, Phase.SHUTDOWN, at(600))
    meter = enter(meter, Phase.OFF, at(630))
    meter = sample(meter, reading(660, 5.0, power="Off"), GAP)
    assert energy_read_due(meter, "Off", at(900), timedelta(minutes=1)) is False
    meter = enter(meter, Phase.BOOT, at(4230))
    meter = sample(meter, reading(4260, 150.0), GAP)
    # 150 W x 600 s + the shutdown stretch 600..630 at 150 W + Off 3600 s x 5 W + the
    # boot stretch 4230..4260 at 150 W
    expected = 150 * 600 + 150 * 30 + 5 * 3600 + 150 * 30
    assert meter.used_joules == pytest.approx(expected, rel=0.01)
    assert meter.off_seconds == 3600 and meter.off_periods == 1
    assert meter.boots == 1 and meter.shutdowns == 1
    assert meter.off_watts == 5.0 and meter.gaps == 0


def test_watts_while_off_are_the_standby_draw_and_the_off_stretch_grows_live() -> None:
    meter = enter(start_meter(Phase.IDLE, T0), Phase.OFF, T0)
    meter = sample(meter, reading(30, 12.0, power="Off"), GAP)
    assert meter.used_joules_at(at(3600)) == pytest.approx(12.0 * 3600)
    assert meter.off_seconds_at(at(3600)) == 3600


def test_reads_are_due_once_a_minute_while_on_and_once_per_off_period() -> None:
    minute = timedelta(minutes=1)
    meter = start_meter(Phase.IDLE, T0)
    assert energy_read_due(meter, "On", T0, minute)
    meter = sample(meter, reading(0, 100), GAP)
    assert not energy_read_due(meter, "On", at(59), minute)
    assert energy_read_due(meter, "On", at(60), minute)
    assert not energy_read_due(meter, "Other", at(600), minute)
    meter = enter(meter, Phase.OFF, at(100))
    assert energy_read_due(meter, "Off", at(110), minute)
    meter = sample(meter, reading(110, 5, power="Off"), GAP)
    assert not energy_read_due(meter, "Off", at(10_000), minute)
    meter = enter(enter(meter, Phase.BOOT, at(20_000)), Phase.OFF, at(20_100))
    assert energy_read_due(meter, "Off", at(20_110), minute)  # a new Off period


def test_the_saving_uses_configured_draws_until_measured_and_says_so() -> None:
    idle_min = timedelta(minutes=10)
    meter = start_meter(Phase.IDLE, T0)
    meter = feed(meter, [reading(60 * i, 120) for i in range(6)])  # 5 idle minutes
    meter = enter(meter, Phase.OFF, at(300))
    figures = node_energy(meter, CLASS, idle_min, at(300 + 3600), UTC)
    assert figures.idle_basis == "Configured" and figures.off_basis == "Configured"
    assert figures.saved_basis == "Configured"
    # 3600 s x (150 - 5) W - one shutdown of 2 Wh
    assert figures.saved_kwh == pytest.approx((3600 * 145 - 2 * 3600) / KWH, rel=1e-9)
    assert figures.money_saved == pytest.approx(figures.saved_kwh * 0.3)
    meter = sample(meter, reading(330, 4.0, power="Off"), GAP)
    meter = enter(meter, Phase.IDLE, at(3900))
    meter = feed(meter, [reading(3900 + 60 * i, 118) for i in range(12)])
    figures = node_energy(meter, CLASS, idle_min, at(3900 + 660), UTC)
    assert figures.idle_basis == "Measured" and figures.off_basis == "Measured"
    assert figures.saved_basis == "Measured"
    # measured idle: 5 min at 120 W + 11 min at 118 W (the boot stretch is not idle)
    idle = (120 * 300 + 118 * 660) / 960
    assert figures.idle_watts == pytest.approx(idle, rel=1e-9)
    want = 3600 * (idle - 4.0) - 10 * 3600 - 2 * 3600
    assert figures.saved_kwh == pytest.approx(want / KWH, rel=0.01)
    assert figures.off_seconds == 3600 and figures.boots == 1 and figures.shutdowns == 1


def test_today_is_counted_from_local_midnight_in_the_policys_time_zone() -> None:
    berlin = ZoneInfo("Europe/Berlin")
    # off from 22:00 UTC (23:00 Berlin) until 01:00 UTC (02:00 Berlin next day)
    start = datetime(2026, 3, 1, 22, 0, tzinfo=UTC)
    meter = enter(start_meter(Phase.IDLE, start - timedelta(hours=1)), Phase.OFF, start)
    now = datetime(2026, 3, 2, 1, 0, tzinfo=UTC)
    berlin_day = node_energy(meter, CLASS, timedelta(minutes=10), now, berlin)
    utc_day = node_energy(meter, CLASS, timedelta(minutes=10), now, UTC)
    # Berlin's day began at 23:00 UTC: 2 h off today; UTC's at 00:00: 1 h; both 3 h in all
    assert berlin_day.off_seconds == utc_day.off_seconds == 3 * 3600
    assert berlin_day.saved_kwh_today == pytest.approx(2 * 3600 * 145 / KWH)
    assert utc_day.saved_kwh_today == pytest.approx(1 * 3600 * 145 / KWH)
    assert berlin_day.saved_kwh == pytest.approx((3 * 3600 * 145 - 2 * 3600) / KWH)


def test_vm_hours_avoided_are_the_running_peak_minus_the_running_vms() -> None:
    held = vm_count(None, 2, T0, UTC)  # two VMs from 10:00
    held = vm_count(held, 1, at(3600), UTC)  # one destroyed at 11:00
    held = vm_count(held, 0, at(5400), UTC)  # the other at 11:30
    held = vm_count(held, 1, at(9000), UTC)  # a new one at 12:30
    # never-off keeps 2: avoided 1 h x 1 + 1 h x 2 + 0.5 h x 1 until 13:00
    assert held.avoided_at(at(10_800)) / 3600 == pytest.approx(0.5 + 2.0 + 0.5)
    sums = policy_energy([], {"m5.large": held}, {"m5.large": 0.1}, at(10_800), UTC)
    assert sums.vm_hours_avoided == pytest.approx(3.0)
    assert sums.money_saved == pytest.approx(0.3)
    assert sums.vm_hours_avoided_today == pytest.approx(3.0)


def test_the_record_evidence_expected_from_past_off_periods_and_measured_after() -> None:
    idle_min = timedelta(minutes=10)
    none = expected_saving(None, CLASS, idle_min, timedelta(minutes=30))
    assert none.kind == "Expected" and none.off_seconds == 1800
    assert "minOff" in none.off_seconds_basis
    assert none.saved_kwh == pytest.approx((1800 * 145 - 12 * 3600) / KWH, abs=1e-4)
    meter = enter(start_meter(Phase.IDLE, T0), Phase.OFF, T0)
    meter = enter(meter, Phase.BOOT, at(7200))
    meter = enter(meter, Phase.OFF, at(8000))
    meter = enter(meter, Phase.BOOT, at(8000 + 3600))
    mean = expected_saving(meter, CLASS, idle_min, timedelta(minutes=30))
    assert mean.off_seconds == pytest.approx((7200 + 3600) / 2)
    done = measured_saving(3600, meter, CLASS, idle_min)
    assert done.kind == "Measured"
    assert done.saved_kwh == pytest.approx((3600 * 145 - 12 * 3600) / KWH, abs=1e-4)


def test_saved_today_is_split_by_node_class_and_sums_to_the_policy() -> None:
    start = datetime(2026, 3, 2, 8, 0, tzinfo=UTC)
    now = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)
    idle_min = timedelta(minutes=10)

    def off_since(at: datetime) -> NodeEnergy:
        meter = enter(start_meter(Phase.IDLE, at - timedelta(hours=1)), Phase.OFF, at)
        return node_energy(meter, CLASS, idle_min, now, UTC)

    nodes = [
        ("a10", off_since(start)),  # 2 h off today
        ("a10", off_since(start + timedelta(hours=1))),  # 1 h
        (None, off_since(start)),  # in no class: 2 h
    ]
    split = saved_today_by_class(nodes, ["a10", "l4"], now, UTC, "(all)")
    by = {c.name: c for c in split}
    assert list(by) == ["a10", "l4", "(all)"]
    assert by["a10"].saved_kwh_today == pytest.approx(3 * 3600 * 145 / KWH)
    assert by["l4"].saved_kwh_today == 0.0
    assert by["(all)"].saved_kwh_today == pytest.approx(2 * 3600 * 145 / KWH)
    assert by["a10"].money_saved_today == pytest.approx(
        by["a10"].saved_kwh_today * CLASS.price_per_kwh
    )
    sums = policy_energy([n for _, n in nodes], {}, {}, now, UTC)
    assert sum(c.saved_kwh_today for c in split) == pytest.approx(sums.saved_kwh_today)
    # the next day, yesterday's figures of a node not written since count nothing today
    later = saved_today_by_class(nodes, ["a10"], now + timedelta(days=1), UTC, "(all)")
    assert all(c.saved_kwh_today == 0.0 for c in later)
