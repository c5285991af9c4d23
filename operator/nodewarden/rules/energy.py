"""One node's energy from its BMC readings: the meter, and when to read. Pure.

    Phase.of(state)                          what the node does, from its power state
    EnergySample                             one reading: watts and/or a cumulative kWh counter
    EnergyMeter                              the node's running figures (WorkerNode status.energy.meter)
    start_meter(phase, at)                   a meter that begins now
    sample(meter, s, max_gap)  -> meter      a reading folded in
    enter(meter, phase, at)    -> meter      the node moved to another phase
    energy_read_due(meter, power, now, interval) -> bool

The rule (docs/energy.md), in order of preference:

1. **Cumulative**: the BMC offers a cumulative energy counter (Redfish `EnergykWh`): the
   energy between two readings is the counter's difference, whatever the time between
   them (a counter that goes back -- a BMC reset -- is a gap, never a negative energy).
2. **Integrated**: watts only. Between two fresh readings (at most `max_gap` apart: the
   policy's telemetryMaxAge) the trapezoid; a longer stretch is *not* integrated, it is
   counted as a gap (`gap_seconds`, `gaps`): a stale reading never stands in for a fresh
   one. A reading whose watts are null (Dell's `LastPowerOutputWatts`) carries nothing and
   is counted (`null_readings`). While the node is Off the BMC is read once per Off
   period (standby draw is flat): the Off stretch counts at that reading's watts.

Every reading's source is kept (`source`). The phases' times come from the power state
machine (when the node entered each phase), not from the readings: time off is exact,
whatever the BMC says. The measured idle draw is the mean draw over integrated stretches
spent idle (`idle_joules / idle_seconds`); the measured off draw the mean of the Off
readings. What those measurements mean for a saving is `rules.savings`.
"""

from __future__ import annotations

from datetime import date, datetime, timedelta, tzinfo
from enum import StrEnum
from typing import Literal

from pydantic import AwareDatetime, Field

from nodewarden.policy.base import CoreModel
from nodewarden.policy.state import PowerState

JOULES_PER_KWH = 3_600_000.0
EnergyMethod = Literal["Cumulative", "Integrated", "None"]
ReadPower = Literal["On", "Off", "Other"]


class Phase(StrEnum):
    """What the node is doing, as far as its draw goes."""

    OFF = "Off"
    IDLE = "Idle"
    BUSY = "Busy"
    BOOT = "Boot"
    SHUTDOWN = "Shutdown"
    OTHER = "Other"
    """Verifying, draining, blocked: on, neither idle nor busy for certain."""

    @classmethod
    def of(cls, state: PowerState) -> Phase:
        return _PHASE_OF.get(state, cls.OTHER)


_PHASE_OF = {
    PowerState.OFF: Phase.OFF,
    PowerState.ON_IDLE: Phase.IDLE,
    PowerState.ACTIVE: Phase.BUSY,
    PowerState.WAKING: Phase.BOOT,
    PowerState.SHUTTING_DOWN: Phase.SHUTDOWN,
}


class EnergySample(CoreModel):
    """One energy reading of a node's BMC (an adapter fact converted by the shell)."""

    source: str = Field(min_length=1, max_length=512)
    observed_at: AwareDatetime
    power: ReadPower = Field(description="The power state the BMC reported with it.")
    watts: float | None = Field(default=None, ge=0, le=1_000_000)
    counter_kwh: float | None = Field(
        default=None, ge=0, le=1e12, description="A cumulative energy counter, if offered."
    )

    @property
    def empty(self) -> bool:
        return self.watts is None and self.counter_kwh is None


class MeterPoint(CoreModel):
    """The last usable reading: where the next stretch starts."""

    at: AwareDatetime
    power: ReadPower
    phase: Phase
    watts: float | None = None
    counter_kwh: float | None = None


