"""Warm capacity in a PowerPolicy: node classes, warm windows and forecast wake (spec), and
the learned forecast histogram and the levers' targets (status).

* `NodeClass`: a named set of WorkerNodes the levers count together (a cloud instance
  type, or side nodes by GPU model and name prefix), with the time a node of the class
  takes from a wake or create to ready (how far ahead the forecast looks).
* `WarmCapacity`: windows (weekdays, time of day, an IANA time zone) in which at least
  `minWarm` nodes of a class are kept on, idle and open for work.
* `ForecastWake`: a per-hour-of-day forecast of the arrivals of each class, split weekday
  / weekend, learned from the containers the operator has seen; warm capacity ahead of
  the demand it expects within a class's boot time.

Each lever has a mode (Off / Shadow / On). The pure rules are `rules.warm` (classes,
windows, targets) and `rules.forecast` (the histogram and the forecast); `warm_problems`
names what the CRD's schema cannot check (time zones, references between lists).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, ClassVar, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import Field

from nodewarden.api.base import DNS_LABEL_PATTERN, StatusModel
from nodewarden.api.base import ApiModel as _Model
from nodewarden.units import Duration

LeverMode = Literal["Off", "Shadow", "On"]
Weekday = Literal["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]
WEEKDAYS: tuple[Weekday, ...] = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
TIME_OF_DAY_PATTERN = r"^(([01][0-9]|2[0-3]):[0-5][0-9]|24:00)$"
TIME_ZONE_PATTERN = r"^[A-Za-z0-9_+\-]+(/[A-Za-z0-9_+\-]+)*$"
MAX_NODE_CLASSES = 16
MAX_WINDOWS = 32
HOURS = 24
MAX_COUNT = 1e12
"""Upper bound of a histogram cell (the histogram decays long before: `rules.forecast`)."""
ClassRef = Annotated[str, Field(min_length=1, max_length=63, pattern=DNS_LABEL_PATTERN)]
"""A node class's (or a window's) name: a DNS label."""


class NodeClass(_Model):
    """A set of WorkerNodes that warm capacity is counted and kept for. A node belongs to
    the first class in `spec.nodeClasses` that matches it."""

    cel_rules: ClassVar[list[dict[str, str]]] = [
        {
            "rule": "self.nodeType != 'CloudVM' || has(self.instanceType)",
            "message": "a CloudVM node class names its instanceType (the type pre-created)",
            "fieldPath": ".instanceType",
        },
        {
            "rule": "self.nodeType != 'SideNode' || !has(self.instanceType)",
            "message": "a SideNode class has no instanceType; select by gpuModel or namePrefix",
            "fieldPath": ".instanceType",
        },
    ]

    name: ClassRef = Field(description="Name of the class (referred to by windows and status).")
    node_type: Literal["CloudVM", "SideNode"] = Field(
        description="CloudVM (instances of one type) or SideNode (fixed hardware)."
    )
    instance_type: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        description="CloudVM: the catalogue instance type of the class (created ahead of demand).",
    )
    gpu_model: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        description="SideNode: only nodes whose spec.capacity.gpuModel is this (unset: any).",
    )
    name_prefix: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        description="Only WorkerNodes whose name starts with this (unset: any).",
    )
    boot_time: Duration = Field(
        default="5m",
        description=(
            "How long a node of the class takes from a wake or create request to ready: the "
            "forecast wakes or creates this far ahead of the demand it expects."
        ),
    )


class WarmWindow(_Model):
    """A weekly window in which at least `minWarm` nodes of a class are kept warm (on, idle,
    admission open). Boundaries are wall-clock times in `timeZone`, so the window follows
    daylight saving time."""

    cel_rules: ClassVar[list[dict[str, str]]] = [
        {
            "rule": "self.start != self.end",
            "message": "a warm window's start and end must differ",
            "fieldPath": ".end",
        }
    ]

    name: ClassRef = Field(description="Name of the window (shown in records and status).")
    node_class: ClassRef = Field(
        description="The spec.nodeClasses entry whose nodes are kept warm."
    )
    min_warm: int = Field(
        ge=1, le=1000, description="Nodes of the class kept on, idle and open during the window."
    )
    days: list[Weekday] = Field(
        default_factory=lambda: list(WEEKDAYS[:5]),
        min_length=1,
        max_length=7,
        json_schema_extra={"default": list(WEEKDAYS[:5]), "x-kubernetes-list-type": "set"},
        description="Days on which the window opens (at `start`, local time). Default Mon-Fri.",
    )
    start: str = Field(
        pattern=TIME_OF_DAY_PATTERN,
        max_length=5,
        description="Local time the window opens, HH:MM (24-hour).",
    )
    end: str = Field(
        pattern=TIME_OF_DAY_PATTERN,
        max_length=5,
        description=(
            "Local time the window closes, HH:MM; '24:00' is midnight at the end of the day. "
            "An end before the start closes the window the next day (overnight windows)."
        ),
    )
    time_zone: str = Field(
        default="UTC",
        min_length=1,
        max_length=64,
        pattern=TIME_ZONE_PATTERN,
        description="IANA time zone of start and end, e.g. Europe/Berlin (tz database).",
    )


class WarmCapacity(_Model):
    """Warm windows: capacity kept on by the clock."""

    mode: LeverMode = Field(
        default="On",
        description=(
            "On: the windows hold and wake nodes. Shadow: what they would hold and wake is "
            "recorded (status.warmCapacity, Safety Record evidence), nothing is done. Off: "
            "ignored. An empty window list does nothing in any mode."
        ),
    )
    windows: list[WarmWindow] = Field(
        default_factory=list, max_length=MAX_WINDOWS, description="The warm windows."
    )


class ForecastWake(_Model):
    """Forecast wake: warm capacity ahead of the demand the arrivals seen so far predict."""

    mode: LeverMode = Field(
        default="Off",
        description=(
            "Off (default): arrivals are not even counted. Shadow: arrivals are counted and "
            "what the forecast would hold, wake and create is recorded, nothing is done. On: "
            "the forecast holds and wakes side nodes and creates cloud VMs ahead of demand."
        ),
    )
    time_zone: str = Field(
        default="UTC",
        min_length=1,
        max_length=64,
        pattern=TIME_ZONE_PATTERN,
        description=(
            "IANA time zone in which hours of the day and weekdays are counted (changing it "
            "starts the histogram afresh)."
        ),
    )
    min_days: int = Field(
        default=7,
        ge=1,
        le=365,
        description="No forecast until this many days of arrivals have been observed.",
    )
    confidence: float = Field(
        default=0.8,
        ge=0.5,
        le=0.999,
        description=(
            "The forecast keeps enough warm capacity for the arrivals within a class's "
            "bootTime at this confidence (a Poisson upper quantile of the hour's rate)."
        ),
    )
    max_warm_nodes: int = Field(
        default=4,
        ge=0,
        le=1000,
        description="The most nodes of one class the forecast keeps warm (hard caps apply too).",
    )
    classes: list[ClassRef] = Field(
        default_factory=list,
        max_length=MAX_NODE_CLASSES,
        json_schema_extra={"x-kubernetes-list-type": "set"},
        description="Node classes the forecast covers (empty: every class).",
    )


# -- status -------------------------------------------------------------------------------


Cell = Annotated[float, Field(ge=0, le=MAX_COUNT)]


def _hours(what: str) -> list[Cell]:
    return Field(default_factory=lambda: [0.0] * HOURS, max_length=HOURS, description=what)


class HourlyCounts(StatusModel):
    """One day kind (weekday or weekend) of one class: per hour of the day (local time)."""

    arrivals: list[Cell] = _hours(
        "Containers of the class that arrived in each hour of the day (decayed sums)."
    )
    load: list[Cell] = _hours(
        "The same arrivals in node-equivalents (each its share of a node of the class)."
    )


class ObservedHours(StatusModel):
    """Hours of each hour of the day the operator has watched arrivals (decayed sums)."""

    weekday: list[Cell] = _hours("Monday-Friday, per hour of the day (local time).")
    weekend: list[Cell] = _hours("Saturday and Sunday, per hour of the day (local time).")


class ClassHistogram(StatusModel):
    """The learned arrivals of one node class."""

    name: str = Field(max_length=63, description="The node class.")
    weekday: HourlyCounts = Field(default_factory=HourlyCounts, description="Monday-Friday.")
    weekend: HourlyCounts = Field(default_factory=HourlyCounts, description="Saturday, Sunday.")


class ForecastStatus(StatusModel):
    """The forecast histogram (persisted so a restart or deleted ContainerDispatches lose
    nothing) and whether it forecasts yet."""

    state: Literal["Learning", "Forecasting"] = Field(
        description="Learning: fewer than minDays observed, no forecast. Forecasting: in use."
    )
    message: str = Field(default="", max_length=1024, description="What the state means now.")
    time_zone: str = Field(max_length=64, description="Time zone the hours are counted in.")
    days_observed: float = Field(
        ge=0, le=100000, description="Days the operator has watched arrivals (decayed)."
    )
    counted_until: datetime = Field(
        description="Arrivals up to this time are in the histogram (none is counted twice)."
    )
    observed_hours: ObservedHours = Field(
        description="Per hour of the day: how many such hours the operator has watched."
    )
    classes: list[ClassHistogram] = Field(
        default_factory=list, max_length=MAX_NODE_CLASSES, description="Per node class."
    )


class ClassWarmth(StatusModel):
    """What the levers want of one node class now."""

    name: str = Field(max_length=63, description="The node class.")
    target: int = Field(ge=0, le=100000, description="Warm nodes the levers in force want now.")
    lever: str | None = Field(default=None, max_length=32, description="WarmWindow or Forecast.")
    why: str | None = Field(default=None, max_length=1024, description="The window or forecast.")
    shadow_target: int = Field(
        default=0, ge=0, le=100000, description="Warm nodes a Shadow lever would want now."
    )
    shadow_why: str | None = Field(
        default=None, max_length=1024, description="What the Shadow lever would do and why."
    )
    expected: float | None = Field(
        default=None,
        ge=0,
        le=MAX_COUNT,
        description="Forecast: node-equivalents expected within the class's boot time.",
    )


class WarmStatus(StatusModel):
    """The warm-capacity levers' targets at the last due time."""

    evaluated_at: datetime = Field(description="When the targets were computed.")
    next_due: datetime | None = Field(
        default=None, description="The next window boundary or forecast hour."
    )
    classes: list[ClassWarmth] = Field(
        default_factory=list, max_length=MAX_NODE_CLASSES, description="Per node class."
    )


