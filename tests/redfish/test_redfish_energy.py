"""Power readings over Redfish (`redfish.energy`) folded into the energy meter
(`rules.energy`), against the project's fake BMC -- THE ONLY PEER WITH READINGS here:
sushy-tools 2.2 serves no Power, PowerSubsystem or EnvironmentMetrics resource, which
the last test shows as the "no reading" path.

Each variant is read once a minute on a clock the test moves (the fake BMC's and the
client's), and the meter's figures are compared with a hand computation under the
stated rule (within 1 %); the fake's own exact integral of its draw is the check of the
cumulative counter."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from redfish_peers import FakeBmcRunning, StartFakeBmc, SushyEmulator

from nodewarden.redfish import RedfishClient, RedfishHttpError
from nodewarden.redfish.energy import (
    EnergySource,
    NoEnergyReading,
    discover_energy,
    read_energy,
)
from nodewarden.rules.energy import (
    EnergyMeter,
    EnergySample,
    Phase,
    ReadPower,
    enter,
    sample,
    start_meter,
)

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
MAX_GAP = timedelta(minutes=2)
MINUTE = 60.0


class Clock:
    """One clock for the fake BMC (monotonic seconds) and the client (UTC)."""

    def __init__(self) -> None:
        self.seconds = 1000.0

    def monotonic(self) -> float:
        return self.seconds

    def utc(self) -> datetime:
        return T0 + timedelta(seconds=self.seconds - 1000.0)


async def _bmc(fake_bmc: StartFakeBmc, clock: Clock, **options: Any) -> FakeBmcRunning:
    running = await fake_bmc(initial_power="On", **options)
    running.bmc._clock = clock.monotonic  # the test's clock from here on
    for system in running.bmc.systems.values():
        system.energy_at = clock.monotonic()
    return running


class Reader:
    """Reads the fake BMC's power through the client, as the operator does: the
    source discovered once, then one GET a read, folded into a meter."""

    def __init__(self, client: RedfishClient, source: EnergySource, clock: Clock) -> None:
        self.client, self.source, self.clock = client, source, clock
        self.meter: EnergyMeter = start_meter(Phase.IDLE, clock.utc())
        self.failed = 0

    async def read(self, power: ReadPower = "On") -> None:
        try:
            got = await read_energy(self.client, self.source)
        except RedfishHttpError:
            self.failed += 1
            return
        s = EnergySample(
            source=got.source,
            observed_at=got.observed_at,
            power=power,
            watts=got.watts,
            counter_kwh=got.counter_kwh,
        )
        self.meter = sample(self.meter, s, MAX_GAP)

    async def minutes(self, n: int, power: ReadPower = "On", *, first: bool = False) -> None:
        for i in range(n):
            if i or not first:
                self.clock.seconds += MINUTE
            await self.read(power)


async def _reader(running: FakeBmcRunning, clock: Clock) -> tuple[RedfishClient, Reader]:
    client = RedfishClient(running.config(system_id="1"), clock=clock.utc)
    source = await discover_energy(client)
    assert isinstance(source, EnergySource), source
    return client, Reader(client, source, clock)


def _trapezoid(points: list[tuple[float, float]]) -> float:
    """The hand computation: the trapezoid between consecutive (seconds, watts)."""
    return sum((w0 + w1) / 2 * (t1 - t0) for (t0, w0), (t1, w1) in itertools.pairwise(points))


async def test_cumulative_energy_is_the_counters_difference(fake_bmc: StartFakeBmc) -> None:
    clock = Clock()
    running = await _bmc(fake_bmc, clock, power_reading="cumulative")
    client, reader = await _reader(running, clock)
    async with client:
        assert reader.source.kind == "EnvironmentMetrics.EnergykWh"
        start = running.bmc.energy_kwh("1")
        await reader.minutes(11, first=True)
        running.bmc.set_draw("1", 420.0)  # work starts mid-minute: a counter does not care
        clock.seconds += 25
        await reader.minutes(10)
        exact = running.bmc.energy_kwh("1") - start
    meter = reader.meter
    assert meter.method == "Cumulative"
    assert meter.used_joules / 3_600_000 == pytest.approx(exact, rel=0.01)
    assert meter.source.endswith(
        "/redfish/v1/Chassis/1/EnvironmentMetrics#EnvironmentMetrics.EnergykWh"
    )
    assert meter.gaps == 0


async def test_watts_only_are_integrated_by_the_trapezoid(fake_bmc: StartFakeBmc) -> None:
    clock = Clock()
    running = await _bmc(fake_bmc, clock, power_reading="watts", on_watts=150.0)
    client, reader = await _reader(running, clock)
    async with client:
        assert reader.source.kind == "Power"  # Dell-like: PowerConsumedWatts, no kWh
        await reader.minutes(11, first=True)  # 10 minutes at 150 W
        running.bmc.set_draw("1", 390.0)
        await reader.minutes(10)  # the change falls on a read: 150 -> 390 over a minute
    points = [(60.0 * i, 150.0) for i in range(11)] + [
        (600 + 60.0 * i, 390.0) for i in range(1, 11)
    ]
    meter = reader.meter
    assert meter.method == "Integrated"
    assert meter.used_joules == pytest.approx(_trapezoid(points), rel=0.01)
    assert meter.source.endswith("/Chassis/1/Power#Power.PowerControl.PowerConsumedWatts")


async def test_the_newer_environment_metrics_watts(fake_bmc: StartFakeBmc) -> None:
    clock = Clock()
    running = await _bmc(fake_bmc, clock, power_reading="environment", on_watts=210.0)
    client, reader = await _reader(running, clock)
    async with client:
        assert reader.source.kind == "EnvironmentMetrics.PowerWatts"
        await reader.minutes(31, first=True)
    assert reader.meter.used_joules == pytest.approx(210.0 * 1800, rel=0.01)
    assert reader.meter.idle_watts == pytest.approx(210.0)


async def test_null_watts_are_counted_never_integrated(fake_bmc: StartFakeBmc) -> None:
    clock = Clock()
    running = await _bmc(fake_bmc, clock, power_reading="null_watts")
    client, reader = await _reader(running, clock)
    async with client:
        await reader.minutes(5, first=True)
    meter = reader.meter
    assert meter.null_readings == 5 and meter.readings == 5
    assert meter.used_joules == 0 and meter.method == "None"


async def test_a_reading_that_stops_is_a_gap_not_integrated_as_fresh(
    fake_bmc: StartFakeBmc,
) -> None:
    clock = Clock()
    # the reading resource answers 503 from minute 10 to minute 20 (fake clock)
    running = await _bmc(
        fake_bmc, clock, power_reading="watts", on_watts=200.0, reading_stops=(1590.0, 2190.0)
    )
    client, reader = await _reader(running, clock)
    async with client:
        await reader.minutes(10, first=True)  # minutes 0..9
        running.bmc.set_draw("1", 500.0)  # while nobody can read it
        await reader.minutes(10)  # 10..19: every read fails
        await reader.minutes(6)  # 20..25: 500 W again
    meter = reader.meter
    assert reader.failed == 10
    assert meter.gaps == 1 and meter.gap_seconds == pytest.approx(11 * MINUTE)
    # 9 minutes at 200 W and 5 at 500 W; never (200 + 500) / 2 over the 11 stale minutes
    assert meter.used_joules == pytest.approx(200 * 540 + 500 * 300, rel=0.01)


async def test_watts_while_off_are_the_measured_standby_draw(fake_bmc: StartFakeBmc) -> None:
    clock = Clock()
    running = await _bmc(fake_bmc, clock, power_reading="watts", on_watts=160.0, off_watts=11.0)
    client, reader = await _reader(running, clock)
    async with client:
        await reader.minutes(6, first=True)
        running.bmc.set_power("1", "Off")
        reader.meter = enter(reader.meter, Phase.OFF, clock.utc())
        clock.seconds += 20
        await reader.read("Off")  # once per Off period
        clock.seconds += 3600
        running.bmc.set_power("1", "On")
        reader.meter = enter(reader.meter, Phase.BOOT, clock.utc())
        clock.seconds += 30
        await reader.read("On")
    meter = reader.meter
    assert meter.off_watts == 11.0
    assert meter.off_seconds == pytest.approx(3620)
    # 5 minutes at 160 W, Off 3620 s at 11 W (its one reading), 30 s at 160 W after
    hand = 160 * 300 + 11 * 3620 + 160 * 30
    assert meter.used_joules == pytest.approx(hand, rel=0.01)


async def test_a_sushy_tools_node_has_no_reading(sushy: SushyEmulator) -> None:
    async with RedfishClient(sushy.config(system_id=sushy.systems["node-read"])) as client:
        found = await discover_energy(client)
    assert isinstance(found, NoEnergyReading)
    assert "no Power, PowerSubsystem or EnvironmentMetrics" in found.reason