class EnergyMeter(CoreModel):
    """A node's running energy figures since `since` (persisted: a restart resumes it)."""

    since: AwareDatetime
    phase: Phase
    phase_since: AwareDatetime
    method: EnergyMethod = "None"
    source: str | None = Field(default=None, max_length=512)
    last: MeterPoint | None = None
    used_joules: float = Field(default=0.0, ge=0)
    gap_seconds: float = Field(default=0.0, ge=0)
    gaps: int = Field(default=0, ge=0)
    readings: int = Field(default=0, ge=0)
    null_readings: int = Field(default=0, ge=0)
    idle_joules: float = Field(default=0.0, ge=0)
    idle_seconds: float = Field(default=0.0, ge=0)
    off_watts_sum: float = Field(default=0.0, ge=0)
    off_readings: int = Field(default=0, ge=0)
    off_watts_now: float | None = Field(
        default=None, ge=0, description="The reading of the Off period under way."
    )
    off_seconds: float = Field(default=0.0, ge=0, description="Closed Off stretches.")
    off_periods: int = Field(default=0, ge=0)
    boots: int = Field(default=0, ge=0)
    shutdowns: int = Field(default=0, ge=0)
    day: date | None = None
    """The local day (policy time zone) the day-start values below belong to."""
    day_off_seconds: float = 0.0
    day_boots: int = 0
    day_shutdowns: int = 0
    day_used_joules: float = 0.0

    @property
    def off_watts(self) -> float | None:
        """The measured off (standby) draw: the mean of the Off readings."""
        if self.off_readings == 0:
            return None
        return self.off_watts_sum / self.off_readings

    @property
    def idle_watts(self) -> float | None:
        """The measured idle draw: the mean over integrated idle stretches."""
        return self.idle_joules / self.idle_seconds if self.idle_seconds > 0 else None

    def off_seconds_at(self, now: datetime) -> float:
        """Time off until `now`: the closed Off stretches and the one under way."""
        if self.phase is Phase.OFF and now > self.phase_since:
            return self.off_seconds + (now - self.phase_since).total_seconds()
        return self.off_seconds

    def used_joules_at(self, now: datetime) -> float:
        """Energy used until `now` (the Off stretch under way at its reading's watts)."""
        if self.method == "Integrated" and self.phase is Phase.OFF and now > self.phase_since:
            watts = self._off_watts_for_stretch()
            if watts is not None:
                return self.used_joules + watts * (now - self.phase_since).total_seconds()
        return self.used_joules

    def _off_watts_for_stretch(self) -> float | None:
        return self.off_watts_now if self.off_watts_now is not None else self.off_watts


def start_meter(phase: Phase, at: datetime) -> EnergyMeter:
    """A meter that begins at `at` with the node in `phase`."""
    return EnergyMeter(since=at, phase=phase, phase_since=at)


def sample(meter: EnergyMeter, s: EnergySample, max_gap: timedelta) -> EnergyMeter:
    """`meter` with reading `s` folded in (see the module docstring)."""
    update: dict[str, object] = {"readings": meter.readings + 1, "source": s.source}
    if s.empty:
        update["null_readings"] = meter.null_readings + 1
        return meter.model_copy(update=update)
    last = meter.last
    if last is not None and s.observed_at <= last.at:
        return meter  # an older reading than the one held (out of order): nothing new
    if s.power == "Off" and s.watts is not None:
        update["off_watts_sum"] = meter.off_watts_sum + s.watts
        update["off_readings"] = meter.off_readings + 1
        if meter.phase is Phase.OFF:
            update["off_watts_now"] = s.watts
    method: EnergyMethod = "Cumulative" if s.counter_kwh is not None else "Integrated"
    update["method"] = method
    if last is not None:
        update.update(_stretch(meter, last, s, max_gap))
    update["last"] = MeterPoint(
        at=s.observed_at, power=s.power, phase=meter.phase, watts=s.watts, counter_kwh=s.counter_kwh
    )
    return meter.model_copy(update=update)


