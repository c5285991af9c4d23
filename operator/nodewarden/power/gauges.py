"""The power path's metrics that come from node states rather than from events.

    date_stale(rt, now)        after each step: date the start of a stale-telemetry episode
    publish(nodes, now)        before a scrape, if a round stepped a node: set every gauge
                               from every node's runtime (`Round.publish_gauges`)
    observe_step(before, after) after each applied step: observe the latency histograms

`publish` sets nodes by state and type, transitions in flight (how many, since when the
longest has been in its state, the earliest deadline), nodes whose decision is BLOCK,
nodes held back by stale telemetry (how many, since when the longest) and transitions
without a Safety Record. `observe_step` compares one step's power state before and after
(`step_timings`, pure) and observes request -> confirmed Off / On and request -> ready.
Times are exported as Unix timestamps, so an alert's `time() - value` stays exact even
when the controller's loop stops publishing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from prometheus_client import Gauge

from nodewarden.metrics import (
    NODES,
    POWER_BLOCKED_NODES,
    POWER_CONFIRM_SECONDS,
    POWER_READY_SECONDS,
    POWER_STALE_NODES,
    POWER_STALE_SINCE,
    POWER_TRANSITION_DEADLINE,
    POWER_TRANSITION_STATE_SINCE,
    POWER_TRANSITIONS,
    POWER_UNRECORDED_TRANSITIONS,
)
from nodewarden.policy.reasons import Decision, ReasonCode
from nodewarden.policy.state import (
    ON_STATES,
    NodePowerState,
    PowerState,
    TransitionKind,
    api_state,
)
from nodewarden.power.nodestatus import api_state_of
from nodewarden.power.runtime import NodeRuntime

_STALE = (ReasonCode.TELEMETRY_STALE, ReasonCode.TELEMETRY_MISSING)
_STATE_NAMES = ("Booting", *[api_state(s) for s in PowerState])

_Oldest = dict[tuple[str, str], tuple[datetime, str]]


def publish(nodes: Iterable[NodeRuntime], now: datetime | None = None) -> None:
    """Set every power-path gauge (zero for counts no node has; no series for the
    timestamps of what no node is doing). `now` (default: the wall clock) dates the start
    of a node's stale-telemetry episode, kept in `NodeRuntime.stale_since`."""
    at = now if now is not None else datetime.now(UTC)
    states: dict[tuple[str, str], int] = {}
    transitions: dict[tuple[str, str], int] = {}
    since: _Oldest = {}
    deadlines: _Oldest = {}
    blocked: dict[tuple[str, ...], float] = {}
    stale = 0
    stale_oldest: tuple[datetime, str] | None = None
    unrecorded = 0
    for rt in nodes:
        st = rt.state
        key = (api_state_of(rt), rt.node_type)
        states[key] = states.get(key, 0) + 1
        t = st.transition
        if t is not None:
            tk = (t.kind.value, st.state.value)
            transitions[tk] = transitions.get(tk, 0) + 1
            _keep_earliest(since, tk, st.state_since or t.started_at, rt.name)
            _keep_earliest(deadlines, tk, t.deadline, rt.name)
            if t.kind is not TransitionKind.VERIFY and rt.record is None:
                unrecorded += 1
        if st.last_decision is Decision.BLOCK:
            bk = (st.state.value, st.last_reasons[0].value if st.last_reasons else "")
            blocked[bk] = blocked.get(bk, 0) + 1
        if any(r in st.last_reasons for r in _STALE):
            stale += 1
            if rt.stale_since is None:
                rt.stale_since = at
            if stale_oldest is None or (rt.stale_since, rt.name) < stale_oldest:
                stale_oldest = (rt.stale_since, rt.name)
        else:
            rt.stale_since = None
    for state_name in _STATE_NAMES:
        for node_type in ("CloudVM", "SideNode"):
            NODES.labels(state_name, node_type).set(states.get((state_name, node_type), 0))
    for kind in TransitionKind:
        for ps in PowerState:
            POWER_TRANSITIONS.labels(kind.value, ps.value).set(
                transitions.get((kind.value, ps.value), 0)
            )
    _replace(POWER_TRANSITION_STATE_SINCE, _by_node(since))
    _replace(POWER_TRANSITION_DEADLINE, _by_node(deadlines))
    _replace(POWER_BLOCKED_NODES, blocked)
    _replace(
        POWER_STALE_SINCE,
        {(stale_oldest[1],): stale_oldest[0].timestamp()} if stale_oldest is not None else {},
    )
    POWER_STALE_NODES.set(stale)
    POWER_UNRECORDED_TRANSITIONS.set(unrecorded)


