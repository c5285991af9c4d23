"""The forecast lever: a compact histogram of the arrivals seen, per node class and hour of
the day, weekday / weekend apart, and the warm nodes it asks for ahead of demand.

The histogram (`Histogram`): for each hour of the day (local time in the forecast's zone)
and day kind, how many such hours were watched (`observed`), and per class how many
containers arrived in them (`arrivals`) and how much of a class node they asked for
(`load`: the sum of each container's share of a node of its class, its largest resource
fraction). Each hour of the day holds at most `HORIZON` watched hours (eight weeks): past
that, its cells are scaled down together (an exponential forgetting that keeps rates and
bounds every number). 2 x 24 cells per class, 2 x 24 observed: the whole histogram fits
the PowerPolicy status (`to_status`, `from_status`).

The forecast (`forecast_want`) for class C at time t: the hour's arrival rate (the larger
of the hour of t and the hour of t + C's boot time, so the capacity is there when the
next hour's demand begins), the arrivals within the boot time as a Poisson count, its
`confidence` quantile K, and ceil(K x the mean share) warm nodes, at most `maxWarmNodes`.
None (no forecast) until `minDays` days have been watched. An hour of a day kind never
watched (the first weekend) borrows the same hour of the other kind until it is, and
says so in its why.
It changes only at hour boundaries and at `bootTime` before them: `next_due`.

A container's class (`container_class`) is the first class, in the policy's order, whose
node the scheduler would run it on (`scheduling.scheduler.qualified_demand`): list the
cheaper classes first. Pure; the live dispatcher and power controller (`fleet.warmth`)
and the simulator's training (`simulate.warmth`) call these same functions.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from statistics import NormalDist
from typing import Literal
from zoneinfo import ZoneInfo

from nodewarden.api.containerdispatch import ContainerResources
from nodewarden.api.warmcapacity import (
    HOURS,
    MAX_COUNT,
    MAX_NODE_CLASSES,
    ClassHistogram,
    ForecastStatus,
    ForecastWake,
    HourlyCounts,
    NodeClass,
    ObservedHours,
)
from nodewarden.rules.warm import LeverWant
from nodewarden.scheduling.instancetypes import (
    Catalogue,
    InstanceTypePolicy,
    effective_requirements,
)
from nodewarden.scheduling.scheduler import qualified_demand
from nodewarden.scheduling.views import ContainerView, NodeView, Phase
from nodewarden.units import parse_duration

Kind = Literal["weekday", "weekend"]
KINDS: tuple[Kind, Kind] = ("weekday", "weekend")
HORIZON: dict[Kind, float] = {"weekday": 40.0, "weekend": 16.0}
"""Watched hours one hour of the day holds at most (eight weeks of each)."""
MIN_OBSERVED = 0.5
"""Watched hours an hour of the day needs before it forecasts."""
BURST_SPAN = timedelta(minutes=5)
BURST_FLOOR = 10
BURST_FACTOR = 4.0
BURST_MEMORY = 10_000
"""An arrival is part of a burst when more than max(BURST_FLOOR, BURST_FACTOR x the
learned rate's expectation) arrivals of its class came within BURST_SPAN (at most
BURST_MEMORY remembered per class)."""
_OTHER: dict[Kind, Kind] = {"weekday": "weekend", "weekend": "weekday"}
_HOUR = timedelta(hours=1)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(slots=True)
class Counts:
    arrivals: list[float] = field(default_factory=lambda: [0.0] * HOURS)
    load: list[float] = field(default_factory=lambda: [0.0] * HOURS)


@dataclass(slots=True)
class Histogram:
    """The arrivals seen, per class, day kind and hour of the day (module docstring)."""

    time_zone: str
    counted_until: datetime
    """Watched up to here (`advance`); arrivals are counted as they are seen."""
    observed: dict[Kind, list[float]] = field(
        default_factory=lambda: {k: [0.0] * HOURS for k in KINDS}
    )
    classes: dict[str, dict[Kind, Counts]] = field(default_factory=dict)
    bursts: dict[str, float] = field(default_factory=dict)
    """Per class: arrivals counted apart as bursts (not forecastable, not in the rate)."""
    recent: dict[str, deque[datetime]] = field(default_factory=dict)
    """Per class: the arrivals of the last `BURST_SPAN` (in memory only)."""

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.time_zone)

    def bucket(self, at: datetime) -> tuple[Kind, int]:
        local = at.astimezone(self.zone)
        return ("weekend" if local.weekday() >= 5 else "weekday"), local.hour

    def advance(self, at: datetime) -> None:
        """The operator watched from `counted_until` to `at`: add the time to each local
        hour it covers (and forget the oldest past `HORIZON`)."""
        t = self.counted_until
        zone = self.zone
        while t < at:
            local = t.astimezone(zone)
            floor = local.replace(minute=0, second=0, microsecond=0)
            step_end = (floor + _HOUR).astimezone(UTC)
            if step_end <= t:
                step_end = t + _HOUR
            end = min(at, step_end)
            kind: Kind = "weekend" if local.weekday() >= 5 else "weekday"
            self._watched(kind, local.hour, (end - t) / _HOUR)
            t = end
        self.counted_until = max(self.counted_until, at)

    def _watched(self, kind: Kind, hour: int, hours: float) -> None:
        observed = self.observed[kind]
        observed[hour] += hours
        if observed[hour] <= HORIZON[kind]:
            return
        factor = HORIZON[kind] / observed[hour]
        observed[hour] = HORIZON[kind]
        for counts in self.classes.values():
            c = counts[kind]
            c.arrivals[hour] *= factor
            c.load[hour] *= factor

    def arrive(self, node_class: str, share: float, at: datetime) -> bool:
        """A container of `node_class` arrived at `at`, asking `share` of a class node.
        Returns False when it was part of a burst (`is_burst`: counted apart, not in the
        rate)."""
        counts = self.classes.get(node_class)
        if counts is None:
            if len(self.classes) >= MAX_NODE_CLASSES:
                return False
            counts = self.classes[node_class] = {k: Counts() for k in KINDS}
        kind, hour = self.bucket(at)
        if self.is_burst(node_class, kind, hour, at):
            self.bursts[node_class] = min(MAX_COUNT, self.bursts.get(node_class, 0.0) + 1.0)
            return False
        c = counts[kind]
        c.arrivals[hour] = min(MAX_COUNT, c.arrivals[hour] + 1.0)
        c.load[hour] = min(MAX_COUNT, c.load[hour] + share)
        return True

    def is_burst(self, node_class: str, kind: Kind, hour: int, at: datetime) -> bool:
        """Whether an arrival at `at` is part of a burst: the class's arrivals within the
        last `BURST_SPAN` reach `BURST_FLOOR`, or `BURST_FACTOR` times what the hour's
        rate learned so far expects in that span (kept in memory only)."""
        recent = self.recent.setdefault(node_class, deque())
        recent.append(at)
        while recent and (recent[0] <= at - BURST_SPAN or len(recent) > BURST_MEMORY):
            recent.popleft()
        rate = self.rate(node_class, kind, hour)
        expected = (rate[0] if rate is not None else 0.0) * (BURST_SPAN / _HOUR)
        return len(recent) > max(BURST_FLOOR, BURST_FACTOR * expected)

    @property
    def days_observed(self) -> float:
        return sum(sum(v) for v in self.observed.values()) / HOURS

    def rate(self, node_class: str, kind: Kind, hour: int) -> tuple[float, float] | None:
        """(arrivals per hour, mean share of a node) of a class in one hour of the day
        (None: that hour was not watched long enough)."""
        watched = self.observed[kind][hour]
        if watched < MIN_OBSERVED:
            return None
        counts = self.classes.get(node_class)
        if counts is None:
            return 0.0, 0.0
        c = counts[kind]
        arrivals = c.arrivals[hour]
        share = c.load[hour] / arrivals if arrivals > 0 else 0.0
        return arrivals / watched, share


def fresh(time_zone: str, at: datetime) -> Histogram:
    return Histogram(time_zone=time_zone, counted_until=at)


# -- the forecast -------------------------------------------------------------------------


def poisson_quantile(mean: float, q: float) -> int:
    """The smallest k with P(N <= k) >= q for N ~ Poisson(mean) (normal approximation
    with a continuity correction above a mean of 50)."""
    if mean <= 0:
        return 0
    if mean > 50:
        return math.ceil(mean + NormalDist().inv_cdf(q) * math.sqrt(mean) - 0.5)
    k, p = 0, math.exp(-mean)
    cdf = p
    while cdf < q and k < 10_000:
        k += 1
        p *= mean / k
        cdf += p
    return k


def covered(settings: ForecastWake, classes: Sequence[NodeClass]) -> list[NodeClass]:
    """The classes the forecast covers (its `classes`, or every class)."""
    if not settings.classes:
        return list(classes)
    wanted = set(settings.classes)
    return [c for c in classes if c.name in wanted]


def forecast_want(
    h: Histogram, c: NodeClass, at: datetime, settings: ForecastWake
) -> LeverWant | None:
    """What the forecast wants of class `c` at `at` (module docstring; None: no forecast)."""
    if h.days_observed < settings.min_days:
        return None
    boot = parse_duration(c.boot_time)
    best: tuple[float, float, Kind, int, bool] | None = None
    for t in (at, at + boot):
        kind, hour = h.bucket(t)
        rate, borrowed = h.rate(c.name, kind, hour), False
        if rate is None:  # never watched: the other day kind's same hour, until it is
            rate, borrowed = h.rate(c.name, _OTHER[kind], hour), True
        if rate is not None and (best is None or rate[0] > best[0]):
            best = (rate[0], rate[1], _OTHER[kind] if borrowed else kind, hour, borrowed)
    if best is None:
        return None
    per_hour, share, kind, hour, borrowed = best
    mean = per_hour * boot.total_seconds() / 3600.0
    k = poisson_quantile(mean, settings.confidence)
    nodes = min(settings.max_warm_nodes, math.ceil(k * share - 1e-9))
    source = f"{kind} {hour:02d}:00 {h.time_zone}" + (
        f", borrowed: no {_OTHER[kind]} {hour:02d}:00 watched yet" if borrowed else ""
    )
    why = (
        f"forecast: {per_hour:.1f} arrivals/h ({source}); "
        f"p{settings.confidence * 100:g} within bootTime {c.boot_time}: {k} "
        f"(~{k * share:.2f} nodes)"
    )
    return LeverWant(nodes, why, round(mean * share, 3))


def next_due(h: Histogram, classes: Iterable[NodeClass], after: datetime) -> datetime | None:
    """The next instant a forecast may change: an hour boundary (local time), or a
    class's boot time before one."""
    local = after.astimezone(h.zone)
    floor = local.replace(minute=0, second=0, microsecond=0)
    boundaries = [(floor + n * _HOUR).astimezone(UTC) for n in range(1, 4)]
    found: list[datetime] = []
    for c in classes:
        boot = parse_duration(c.boot_time)
        for b in boundaries:
            for t in (b - boot, b):
                if t > after:
                    found.append(t)
    return min(found) if found else None


