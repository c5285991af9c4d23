"""Timing: how old the readings are (telemetry freshness), how long the node has been
idle, on or off, the cooldown since the last transition, and the billing window.

    telemetry_gate(named readings, now, max_age) -> (gate, stale, missing, oldest)
    to_refresh(refresh, stale, missing)   what telemetry_gate found, to be read again
    shutdown_timing(c) -> timing gate (c.timing: the measures)   idle threshold, min-on,
                                                      cooldown, billing window (cloud VMs)
    wake_timing(c) -> timing gate (c.timing: the measures)   min-off, cooldown
    timing_measures(facts, now, policy, state)  the measures that matter in `state`

Each timing rule that is not met adds its reason code and the time at which it will be
(the gate's recheck is the latest of them).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TypeAlias, get_args

from nodewarden.policy.base import CLOCK_SKEW_TOLERANCE
from nodewarden.policy.evaluation import (
    Evidence,
    GateInputs,
    GateName,
    GateResult,
    TimingMeasure,
    Verdict,
    gate_result,
)
from nodewarden.policy.facts import FactName, NodeFacts, Reading, UptimeReading
from nodewarden.policy.nodemanager import (
    BillingWindowState,
    billing_window_from,
    next_billing_window_open,
)
from nodewarden.policy.reasons import R, ReasonCode
from nodewarden.policy.state import AdmissionState, NodePowerState, PowerState, TransitionKind
from nodewarden.policy.view import PolicyView

_PASS, _FAIL = Verdict.PASS, Verdict.FAIL
_G_TELEMETRY, _G_TIMING = GateName.TELEMETRY, GateName.TIMING
_SHUTDOWN_KIND = TransitionKind.SHUTDOWN
_CLOSED = AdmissionState.CLOSED

_Freshness: TypeAlias = tuple[
    GateResult, tuple[FactName, ...], tuple[FactName, ...], datetime | None
]
"""The telemetry gate, the stale and the missing readings' names, the oldest reading's time."""


_OLDEST: dict[FactName, str] = {name: f"oldest: {name}" for name in get_args(FactName)}
"""The evidence name of the oldest fresh reading, per reading (no string built per call)."""


def telemetry_gate(
    named: tuple[tuple[FactName, Reading | None], ...], now: datetime, max_age: timedelta
) -> _Freshness:
    """Freshness of the decisive readings. Evidence lists each missing, stale or
    future reading; when all are fresh, the oldest one (the others are fresher)."""
    evidence: list[Evidence] = []
    stale: list[FactName] = []
    missing: list[FactName] = []
    future = False
    aged = False
    oldest: datetime | None = None
    oldest_reading: Reading | None = None
    oldest_name: FactName = "demand"
    future_limit = now + CLOCK_SKEW_TOLERANCE
    stale_before = now - max_age  # `now - at > max_age`, without a timedelta per reading
    for name, reading in named:
        if reading is None:
            missing.append(name)
            evidence.append(Evidence(name, "missing", "-", None))
            continue
        at = reading.observed_at
        if oldest is None or at < oldest:
            oldest, oldest_reading, oldest_name = at, reading, name
        if at > future_limit:
            stale.append(name)
            future = True
            evidence.append(Evidence(name, "from the future", reading.source, at))
        elif at < stale_before:
            stale.append(name)
            aged = True
            evidence.append(Evidence(name, "stale", reading.source, at))
    if not evidence:
        fresh_evidence: tuple[Evidence, ...] = ()
        if oldest_reading is not None:
            fresh_evidence = (
                Evidence(_OLDEST[oldest_name], "fresh", oldest_reading.source, oldest),
            )
        return GateResult(_G_TELEMETRY, _PASS, (), fresh_evidence), (), (), oldest
    reasons: list[ReasonCode] = []
    if aged:
        reasons.append(R.TELEMETRY_STALE)
    if missing:
        reasons.append(R.TELEMETRY_MISSING)
    if future:
        reasons.append(R.TELEMETRY_FROM_FUTURE)
    gate = GateResult(_G_TELEMETRY, _FAIL, tuple(reasons), tuple(evidence))
    return gate, tuple(stale), tuple(missing), oldest


def to_refresh(
    refresh: list[FactName], stale: tuple[FactName, ...], missing: tuple[FactName, ...]
) -> None:
    """Add the stale and missing readings the telemetry gate found to `refresh`, once each."""
    for name in stale + missing:
        if name not in refresh:
            refresh.append(name)


_NEVER_TRANSITIONED = Evidence("sinceLastTransitionSeconds", "never", "nodewarden", None)


def cooldown(
    last: datetime | None,
    now: datetime,
    policy: PolicyView,
    evidence: list[Evidence],
    reasons: list[ReasonCode],
    rechecks: list[datetime],
) -> TimingMeasure:
    """Time since the last transition finished (`last`, from the state) vs the cooldown.

    Appends the evidence, the COOLDOWN reason and its recheck time to the timing gate's
    lists, and returns the measure.
    """
    if last is None:  # (a node that never made a transition: shared, read-only values)
        evidence.append(_NEVER_TRANSITIONED)
        never: TimingMeasure | None = policy.memo.get("cooldown_never")
        if never is None:
            never = policy.memo["cooldown_never"] = TimingMeasure(
                "cooldown", policy.seconds.cooldown, None, None, True
            )
        return never
    required = policy.seconds.cooldown
    measured = now - last
    seconds = measured.total_seconds()
    evidence.append(Evidence("sinceLastTransitionSeconds", seconds, "nodewarden", last))
    met = measured >= policy.cooldown
    if not met:
        reasons.append(R.COOLDOWN)
        rechecks.append(last + policy.cooldown)
    return TimingMeasure("cooldown", required, seconds, last, met)


def _on_since(
    uptime: UptimeReading | None, state: NodePowerState | None
) -> tuple[datetime | None, str, datetime | None]:
    """When the node came on (the later of the node's boot time and nodewarden's record),
    who says so, and when that was observed."""
    from_facts = uptime.on_since if uptime is not None else None
    from_state = state.on_since if state is not None else None
    if from_facts is not None and (from_state is None or from_facts >= from_state):
        assert uptime is not None
        return from_facts, uptime.source, uptime.observed_at
    if from_state is not None:
        return from_state, "nodewarden", from_state
    return None, "-", None


def shutdown_timing(c: GateInputs) -> GateResult:
    """Idle threshold, min-on, cooldown and (cloud VMs) the billing window; sets
    `c.timing`. `c.own_transition`: a shutdown transition is in progress; `c.forced`: a
    manual or pinned shutdown."""
    facts, now, policy, state = c.facts, c.now, c.policy, c.state
    work, draining, forced = facts.work, c.own_transition, c.forced
    reasons: list[ReasonCode] = []
    rechecks: list[datetime] = []
    evidence: list[Evidence] = []
    seconds = policy.seconds
    # idle threshold
    if draining and not forced:
        # Checked when the drain began; from then on the work gate (drain complete) rules.
        idle = TimingMeasure("idleThreshold", seconds.idle_threshold, None, None, None, True)
        evidence.append(Evidence("idleThreshold", "checked at drain start", "nodewarden", None))
    elif forced:
        idle = TimingMeasure("idleThreshold", seconds.idle_threshold, None, None, None, True)
        evidence.append(Evidence("idleThreshold", "waived", "intent/spec", None))
    elif work is None:
        idle = TimingMeasure("idleThreshold", seconds.idle_threshold, None, None, None)
        reasons.append(R.TELEMETRY_MISSING)
        evidence.append(Evidence("idleForSeconds", "missing", "-", None))
    elif work.active_jobs > 0:
        idle = TimingMeasure("idleThreshold", seconds.idle_threshold, 0.0, None, False)
        reasons.append(R.IDLE_WINDOW_NOT_MET)
        evidence.append(Evidence("idleForSeconds", "busy", work.source, work.observed_at))
    elif (idle_since := work.idle_since) is None:
        idle = TimingMeasure("idleThreshold", seconds.idle_threshold, None, None, None)
        reasons.append(R.TELEMETRY_MISSING)
        evidence.append(Evidence("idleSince", "missing", work.source, work.observed_at))
    else:
        idle_for = now - idle_since
        idle_seconds = idle_for.total_seconds()
        met = idle_for >= policy.idle_threshold
        idle = TimingMeasure("idleThreshold", seconds.idle_threshold, idle_seconds, idle_since, met)
        evidence.append(Evidence("idleForSeconds", idle_seconds, work.source, work.observed_at))
        if not met:
            reasons.append(R.IDLE_WINDOW_NOT_MET)
            rechecks.append(idle_since + policy.idle_threshold)
    # min-on
    on_since, on_source, on_seen = _on_since(facts.uptime, state)
    if on_since is None:
        min_on = TimingMeasure("minOn", seconds.min_on, None, None, None)
        reasons.append(R.TELEMETRY_MISSING)
        evidence.append(Evidence("upForSeconds", "missing", "-", None))
    else:
        up = now - on_since
        up_seconds = up.total_seconds()
        met = up >= policy.min_on
        min_on = TimingMeasure("minOn", seconds.min_on, up_seconds, on_since, met)
        evidence.append(Evidence("upForSeconds", up_seconds, on_source, on_seen))
        if not met:
            reasons.append(R.MIN_ON_NOT_MET)
            rechecks.append(on_since + policy.min_on)
    # cooldown
    cool = cooldown(
        state.last_transition_at if state is not None else None,
        now,
        policy,
        evidence,
        reasons,
        rechecks,
    )
    measures: tuple[TimingMeasure, ...] = (idle, min_on, cool)
    # billing window (cloud VMs, automatic shutdowns only)
    if facts.node_type == "CloudVM" and not forced and policy.valid and on_since is not None:
        state_bw = billing_window_from(
            booted_at=on_since,
            period=policy.billing_period,
            window_start=policy.billing_window_start,
            window_end=policy.billing_window_end,
            now=now,
        )
        is_open = state_bw is BillingWindowState.OPEN
        measures = (
            *measures,
            TimingMeasure(
                "billingWindow",
                seconds.billing_period,
                (now - on_since).total_seconds(),
                on_since,
                is_open,
            ),
        )
        evidence.append(Evidence("billingWindow", state_bw.value, on_source, on_seen))
        if not is_open:
            reasons.append(R.BILLING_WINDOW_CLOSED)
            rechecks.append(
                next_billing_window_open(
                    booted_at=on_since,
                    period=policy.billing_period,
                    window_start=policy.billing_window_start,
                    window_end=policy.billing_window_end,
                    now=now,
                )
            )
    c.timing = measures
    recheck = max(rechecks) if rechecks else None
    return gate_result(_G_TIMING, reasons, tuple(evidence), recheck)


# -- wake -------------------------------------------------------------------------------


def wake_timing(c: GateInputs) -> GateResult:
    """Min-off and cooldown, both measured from the state; sets `c.timing`."""
    now, policy, state = c.now, c.policy, c.state
    reasons: list[ReasonCode] = []
    rechecks: list[datetime] = []
    evidence: list[Evidence] = []
    min_off = policy.min_off
    if state is not None:
        off_since, last_transition_at = state.off_since, state.last_transition_at
    else:
        off_since = last_transition_at = None
    if off_since is None:
        off_measure = TimingMeasure("minOff", policy.seconds.min_off, None, None, None)
        reasons.append(R.TELEMETRY_MISSING)
        evidence.append(Evidence("offForSeconds", "missing", "-", None))
    else:
        off_for = now - off_since
        off_seconds = off_for.total_seconds()
        met = off_for >= min_off
        off_measure = TimingMeasure("minOff", policy.seconds.min_off, off_seconds, off_since, met)
        evidence.append(Evidence("offForSeconds", off_seconds, "nodewarden", off_since))
        if not met:
            reasons.append(R.MIN_OFF_NOT_MET)
            rechecks.append(off_since + min_off)
    cool = cooldown(last_transition_at, now, policy, evidence, reasons, rechecks)
    c.timing = (off_measure, cool)
    return gate_result(_G_TIMING, reasons, tuple(evidence), max(rechecks) if rechecks else None)


def timing_measures(
    facts: NodeFacts, now: datetime, policy: PolicyView, state: NodePowerState
) -> tuple[TimingMeasure, ...]:
    """The timing values and measurements that matter in `state` (for records of steps
    that made no gate evaluation): min-off and cooldown while off or waking, else idle
    threshold, min-on and cooldown."""
    transition = state.transition
    if state.state in (PowerState.OFF, PowerState.WAKING):
        c = GateInputs(False, facts, now, policy, state, None, _CLOSED, None, False, None)
        wake_timing(c)
    else:
        draining = transition is not None and transition.kind is _SHUTDOWN_KIND
        c = GateInputs(True, facts, now, policy, state, None, _CLOSED, None, draining, None)
        shutdown_timing(c)
    return c.timing
