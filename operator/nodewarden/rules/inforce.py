"""The policy in force: what a PowerPolicy applies right now, per node class it governs --
its effective thresholds, the disruption budget in use and left (and a slot for the
consolidation budget), the warm window or billing window in force and when the next
change comes, the forecast's state, and its nodes on, off and in transition.

    in_force(spec, members, now, forecast_days=None, consolidating=0) -> InForce
    member(node_class, node_type, state) -> Member

`InForce.status` is the wire form of PowerPolicy `status.inForce`; `InForce.next_change`
is the next time it changes by the clock alone (a window opening or closing) -- the
caller's due time. Nothing in it moves with the clock between two such times (no
countdowns), so it is written when a node moves or a due time comes, never periodically.
Energy and money saved today, per class too, stay in `status.energy` (`rules.savings`,
written at their own cadence, never per reading).

Pure: the live power controller (`power.inforce`) and the simulator (`simulate.report`)
call the same function.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from nodewarden.api.powerpolicy import PowerPolicySpec
from nodewarden.policy.state import NodePowerState, PowerState
from nodewarden.rules.fleet import in_budget
from nodewarden.rules.warm import Window, next_window_boundary, windows_of
from nodewarden.units import format_duration, parse_duration, rfc3339

Phase = Literal["on", "off", "transitioning", "unknown"]
ForecastState = Literal["Off", "Learning", "Shadow", "On"]

_TRANSITIONING = frozenset({PowerState.DRAINING, PowerState.SHUTTING_DOWN, PowerState.WAKING})
_ON = frozenset({PowerState.ON_IDLE, PowerState.ACTIVE})
UNCLASSED = "(all)"
"""The class name of a policy's nodes in no node class."""


@dataclass(frozen=True, slots=True)
class Member:
    """What one node adds to its policy's counts."""

    node_class: str | None
    phase: Phase
    in_budget: bool


def member(node_class: str | None, node_type: str, state: NodePowerState) -> Member:
    s = state.state
    phase: Phase = (
        "transitioning"
        if s in _TRANSITIONING
        else "on"
        if s in _ON
        else "off"
        if s is PowerState.OFF
        else "unknown"
    )
    return Member(node_class, phase, in_budget(node_type, state))


@dataclass(frozen=True, slots=True)
class InForce:
    status: dict[str, Any]
    next_change: datetime | None


def _counts(members: Iterable[Member]) -> dict[str, int]:
    out = {"total": 0, "on": 0, "off": 0, "transitioning": 0, "unknown": 0}
    for m in members:
        out["total"] += 1
        out[m.phase] += 1
    return out


def forecast_state(spec: PowerPolicySpec, days_observed: float | None) -> ForecastState:
    """Off, Learning (fewer than minDays observed), Shadow or On."""
    mode = spec.forecast_wake.mode
    if mode == "Off":
        return "Off"
    if days_observed is None or days_observed < spec.forecast_wake.min_days:
        return "Learning"
    return "Shadow" if mode == "Shadow" else "On"


def _window_now(
    windows: tuple[Window, ...], node_class: str, now: datetime
) -> tuple[Window | None, datetime | None]:
    """The open window of `node_class` with the largest minWarm, and the class's next
    window boundary."""
    mine = tuple(w for w in windows if w.node_class == node_class)
    best: Window | None = None
    for w in mine:
        if w.open_at(now) and (best is None or w.min_warm > best.min_warm):
            best = w
    boundary = next_window_boundary(mine, now)
    return best, boundary.astimezone(UTC) if boundary is not None else None


def _billing(spec: PowerPolicySpec) -> str:
    b = spec.billing
    if parse_duration(b.period).total_seconds() == 0:
        return "per-second: always open"
    return f"{b.window_start}-{b.window_end} of each {b.period} (cloud VMs, from boot)"


def _consolidation_budget(spec: PowerPolicySpec, in_use: int) -> dict[str, Any] | None:
    """Consolidation by drain's own budget (not the transition budget); none while Off."""
    settings = spec.consolidation
    if settings.mode == "Off":
        return None
    most = settings.max_concurrent
    return {"max": most, "inUse": in_use, "left": max(0, most - in_use)}


def in_force(
    spec: PowerPolicySpec,
    members: Iterable[Member],
    now: datetime,
    forecast_days: float | None = None,
    consolidating: int = 0,
) -> InForce:
    """The policy in force now for `members` (its nodes), and its next change by the clock;
    `consolidating`: its nodes draining (On) or that would drain (Shadow) for consolidation,
    their work not ended -- what its consolidation budget has in use."""
    nodes = list(members)
    windows = windows_of(spec.warm_capacity) if spec.warm_capacity.mode != "Off" else ()
    forecast = forecast_state(spec, forecast_days)
    budget_max = spec.disruption_budget.max_concurrent_transitions
    in_use = sum(1 for m in nodes if m.in_budget)
    names = [c.name for c in spec.node_classes]
    classes: list[dict[str, Any]] = []
    upcoming: list[tuple[datetime, str]] = []
    open_names: list[str] = []
    for name in [*names, UNCLASSED]:
        mine = [m for m in nodes if (m.node_class or UNCLASSED) == name]
        if name == UNCLASSED and not mine:
            continue
        entry: dict[str, Any] = {"name": name, "nodes": _counts(mine)}
        if name != UNCLASSED:
            window, boundary = _window_now(windows, name, now)
            entry["warmWindow"] = window.name if window is not None else None
            entry["minWarm"] = window.min_warm if window is not None else 0
            entry["windowMode"] = spec.warm_capacity.mode
            if boundary is not None:
                change = f"window {'closes' if window is not None else 'opens'} ({name})"
                entry["nextWindowChangeAt"] = rfc3339(boundary)
                upcoming.append((boundary, change))
            if window is not None:
                open_names.append(window.name)
            covered = not spec.forecast_wake.classes or name in spec.forecast_wake.classes
            entry["forecast"] = forecast if covered else "Off"
        classes.append(entry)
    upcoming.sort()
    next_at, next_what = upcoming[0] if upcoming else (None, None)
    status: dict[str, Any] = {
        "mode": "Paused" if spec.paused else spec.mode,
        "thresholds": {
            "idleThreshold": format_duration(spec.duration("idle_threshold")),
            "minOn": format_duration(spec.duration("min_on")),
            "minOff": format_duration(spec.duration("min_off")),
            "cooldown": format_duration(spec.duration("cooldown")),
            "bootGrace": format_duration(spec.duration("boot_grace")),
            "telemetryMaxAge": format_duration(spec.duration("telemetry_max_age")),
            "minWarmNodes": spec.min_warm_nodes,
        },
        "disruptionBudget": {
            "max": budget_max,
            "inUse": in_use,
            "left": max(0, budget_max - in_use),
        },
        "consolidationBudget": _consolidation_budget(spec, consolidating),
        "window": ",".join(sorted(set(open_names))) or "none",
        "billingWindow": _billing(spec),
        "forecast": forecast,
        "nodes": _counts(nodes),
        "classes": classes,
        "nextChangeAt": rfc3339(next_at),
        "nextChange": next_what,
    }
    return InForce(status, next_at)