# -- a container's class ------------------------------------------------------------------


def container_class(
    resources: ContainerResources,
    views: Sequence[tuple[str, NodeView]],
    catalogue: Catalogue,
    type_policy: InstanceTypePolicy,
) -> tuple[str, float] | None:
    """The first (class, its node) of `views` whose node the scheduler would run the
    container on, and the container's share of that node (its largest resource
    fraction); None: no class fits it."""
    probe = ContainerView("forecast-probe", Phase.QUEUED, 1, _EPOCH, resources)
    for name, view in views:
        if not qualified_demand(view, [probe], catalogue, type_policy):
            continue
        need = effective_requirements(resources, type_policy)
        cap = view.capacity
        fractions = [need.vcpus / cap.vcpus if cap.vcpus else 1.0]
        if cap.ram:
            fractions.append(need.ram / cap.ram)
        if need.gpus and cap.gpus:
            fractions.append(need.gpus / cap.gpus)
        return name, min(1.0, max(fractions))
    return None


# -- status -------------------------------------------------------------------------------


def to_status(h: Histogram, settings: ForecastWake) -> ForecastStatus:
    """The histogram as PowerPolicy status (bounded: 24 cells a list, 16 classes)."""
    days = h.days_observed
    learning = days < settings.min_days
    message = (
        f"{days:.1f} of {settings.min_days} days observed: no forecast yet"
        if learning
        else f"forecasting from {days:.1f} days observed"
    )
    return ForecastStatus(
        state="Learning" if learning else "Forecasting",
        message=message,
        time_zone=h.time_zone,
        days_observed=round(days, 3),
        counted_until=h.counted_until,
        observed_hours=ObservedHours(
            weekday=_cells(h.observed["weekday"]), weekend=_cells(h.observed["weekend"])
        ),
        classes=[
            ClassHistogram(
                name=name,
                weekday=HourlyCounts(
                    arrivals=_cells(c["weekday"].arrivals), load=_cells(c["weekday"].load)
                ),
                weekend=HourlyCounts(
                    arrivals=_cells(c["weekend"].arrivals), load=_cells(c["weekend"].load)
                ),
            )
            for name, c in sorted(h.classes.items())[:MAX_NODE_CLASSES]
        ],
    )


def _cells(values: list[float]) -> list[float]:
    return [round(min(MAX_COUNT, max(0.0, v)), 3) for v in values[:HOURS]]


def from_status(status: ForecastStatus, time_zone: str) -> Histogram | None:
    """The histogram stored in a PowerPolicy status (None: counted in another zone, so
    its hours mean something else: start afresh)."""
    if status.time_zone != time_zone:
        return None

    def full(values: list[float]) -> list[float]:
        return [*values[:HOURS], *[0.0] * (HOURS - len(values))]

    h = Histogram(time_zone=time_zone, counted_until=status.counted_until)
    h.observed = {
        "weekday": full(status.observed_hours.weekday),
        "weekend": full(status.observed_hours.weekend),
    }
    for entry in status.classes[:MAX_NODE_CLASSES]:
        h.classes[entry.name] = {
            "weekday": Counts(full(entry.weekday.arrivals), full(entry.weekday.load)),
            "weekend": Counts(full(entry.weekend.arrivals), full(entry.weekend.load)),
        }
    return h
