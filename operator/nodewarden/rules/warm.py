"""Warm capacity by node class: which class a node is in, when warm windows are open, what
the levers want of each class now, the class counts the power gates read, and the cloud
VMs to create ahead of demand.

* `class_of`: the first `spec.nodeClasses` entry that matches a node.
* Windows (`windows_of`, `Window`): weekly intervals in an IANA time zone. A window's
  opening and closing instants are its local start and end on each of its days, turned
  into UTC by the tz database (`zoneinfo`), so the window follows daylight saving time;
  a local time that does not exist (the spring-forward gap) is read at the offset before
  the change (02:30 -> 03:30), an ambiguous one (autumn) at its first occurrence.
  `open_at` and `next_boundary` derive from the same intervals, so they always agree.
* `targets`: per class, what the levers in force (mode On) want -- the larger of the open
  windows' `minWarm` and the forecast's warm nodes -- and, apart, what the Shadow levers
  would want (recorded, never enforced): a `WarmTarget`.
* `class_mark` (in `rules.fleet`, whose `FleetTally` keeps the class counts): what a node
  adds to its class's counts (warm: on, idle, admission open; coming: waking or being
  verified after a boot).
* `vm_creates`: per cloud-VM class, how many instances to create so that the class's
  warm and coming nodes reach its target (the dispatcher passes each through the create
  choke point and the hard caps).

Pure: the callers pass specs, node shapes, states, plans and times. The live power
controller and dispatcher (`fleet.warmth`, `power.warming`, `dispatch.warming`) and the
simulator (`simulate.warmth`) call these same functions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from nodewarden.api.warmcapacity import WEEKDAYS, LeverMode, NodeClass, WarmCapacity
from nodewarden.policy.facts import FleetReading
from nodewarden.scheduling.views import NodeState, NodeView, Plan

Lever = Literal["WarmWindow", "Forecast"]
_DAY = timedelta(days=1)


# -- node classes -------------------------------------------------------------------------


def class_of(
    name: str,
    node_type: str,
    instance_type: str | None,
    gpu_model: str | None,
    classes: Sequence[NodeClass],
) -> str | None:
    """The first class of `classes` that matches the node (None: no class)."""
    for c in classes:
        if c.node_type != node_type:
            continue
        if c.name_prefix is not None and not name.startswith(c.name_prefix):
            continue
        if c.node_type == "CloudVM":
            if instance_type != c.instance_type:
                continue
        elif c.gpu_model is not None and gpu_model != c.gpu_model:
            continue
        return c.name
    return None


def class_of_view(view: NodeView, classes: Sequence[NodeClass]) -> str | None:
    """`class_of` a node as the scheduler sees it (no instance type: a side node)."""
    node_type = "SideNode" if view.instance_type is None else "CloudVM"
    return class_of(view.name, node_type, view.instance_type, view.capacity.gpu_model, classes)


# -- windows ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Window:
    """One warm window, parsed: its days (0 = Monday), local start and end, zone."""

    name: str
    node_class: str
    min_warm: int
    days: frozenset[int]
    start: time
    end: time | None
    """None: 24:00 (midnight at the end of the day)."""
    zone: ZoneInfo
    label: str

    def intervals(self, around: datetime) -> Iterable[tuple[datetime, datetime]]:
        """The window's [open, close) instants (UTC-aware) on the local days around
        `around` (the day before it to a week after)."""
        local = around.astimezone(self.zone).date()
        for offset in range(-1, 9):
            day = local + timedelta(days=offset)
            if day.weekday() not in self.days:
                continue
            opens = _instant(day, self.start, self.zone)
            if self.end is None:
                closes = _instant(day + _DAY, time(0, 0), self.zone)
            elif self.end > self.start:
                closes = _instant(day, self.end, self.zone)
            else:  # overnight: closes the next day
                closes = _instant(day + _DAY, self.end, self.zone)
            yield opens, closes

    def open_at(self, at: datetime) -> bool:
        return any(opens <= at < closes for opens, closes in self.intervals(at))

    def next_boundary(self, after: datetime) -> datetime | None:
        """The first opening or closing instant later than `after`."""
        times = [t for pair in self.intervals(after) for t in pair if t > after]
        return min(times) if times else None


def _instant(day: date, at: time, zone: ZoneInfo) -> datetime:
    return datetime.combine(day, at, tzinfo=zone)


def _time_of(text: str) -> time | None:
    hours, minutes = (int(part) for part in text.split(":"))
    return None if hours == 24 else time(hours, minutes)


def windows_of(warm: WarmCapacity) -> tuple[Window, ...]:
    """The windows of a policy, parsed (a window whose time zone the tz database does not
    know is skipped: the policy's validation names it)."""
    out: list[Window] = []
    for w in warm.windows:
        try:
            zone = ZoneInfo(w.time_zone)
        except (ZoneInfoNotFoundError, ValueError, OSError):
            continue
        start = _time_of(w.start) or time(0, 0)
        days = frozenset(WEEKDAYS.index(d) for d in w.days)
        label = f"window {w.name} ({','.join(w.days)} {w.start}-{w.end} {w.time_zone})"
        out.append(
            Window(w.name, w.node_class, w.min_warm, days, start, _time_of(w.end), zone, label)
        )
    return tuple(out)


def window_minimum(windows: Iterable[Window], node_class: str, at: datetime) -> tuple[int, str]:
    """The largest `minWarm` of the windows of `node_class` open at `at`, and which."""
    best, why = 0, ""
    for w in windows:
        if w.node_class == node_class and w.min_warm > best and w.open_at(at):
            best, why = w.min_warm, w.label
    return best, why


def next_window_boundary(windows: Iterable[Window], after: datetime) -> datetime | None:
    found = [b for w in windows if (b := w.next_boundary(after)) is not None]
    return min(found) if found else None


# -- targets ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WarmTarget:
    """What the levers want of one class now: `count` warm nodes (levers in force), and
    what the Shadow levers would want (`shadow_count`; recorded, never enforced)."""

    count: int = 0
    lever: Lever | None = None
    why: str | None = None
    shadow_count: int = 0
    shadow_lever: Lever | None = None
    shadow_why: str | None = None
    expected: float | None = None
    """Forecast: node-equivalents expected within the class's boot time."""


NO_TARGET = WarmTarget()


@dataclass(frozen=True, slots=True)
class LeverWant:
    """One lever's want of one class: warm nodes, why, and (forecast) what it expects."""

    count: int
    why: str
    expected: float | None = None


ForecastFn = Callable[[NodeClass, datetime], LeverWant | None]
"""The forecast lever's want of a class at a time (None: no forecast for it yet)."""


def combine(
    window: LeverWant | None,
    window_mode: LeverMode,
    forecast: LeverWant | None,
    forecast_mode: LeverMode,
) -> WarmTarget:
    """The target of one class from its two levers' wants and modes: in force, the larger
    want of the levers On (the window on a tie); in Shadow, the larger of the others."""
    levers: tuple[tuple[LeverWant | None, LeverMode, Lever], ...] = (
        (window, window_mode, "WarmWindow"),
        (forecast, forecast_mode, "Forecast"),
    )
    on = [(w, lever) for w, mode, lever in levers if w is not None and w.count > 0 and mode == "On"]
    shadow = [
        (w, lever)
        for w, mode, lever in levers
        if w is not None and w.count > 0 and mode == "Shadow"
    ]
    expected = forecast.expected if forecast is not None else None
    if not on and not shadow:
        return WarmTarget(expected=expected) if expected is not None else NO_TARGET
    best = max(on, key=lambda item: item[0].count) if on else None  # the window on a tie
    shade = max(shadow, key=lambda item: item[0].count) if shadow else None
    return WarmTarget(
        best[0].count if best else 0,
        best[1] if best else None,
        best[0].why if best else None,
        shade[0].count if shade else 0,
        shade[1] if shade else None,
        shade[0].why if shade else None,
        expected,
    )


def targets(
    classes: Sequence[NodeClass],
    windows: Sequence[Window],
    window_mode: LeverMode,
    forecast: ForecastFn | None,
    forecast_mode: LeverMode,
    at: datetime,
) -> dict[str, WarmTarget]:
    """Every class's `WarmTarget` at `at` (classes nothing wants are left out)."""
    out: dict[str, WarmTarget] = {}
    for c in classes:
        count, why = window_minimum(windows, c.name, at) if window_mode != "Off" else (0, "")
        window = LeverWant(count, why) if count else None
        want = forecast(c, at) if forecast is not None and forecast_mode != "Off" else None
        target = combine(window, window_mode, want, forecast_mode)
        if target != NO_TARGET:
            out[c.name] = target
    return out


def with_class(
    reading: FleetReading | None,
    node_class: str | None,
    counts: tuple[int, int],
    target: WarmTarget,
) -> FleetReading | None:
    """A node's fleet reading with its class's warm and coming counts and the levers'
    target (unchanged without a class or a reading)."""
    if reading is None or node_class is None:
        return reading
    return reading.model_copy(
        update={
            "node_class": node_class,
            "class_warm_idle": counts[0],
            "class_coming": counts[1],
            "warm_target": target.count,
            "warm_lever": target.lever,
            "warm_why": _clip(target.why),
            "shadow_target": target.shadow_count,
            "shadow_why": _clip(target.shadow_why),
        }
    )


def _clip(text: str | None) -> str | None:
    return None if text is None else text[:1024]


# -- cloud VMs created ahead of demand ----------------------------------------------------


def vm_creates(
    wanted: Mapping[str, WarmTarget],
    classes: Sequence[NodeClass],
    nodes: Iterable[NodeView],
    plan: Plan,
) -> list[tuple[str, str, int]]:
    """(class, instance type, how many) to create so that every cloud-VM class with a
    target has that many nodes warm or coming: idle, ready, open nodes the plan starts
    nothing on, and nodes booting (or whose create is pending) that no container waits
    for. Creates the plan makes for containers are theirs, not warm capacity."""
    by_name = {c.name: c for c in classes if c.node_type == "CloudVM"}
    types = {c.instance_type for name, c in by_name.items() if name in wanted}
    if not types:
        return []
    have: dict[str, int] = {}
    busy = {s.node for s in plan.starts} | set(plan.wait_nodes.values())
    for view in nodes:
        if view.instance_type not in types or view.name in busy:
            continue
        name = class_of_view(view, classes)
        if name is None or name not in wanted:
            continue
        usable = view.state is NodeState.IDLE and view.ready and view.admission_open
        coming = view.state in (NodeState.PENDING, NodeState.BOOTING) and view.admission_open
        if usable or coming:
            have[name] = have.get(name, 0) + 1
    out: list[tuple[str, str, int]] = []
    for name, target in sorted(wanted.items()):
        c = by_name.get(name)
        if c is None or c.instance_type is None:
            continue
        missing = target.count - have.get(name, 0)
        if missing > 0:
            out.append((name, c.instance_type, missing))
    return out