# -- checks the schema cannot make --------------------------------------------------------


def time_zone_problem(field: str, name: str) -> str | None:
    """Why `name` is not a time zone of the tz database (None: it is)."""
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        return f"{field}: unknown time zone {name!r}; use an IANA name such as Europe/Berlin"
    return None


def warm_problems(
    classes: list[NodeClass], warm: WarmCapacity, forecast: ForecastWake
) -> list[str]:
    """Every problem of the warm-capacity knobs, each naming its field and the fix."""
    out: list[str] = []
    names = [c.name for c in classes]
    for name in sorted({n for n in names if names.count(n) > 1}):
        out.append(f"nodeClasses: class {name!r} is defined twice; names must be unique")
    known = set(names)
    for i, w in enumerate(warm.windows):
        where = f"warmCapacity.windows[{i}]"
        if w.node_class not in known:
            out.append(f"{where}.nodeClass: no node class {w.node_class!r} in spec.nodeClasses")
        problem = time_zone_problem(f"{where}.timeZone", w.time_zone)
        if problem:
            out.append(problem)
    for name in forecast.classes:
        if name not in known:
            out.append(f"forecastWake.classes: no node class {name!r} in spec.nodeClasses")
    problem = time_zone_problem("forecastWake.timeZone", forecast.time_zone)
    if problem:
        out.append(problem)
    return out