def _stretch(
    meter: EnergyMeter, last: MeterPoint, s: EnergySample, max_gap: timedelta
) -> dict[str, object]:
    """The energy between `last` and `s`, or a gap."""
    out: dict[str, object] = {}
    dt = (s.observed_at - last.at).total_seconds()
    idle = last.phase is Phase.IDLE and meter.phase is Phase.IDLE and meter.phase_since <= last.at
    gap: dict[str, object] = {"gap_seconds": meter.gap_seconds + dt, "gaps": meter.gaps + 1}
    if s.counter_kwh is not None and last.counter_kwh is not None:
        delta = (s.counter_kwh - last.counter_kwh) * JOULES_PER_KWH
        if delta < 0:
            return gap  # the counter went back (a BMC reset): unknown, never negative
        out["used_joules"] = meter.used_joules + delta
        if idle and dt <= max_gap.total_seconds():
            out["idle_joules"] = meter.idle_joules + delta
            out["idle_seconds"] = meter.idle_seconds + dt
        return out
    if s.watts is None or last.watts is None:
        return gap  # counter then watts (or back): the stretch has no rule; reported
    if last.power == "Off":
        # the Off stretch is counted at its reading (`enter`); what follows it, from the
        # node leaving Off to this reading, at this reading's watts if short enough
        on = (s.observed_at - max(last.at, meter.phase_since)).total_seconds()
        if meter.phase is Phase.OFF or on <= 0:
            return out
        if on > max_gap.total_seconds():
            return {"gap_seconds": meter.gap_seconds + on, "gaps": meter.gaps + 1}
        out["used_joules"] = meter.used_joules + s.watts * on
        return out
    if dt > max_gap.total_seconds():
        return gap
    joules = (last.watts + s.watts) / 2 * dt
    if meter.phase is Phase.OFF and last.at <= meter.phase_since < s.observed_at:
        # the node went Off inside the stretch: the part before at the last reading's
        # draw, the part after counts with the Off stretch
        joules = last.watts * (meter.phase_since - last.at).total_seconds()
    out["used_joules"] = meter.used_joules + joules
    if idle:
        out["idle_joules"] = meter.idle_joules + joules
        out["idle_seconds"] = meter.idle_seconds + dt
    return out


def enter(meter: EnergyMeter, phase: Phase, at: datetime) -> EnergyMeter:
    """`meter` with the node in `phase` from `at` (a power state change)."""
    if phase is meter.phase:
        return meter
    at = max(at, meter.phase_since)
    update: dict[str, object] = {"phase": phase, "phase_since": at}
    was_off = meter.phase is Phase.OFF
    if was_off:
        stretch = (at - meter.phase_since).total_seconds()
        update["off_seconds"] = meter.off_seconds + stretch
        update["boots"] = meter.boots + 1
        update["off_watts_now"] = None
        watts = meter._off_watts_for_stretch()
        if meter.method == "Integrated" and watts is not None:
            update["used_joules"] = meter.used_joules + watts * stretch
    if phase is Phase.OFF:
        update["off_periods"] = meter.off_periods + 1
        if meter.phase is not Phase.OTHER:  # not a verification finding it Off
            update["shutdowns"] = meter.shutdowns + 1
    return meter.model_copy(update=update)


def energy_read_due(
    meter: EnergyMeter | None, power: ReadPower, now: datetime, interval: timedelta
) -> bool:
    """Whether the node's energy is read now: at most once per `interval` while On, once
    per Off period while Off (its first read after the node went Off), never while the
    power is changing or unknown."""
    last = meter.last if meter is not None else None
    if power == "On":
        return last is None or now - last.at >= interval
    if power == "Off":
        if meter is None or last is None:
            return True
        return last.power != "Off" or (meter.phase is Phase.OFF and last.at < meter.phase_since)
    return False


def roll_day(meter: EnergyMeter, now: datetime, zone: tzinfo) -> EnergyMeter:
    """`meter` with its day-start values for the local day of `now` in `zone` (the
    values at that day's local midnight; unchanged within the day)."""
    today = now.astimezone(zone).date()
    if meter.day == today:
        return meter
    midnight = local_midnight(now, zone)
    return meter.model_copy(
        update={
            "day": today,
            "day_off_seconds": meter.off_seconds_at(max(midnight, meter.since)),
            "day_boots": meter.boots,
            "day_shutdowns": meter.shutdowns,
            "day_used_joules": meter.used_joules_at(max(midnight, meter.since)),
        }
    )


def local_midnight(now: datetime, zone: tzinfo) -> datetime:
    """The start of the local day of `now` in `zone` (as an aware time)."""
    local = now.astimezone(zone)
    start = datetime(local.year, local.month, local.day, tzinfo=zone)
    return start.astimezone(now.tzinfo)