def date_stale(rt: NodeRuntime, now: datetime) -> None:
    """Date the start of `rt`'s stale-telemetry episode (`NodeRuntime.stale_since`) by the
    round that stepped it: once its last decision names stale or missing telemetry, kept
    while it does, cleared when it no longer does -- per stepped node, so `publish` need
    not run every round to date it."""
    if any(r in rt.state.last_reasons for r in _STALE):
        if rt.stale_since is None:
            rt.stale_since = now
    else:
        rt.stale_since = None


def _keep_earliest(oldest: _Oldest, key: tuple[str, str], at: datetime, node: str) -> None:
    if key not in oldest or (at, node) < oldest[key]:
        oldest[key] = (at, node)


def _by_node(oldest: _Oldest) -> dict[tuple[str, ...], float]:
    return {(kind, state, node): at.timestamp() for (kind, state), (at, node) in oldest.items()}


def _replace(gauge: Gauge, values: Mapping[tuple[str, ...], float]) -> None:
    """Set exactly these children of a labelled gauge and remove every other one (a node
    that is no longer the oldest, a reason no node is blocked by any more)."""
    shown = {
        tuple(sample.labels.values()) for family in gauge.collect() for sample in family.samples
    }
    for labels in shown - values.keys():
        gauge.remove(*labels)
    for labels, value in values.items():
        gauge.labels(*labels).set(value)


# -- latencies of one step ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Timing:
    """One latency a step completed: `confirm` (label = transition kind) or `ready`
    (label = the wake action), in seconds since the transition's first request."""

    metric: Literal["confirm", "ready"]
    label: str
    seconds: float


def step_timings(before: NodePowerState, after: NodePowerState) -> list[Timing]:
    """What one step confirmed of the transition `before` was in: a shutdown's observed
    Off, a wake's observed On, a wake's passing ready probe (the step that opens the ON
    state). A transition that never sent a request (Verify) or that ends otherwise
    (aborted, BLOCKED) gives nothing."""
    t = before.transition
    if t is None or t.first_requested_at is None:
        return []
    requested = t.first_requested_at
    nt = after.transition
    ended = nt is None or nt.id != t.id
    if t.kind is TransitionKind.SHUTDOWN:
        off_at = after.off_since or after.state_since
        if ended and after.state is PowerState.OFF and off_at is not None:
            return [Timing("confirm", "Shutdown", _seconds(requested, off_at))]
        return []
    if t.kind is not TransitionKind.WAKE:
        return []
    if not ended:
        assert nt is not None
        seen = nt.power_on_seen_at
        if t.power_on_seen_at is None and seen is not None:
            return [Timing("confirm", "Wake", _seconds(requested, seen))]
        return []
    out: list[Timing] = []
    if after.state in ON_STATES and after.state_since is not None:
        if t.power_on_seen_at is None and after.on_since is not None:
            out.append(Timing("confirm", "Wake", _seconds(requested, after.on_since)))
        action = t.request.action if t.request is not None else "On"
        out.append(Timing("ready", action, _seconds(requested, after.state_since)))
    return out


def observe_step(before: NodePowerState, after: NodePowerState) -> None:
    """Observe `nodewarden_power_confirm_seconds` / `nodewarden_power_ready_seconds` for
    what this step confirmed (call once per applied step)."""
    for timing in step_timings(before, after):
        histogram = POWER_CONFIRM_SECONDS if timing.metric == "confirm" else POWER_READY_SECONDS
        histogram.labels(timing.label).observe(timing.seconds)


def _seconds(start: datetime, end: datetime) -> float:
    return max(0.0, (end - start).total_seconds())
