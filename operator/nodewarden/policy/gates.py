"""The power gates: is it safe (and worth it) to switch this node off, or to wake it?

    evaluate_shutdown(facts, now, policy, state=None) -> Evaluation
    evaluate_wake(facts, now, policy, state=None) -> Evaluation

Pure functions: the same facts, clock, policy and state always give the same
`Evaluation` (decision, reason codes, the gate table with evidence, the power action
that would be used, when to look again, which readings to refresh). They make no state
transition; the state machine (`nodewarden.policy.machine`) calls them at each step,
`nodewarden explain` prints them, and the operator's periodic "should this node go
off / be woken?" check can call them directly.

Shutdown gates, in order (each FAIL names reason codes; see docs/reason-codes.md):

    policy      the policy is valid and not paused
    desired     a shutdown is wanted (spec.power, idleBehavior, manual intent)
    demand      no qualified queued demand; once admission is closed, the demand must
                have been re-read after closing (not a cached value)
    work        no active jobs; admission confirmed closed; drain complete (a job count
                read after admission closed shows 0)
    telemetry   demand, work, power and inhibitor readings present, not from the future,
                and no older than telemetryMaxAge
    power       observed power is On (from a trusted source)
    timing      idle threshold reached, min-on reached, cooldown over (cloud VMs: inside
                the billing shutdown window); manual/pinned shutdowns waive the idle
                threshold and billing window only
    inhibitors  no block-mode systemd inhibitor on shutdown, unless an audited override
                permitted by the policy is present (verdict WAIVED, OVERRIDE_APPLIED)
    capability  the control method exists and a shutdown action is both allowable on
                the node and allowed by the policy
    fleet       disruption budget and min-warm-nodes (SKIPPED without a fleet reading)

Wake gates: policy, desired, demand (qualified demand present, unless a Wake intent or
spec.power On), telemetry (demand and power), power (observed Off), timing (min-off,
cooldown), capability (On / WakeOnLan), fleet (disruption budget).

Decision: if every gate passes -> SHUTDOWN / START. Otherwise the failing codes decide
by class, strongest first: NONE (the node is needed / nothing to do) > BLOCK (needs a
person) > DEFER (wait for time or fresh evidence) > DRAIN (only our own drain steps
remain: close admission, re-read demand, wait for jobs).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Literal

from nodewarden.api.powerpolicy import ResetAction
from nodewarden.policy.base import CLOCK_SKEW_TOLERANCE, require_aware
from nodewarden.policy.facts import FactName, ManualIntent, NodeFacts, Reading
from nodewarden.policy.nodemanager import (
    BillingWindowState,
    billing_window_from,
    next_billing_window_open,
)
from nodewarden.policy.reasons import Decision, DecisionClass, ReasonCode, decision_class
from nodewarden.policy.state import AdmissionState, NodePowerState, PowerState, TransitionKind
from nodewarden.policy.view import PolicyView

R = ReasonCode
EvidenceValue = str | int | float | bool | None


class GateName(StrEnum):
    POLICY = "policy"
    DESIRED = "desired"
    DEMAND = "demand"
    WORK = "work"
    TELEMETRY = "telemetry"
    POWER = "power"
    TIMING = "timing"
    INHIBITORS = "inhibitors"
    CAPABILITY = "capability"
    FLEET = "fleet"


class Verdict(StrEnum):
    PASS = "PASS"
    FAIL = "FAIL"
    WAIVED = "WAIVED"
    """Failed on the facts but passed by an audited, policy-permitted override."""
    SKIPPED = "SKIPPED"
    """Not evaluated (not applicable, or the optional input was not supplied)."""


@dataclass(slots=True)
class Evidence:
    """One piece of evidence in a gate: what, its value, who supplied it and when.

    Gate results are plain (non-frozen) slotted dataclasses because frozen dataclass
    construction costs 4x more and a fleet evaluation builds ~40 per node; they are
    created fresh for every evaluation and must be treated as read-only.
    """

    name: str
    value: EvidenceValue
    source: str
    at: datetime | None = None


@dataclass(slots=True)
class GateResult:
    gate: GateName
    verdict: Verdict
    reasons: tuple[ReasonCode, ...]
    evidence: tuple[Evidence, ...]
    recheck: datetime | None = None

    @property
    def passed(self) -> bool:
        return self.verdict is not Verdict.FAIL


@dataclass(slots=True)
class TimingMeasure:
    """A timing rule: the policy value, what was measured, since when, and the verdict."""

    name: Literal["idleThreshold", "minOn", "minOff", "cooldown", "billingWindow"]
    required: float
    measured: float | None = None
    since: datetime | None = None
    met: bool | None = None
    waived: bool = False


@dataclass(slots=True)
class Evaluation:
    """Outcome of one gate evaluation (no state transition). Read-only by convention
    (not frozen: construction cost matters when a fleet is evaluated)."""

    kind: Literal["shutdown", "wake"]
    decision: Decision
    reasons: tuple[ReasonCode, ...]
    gates: tuple[GateResult, ...]
    action: ResetAction | None
    recheck_at: datetime | None
    overrides_applied: tuple[str, ...]
    timing: tuple[TimingMeasure, ...]
    stale: tuple[FactName, ...]
    missing: tuple[FactName, ...]
    oldest_observed_at: datetime | None
    refresh: tuple[FactName, ...]
    forced: bool

    @property
    def passed(self) -> bool:
        """Every gate passed (possibly through a recorded override)."""
        return all(g.passed for g in self.gates)

    def gate(self, name: GateName) -> GateResult | None:
        for g in self.gates:
            if g.gate is name:
                return g
        return None


SHUTDOWN_ACTIONS: dict[str, tuple[ResetAction, ...]] = {
    "Redfish": ("GracefulShutdown",),
    "WakeOnLan": ("SshPoweroff",),
    "Cloud": ("GracefulShutdown",),
    "None": (),
}
WAKE_ACTIONS: dict[str, tuple[ResetAction, ...]] = {
    "Redfish": ("On",),
    "WakeOnLan": ("WakeOnLan",),
    "Cloud": ("On",),
    "None": (),
}
SHUTDOWN_REQUEST_ACTIONS: frozenset[str] = frozenset(
    {"GracefulShutdown", "SshPoweroff", "ForceOff"}
)

_ZERO = timedelta(0)
_NO_EVIDENCE: tuple[Evidence, ...] = ()


def _ev(name: str, value: EvidenceValue, reading: Reading | None) -> Evidence:
    if reading is None:
        return Evidence(name, value, "-", None)
    return Evidence(name, value, reading.source, reading.observed_at)


def _result(
    gate: GateName,
    reasons: list[ReasonCode],
    evidence: tuple[Evidence, ...],
    recheck_at: datetime | None = None,
    waived: bool = False,
) -> GateResult:
    if reasons and not waived:
        return GateResult(gate, Verdict.FAIL, tuple(reasons), evidence, recheck_at)
    return GateResult(
        gate, Verdict.WAIVED if waived else Verdict.PASS, tuple(reasons), evidence, None
    )


# -- gates shared by both directions ----------------------------------------------------


def _policy_gate(policy: PolicyView) -> GateResult:
    cached: GateResult | None = policy.memo.get("policy_gate")
    if cached is None:
        cached = policy.memo["policy_gate"] = _compute_policy_gate(policy)
    return cached


def _compute_policy_gate(policy: PolicyView) -> GateResult:
    version = policy.version
    evidence: tuple[Evidence, ...] = (
        Evidence("policy", version.label(), "PowerPolicy/" + version.name, None),
    )
    reasons: list[ReasonCode] = []
    if policy.problems:
        reasons.append(R.POLICY_INVALID)
        evidence = evidence + tuple(
            Evidence("problem", p, "PowerPolicy/" + version.name, None) for p in policy.problems
        )
    if policy.paused:
        reasons.append(R.POLICY_PAUSED)
    return _result(GateName.POLICY, reasons, evidence)


@dataclass(slots=True)
class _Desire:
    gate: GateResult
    forced: bool


_DEFAULT_DESIRED_EVIDENCE = (
    Evidence("spec.power/idleBehavior", "Auto/run", "default (not supplied)"),
)


def _desired_gate(facts: NodeFacts, shutdown: bool) -> _Desire:
    """Is the transition wanted? A pinned spec.power wins over everything (a node pinned
    On is never switched off, one pinned Off never woken, manual intents included);
    then a manual intent; then spec.power / idleBehavior; then the policy."""
    intent = facts.intent
    desired = facts.desired
    power = desired.power if desired is not None else "Auto"
    behavior = desired.idle_behavior if desired is not None else "run"
    evidence: tuple[Evidence, ...] = (
        (
            Evidence(
                "spec.power/idleBehavior",
                f"{power}/{behavior}",
                desired.source,
                desired.observed_at,
            ),
        )
        if desired is not None
        else _DEFAULT_DESIRED_EVIDENCE
    )
    if shutdown and power == "On":
        return _Desire(_result(GateName.DESIRED, [R.DESIRED_ON], evidence), False)
    if not shutdown and power == "Off":
        return _Desire(_result(GateName.DESIRED, [R.DESIRED_OFF], evidence), False)
    if intent is not None:
        evidence = (*evidence, _ev("intent", f"{intent.action} ({intent.name})", intent))
        action = intent.action
        if action == "Restart":
            return _Desire(_result(GateName.DESIRED, [R.INTENT_NOT_SUPPORTED], evidence), False)
        if action == "Drain":
            return _Desire(_result(GateName.DESIRED, [R.IDLE_BEHAVIOR_HOLD], evidence), False)
        if (action == "Shutdown") == shutdown:
            return _Desire(GateResult(GateName.DESIRED, Verdict.PASS, (), evidence), True)
        code = R.DESIRED_ON if shutdown else R.DESIRED_OFF
        return _Desire(_result(GateName.DESIRED, [code], evidence), False)
    if shutdown:
        if power == "Off":
            return _Desire(GateResult(GateName.DESIRED, Verdict.PASS, (), evidence), True)
        if behavior == "hold":
            return _Desire(_result(GateName.DESIRED, [R.IDLE_BEHAVIOR_HOLD], evidence), False)
        return _Desire(
            GateResult(GateName.DESIRED, Verdict.PASS, (), evidence), behavior == "drain"
        )
    if power == "On":
        return _Desire(GateResult(GateName.DESIRED, Verdict.PASS, (), evidence), True)
    if behavior != "run":
        return _Desire(_result(GateName.DESIRED, [R.IDLE_BEHAVIOR_HOLD], evidence), False)
    return _Desire(GateResult(GateName.DESIRED, Verdict.PASS, (), evidence), False)


@dataclass(slots=True)
class _Freshness:
    gate: GateResult
    stale: tuple[FactName, ...]
    missing: tuple[FactName, ...]
    oldest: datetime | None


def _telemetry_gate(
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
    oldest_name = ""
    future_limit = now + CLOCK_SKEW_TOLERANCE
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
        elif now - at > max_age:
            stale.append(name)
            aged = True
            evidence.append(Evidence(name, "stale", reading.source, at))
    if not evidence:
        if oldest_reading is not None:
            evidence.append(
                Evidence(f"oldest: {oldest_name}", "fresh", oldest_reading.source, oldest)
            )
        return _Freshness(
            GateResult(GateName.TELEMETRY, Verdict.PASS, (), tuple(evidence)), (), (), oldest
        )
    reasons: list[ReasonCode] = []
    if aged:
        reasons.append(R.TELEMETRY_STALE)
    if missing:
        reasons.append(R.TELEMETRY_MISSING)
    if future:
        reasons.append(R.TELEMETRY_FROM_FUTURE)
    gate = GateResult(GateName.TELEMETRY, Verdict.FAIL, tuple(reasons), tuple(evidence))
    return _Freshness(gate, tuple(stale), tuple(missing), oldest)


def _cooldown(state: NodePowerState | None, now: datetime, policy: PolicyView) -> TimingMeasure:
    last = state.last_transition_at if state is not None else None
    required = policy.cooldown.total_seconds()
    if last is None:
        return TimingMeasure("cooldown", required, None, None, True)
    measured = now - last
    return TimingMeasure(
        "cooldown", required, measured.total_seconds(), last, measured >= policy.cooldown
    )


def _capability_gate(
    facts: NodeFacts, policy: PolicyView, table: dict[str, tuple[ResetAction, ...]]
) -> tuple[GateResult, ResetAction | None]:
    cap = facts.capability
    evidence: tuple[Evidence, ...]
    if cap is None:
        evidence = (Evidence("controlMethod", "unknown", "-", None),)
        return _result(GateName.CAPABILITY, [R.POWER_CONTROL_UNAVAILABLE], evidence), None
    candidates = table.get(cap.control_method, ())
    allowable = cap.allowable
    evidence = (
        _ev("controlMethod", cap.control_method, cap),
        _ev("allowable", "unknown" if allowable is None else ",".join(allowable) or "none", cap),
    )
    if not candidates or allowable is None:
        return _result(GateName.CAPABILITY, [R.POWER_CONTROL_UNAVAILABLE], evidence), None
    supported = [a for a in candidates if a in allowable]
    if not supported:
        return _result(GateName.CAPABILITY, [R.POWER_CONTROL_UNAVAILABLE], evidence), None
    permitted = [a for a in supported if a in policy.allowed_actions]
    if not permitted:
        evidence = (
            *evidence,
            Evidence(
                "policy.allowedActions",
                ",".join(sorted(policy.allowed_actions)),
                "PowerPolicy/" + policy.version.name,
                None,
            ),
        )
        return _result(GateName.CAPABILITY, [R.ACTION_NOT_ALLOWED], evidence), None
    return GateResult(GateName.CAPABILITY, Verdict.PASS, (), evidence), permitted[0]


def _fleet_gate(
    facts: NodeFacts,
    policy: PolicyView,
    state: NodePowerState | None,
    kind: TransitionKind,
    check_warm: bool,
) -> GateResult:
    fleet = facts.fleet
    if fleet is None:
        return GateResult(
            GateName.FLEET, Verdict.SKIPPED, (), (Evidence("fleet", "not supplied", "-", None),)
        )
    reasons: list[ReasonCode] = []
    own = state is not None and state.transition is not None and state.transition.kind is kind
    evidence = (
        _ev("transitionsInProgress", fleet.transitions_in_progress, fleet),
        _ev("maxConcurrentTransitions", policy.max_concurrent_transitions, None),
        _ev("warmIdleNodes", fleet.warm_idle_nodes, fleet),
    )
    if not own and fleet.transitions_in_progress >= policy.max_concurrent_transitions:
        reasons.append(R.DISRUPTION_BUDGET_EXHAUSTED)
    if check_warm and fleet.warm_idle_nodes < policy.min_warm_nodes:
        reasons.append(R.MIN_WARM_NODES)
    return _result(GateName.FLEET, reasons, evidence)


_CLASS_OF: dict[ReasonCode, DecisionClass] = {code: decision_class(code) for code in ReasonCode}
_BY_STRENGTH: tuple[tuple[DecisionClass, Decision], ...] = (
    (DecisionClass.NONE, Decision.NONE),
    (DecisionClass.BLOCK, Decision.BLOCK),
    (DecisionClass.DEFER, Decision.DEFER),
    (DecisionClass.DRAIN, Decision.DRAIN),
)


def _decide(
    gates: tuple[GateResult, ...],
    success: Decision,
    overrides: dict[ReasonCode, DecisionClass],
    applied: tuple[str, ...],
) -> tuple[Decision, tuple[ReasonCode, ...]]:
    """Pick the decision from the failing gates' codes (strongest class first) and order
    the codes with the decisive class first, the others after, each in gate order."""
    failing: list[ReasonCode] = []
    for g in gates:
        if g.verdict is Verdict.FAIL:
            for code in g.reasons:
                if code not in failing:
                    failing.append(code)
    if not failing:
        codes = (R.GATES_PASSED, R.OVERRIDE_APPLIED) if applied else (R.GATES_PASSED,)
        return success, codes
    classes = [overrides.get(c) or _CLASS_OF[c] for c in failing]
    for cls, decision in _BY_STRENGTH:
        if cls in classes:
            first = [c for c, k in zip(failing, classes, strict=True) if k is cls]
            rest = [c for c, k in zip(failing, classes, strict=True) if k is not cls]
            return decision, (*first, *rest)
    return Decision.DEFER, tuple(failing)


def _latest(*times: datetime | None) -> datetime | None:
    known = [t for t in times if t is not None]
    return max(known) if known else None


# -- shutdown ---------------------------------------------------------------------------


def _override_allowed(intent: ManualIntent | None, policy: PolicyView) -> bool:
    if intent is None or intent.override is None or not intent.override.inhibitors:
        return False
    if not policy.override_permitted:
        return False
    return not policy.override_requesters or intent.requested_by in policy.override_requesters


def force_off_permitted(facts: NodeFacts, policy: PolicyView) -> bool:
    """Whether ForceOff may follow a failed GracefulShutdown: only with a Manual Shutdown
    intent carrying override.forceOff, a policy with permitForceOff (requester allowed),
    ForceOff listed in allowedActions and allowable on the node."""
    intent = facts.intent
    if intent is None or intent.action != "Shutdown" or intent.override is None:
        return False
    if not intent.override.force_off or not policy.permit_force_off:
        return False
    if policy.override_requesters and intent.requested_by not in policy.override_requesters:
        return False
    if "ForceOff" not in policy.allowed_actions:
        return False
    cap = facts.capability
    return cap is not None and cap.allowable is not None and "ForceOff" in cap.allowable


def evaluate_shutdown(
    facts: NodeFacts, now: datetime, policy: PolicyView, state: NodePowerState | None = None
) -> Evaluation:
    """Evaluate every shutdown gate for `facts` at `now` (see module docstring)."""
    require_aware(now)
    max_age = policy.telemetry_max_age
    policy_gate = _policy_gate(policy)
    desire = _desired_gate(facts, shutdown=True)
    forced = desire.forced
    admission = state.admission if state is not None else AdmissionState.CLOSED
    floor: datetime | None = None
    if admission is AdmissionState.CLOSED:
        floor = state.admission_since if state is not None else None
        transition = state.transition if state is not None else None
        if transition is not None and transition.kind is TransitionKind.SHUTDOWN:
            floor = _latest(floor, transition.started_at) if floor is not None else None
    refresh: list[FactName] = []

    # demand
    demand = facts.demand
    d_reasons: list[ReasonCode] = []
    if demand is None:
        d_reasons.append(R.TELEMETRY_MISSING)
        d_evidence: tuple[Evidence, ...] = (Evidence("queued", "missing", "-", None),)
    else:
        d_evidence = (_ev("queued", demand.queued, demand),)
        if demand.queued > 0:
            d_reasons.append(R.DEMAND_PRESENT)
        if admission is AdmissionState.CLOSED and (floor is None or demand.observed_at < floor):
            d_reasons.append(R.DEMAND_NOT_REREAD)
            refresh.append("demand")
    demand_gate = _result(GateName.DEMAND, d_reasons, d_evidence)

    # work / drain
    work = facts.work
    w_reasons: list[ReasonCode] = []
    admission_ev = Evidence(
        "admission", admission.value, "nodewarden", state.admission_since if state else None
    )
    if work is None:
        w_reasons.append(R.TELEMETRY_MISSING)
        w_evidence: tuple[Evidence, ...] = (
            Evidence("activeJobs", "missing", "-", None),
            admission_ev,
        )
    else:
        w_evidence = (_ev("activeJobs", work.active_jobs, work), admission_ev)
        if admission is not AdmissionState.CLOSED:
            if work.active_jobs > 0 and not forced:
                w_reasons.append(R.ACTIVE_WORK)
            else:
                w_reasons.append(R.ADMISSION_OPEN)
        elif work.active_jobs > 0 or floor is None or work.observed_at < floor:
            w_reasons.append(R.DRAIN_INCOMPLETE)
            refresh.append("work")
    work_gate = _result(GateName.WORK, w_reasons, w_evidence)

    # telemetry freshness
    fresh = _telemetry_gate(
        (
            ("demand", demand),
            ("work", work),
            ("power", facts.power),
            ("inhibitors", facts.inhibitors),
        ),
        now,
        max_age,
    )
    for name in fresh.stale + fresh.missing:
        if name not in refresh:
            refresh.append(name)

    # observed power
    power = facts.power
    if power is None:
        power_gate = _result(
            GateName.POWER, [R.TELEMETRY_MISSING], (Evidence("power", "missing", "-", None),)
        )
    else:
        p_ev = (_ev("power", power.power, power),)
        if power.power == "On":
            power_gate = GateResult(GateName.POWER, Verdict.PASS, (), p_ev)
        elif power.power == "Off":
            power_gate = _result(GateName.POWER, [R.ALREADY_OFF], p_ev)
        else:
            power_gate = _result(GateName.POWER, [R.POWER_STATE_UNKNOWN], p_ev)

    # timing
    timing_gate, timing = _shutdown_timing(facts, now, policy, state, forced)

    # inhibitors
    inhibitors = facts.inhibitors
    applied: tuple[str, ...] = ()
    if inhibitors is None:
        inhibitor_gate = _result(
            GateName.INHIBITORS,
            [R.TELEMETRY_MISSING],
            (Evidence("inhibitors", "missing", "-", None),),
        )
    else:
        blocking = inhibitors.blocking
        if not blocking:
            inhibitor_gate = GateResult(
                GateName.INHIBITORS,
                Verdict.PASS,
                (),
                (
                    Evidence(
                        "blocking",
                        f"0 of {len(inhibitors.inhibitors)} held",
                        inhibitors.source,
                        inhibitors.observed_at,
                    ),
                ),
            )
        else:
            i_ev = tuple(
                _ev("inhibitor", f"{i.what} by {i.who or '?'} ({i.mode}): {i.why}", inhibitors)
                for i in blocking
            )
            intent = facts.intent
            wants_override = (
                intent is not None
                and intent.action == "Shutdown"
                and intent.override is not None
                and intent.override.inhibitors
            )
            if wants_override and _override_allowed(intent, policy):
                assert intent is not None
                i_ev = (
                    *i_ev,
                    _ev("override", f"{intent.name} by {intent.requested_by or '?'}", intent),
                )
                inhibitor_gate = _result(
                    GateName.INHIBITORS, [R.INHIBITOR_ACTIVE, R.OVERRIDE_APPLIED], i_ev, waived=True
                )
                applied = ("inhibitors",)
            elif wants_override:
                inhibitor_gate = _result(
                    GateName.INHIBITORS, [R.INHIBITOR_ACTIVE, R.OVERRIDE_NOT_PERMITTED], i_ev
                )
            else:
                inhibitor_gate = _result(GateName.INHIBITORS, [R.INHIBITOR_ACTIVE], i_ev)

    capability_gate, action = _capability_gate(facts, policy, SHUTDOWN_ACTIONS)
    fleet_gate = _fleet_gate(facts, policy, state, TransitionKind.SHUTDOWN, check_warm=not forced)

    gates = (
        policy_gate,
        desire.gate,
        demand_gate,
        work_gate,
        fresh.gate,
        power_gate,
        timing_gate,
        inhibitor_gate,
        capability_gate,
        fleet_gate,
    )
    overrides: dict[ReasonCode, DecisionClass] = (
        {R.DEMAND_PRESENT: DecisionClass.DEFER} if forced else {}
    )
    decision, reasons = _decide(gates, Decision.SHUTDOWN, overrides, applied)
    recheck = None
    if decision is Decision.DEFER:
        recheck = _latest(*(g.recheck for g in gates))
    return Evaluation(
        kind="shutdown",
        decision=decision,
        reasons=reasons,
        gates=gates,
        action=action,
        recheck_at=recheck,
        overrides_applied=applied,
        timing=timing,
        stale=fresh.stale,
        missing=fresh.missing,
        oldest_observed_at=fresh.oldest,
        refresh=tuple(refresh),
        forced=forced,
    )


def _on_since(
    facts: NodeFacts, state: NodePowerState | None
) -> tuple[datetime | None, str, datetime | None]:
    """When the node came on (the later of the node's boot time and nodewarden's record),
    who says so, and when that was observed."""
    uptime = facts.uptime
    from_facts = uptime.on_since if uptime is not None else None
    from_state = state.on_since if state is not None else None
    if from_facts is not None and (from_state is None or from_facts >= from_state):
        assert uptime is not None
        return from_facts, uptime.source, uptime.observed_at
    if from_state is not None:
        return from_state, "nodewarden", from_state
    return None, "-", None


def _shutdown_timing(
    facts: NodeFacts,
    now: datetime,
    policy: PolicyView,
    state: NodePowerState | None,
    forced: bool,
) -> tuple[GateResult, tuple[TimingMeasure, ...]]:
    reasons: list[ReasonCode] = []
    rechecks: list[datetime] = []
    measures: list[TimingMeasure] = []
    evidence: list[Evidence] = []
    # idle threshold
    threshold = policy.idle_threshold
    work = facts.work
    draining = (
        state is not None
        and state.transition is not None
        and state.transition.kind is TransitionKind.SHUTDOWN
    )
    if draining and not forced:
        # Checked when the drain began; from then on the work gate (drain complete) rules.
        measures.append(
            TimingMeasure("idleThreshold", threshold.total_seconds(), None, None, None, True)
        )
        evidence.append(Evidence("idleThreshold", "checked at drain start", "nodewarden", None))
    elif forced:
        measures.append(
            TimingMeasure("idleThreshold", threshold.total_seconds(), None, None, None, True)
        )
        evidence.append(Evidence("idleThreshold", "waived", "intent/spec", None))
    elif work is None:
        measures.append(TimingMeasure("idleThreshold", threshold.total_seconds(), None, None, None))
        reasons.append(R.TELEMETRY_MISSING)
        evidence.append(Evidence("idleForSeconds", "missing", "-", None))
    elif work.active_jobs > 0:
        measures.append(TimingMeasure("idleThreshold", threshold.total_seconds(), 0.0, None, False))
        reasons.append(R.IDLE_WINDOW_NOT_MET)
        evidence.append(_ev("idleForSeconds", "busy", work))
    elif work.idle_since is None:
        measures.append(TimingMeasure("idleThreshold", threshold.total_seconds(), None, None, None))
        reasons.append(R.TELEMETRY_MISSING)
        evidence.append(_ev("idleSince", "missing", work))
    else:
        idle_for = now - work.idle_since
        met = idle_for >= threshold
        measures.append(
            TimingMeasure(
                "idleThreshold",
                threshold.total_seconds(),
                idle_for.total_seconds(),
                work.idle_since,
                met,
            )
        )
        evidence.append(_ev("idleForSeconds", idle_for.total_seconds(), work))
        if not met:
            reasons.append(R.IDLE_WINDOW_NOT_MET)
            rechecks.append(work.idle_since + threshold)
    # min-on
    on_since, on_source, on_seen = _on_since(facts, state)
    min_on = policy.min_on
    if on_since is None:
        measures.append(TimingMeasure("minOn", min_on.total_seconds(), None, None, None))
        reasons.append(R.TELEMETRY_MISSING)
        evidence.append(Evidence("upForSeconds", "missing", "-", None))
    else:
        up = now - on_since
        met = up >= min_on
        measures.append(
            TimingMeasure("minOn", min_on.total_seconds(), up.total_seconds(), on_since, met)
        )
        evidence.append(Evidence("upForSeconds", up.total_seconds(), on_source, on_seen))
        if not met:
            reasons.append(R.MIN_ON_NOT_MET)
            rechecks.append(on_since + min_on)
    # cooldown
    cool = _cooldown(state, now, policy)
    measures.append(cool)
    evidence.append(
        Evidence(
            "sinceLastTransitionSeconds",
            "never" if cool.measured is None else cool.measured,
            "nodewarden",
            cool.since,
        )
    )
    if not cool.met:
        reasons.append(R.COOLDOWN)
        assert cool.since is not None
        rechecks.append(cool.since + policy.cooldown)
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
        measures.append(
            TimingMeasure(
                "billingWindow",
                policy.billing_period.total_seconds(),
                (now - on_since).total_seconds(),
                on_since,
                is_open,
            )
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
    recheck = max(rechecks) if rechecks else None
    return _result(GateName.TIMING, reasons, tuple(evidence), recheck), tuple(measures)


# -- wake -------------------------------------------------------------------------------


def evaluate_wake(
    facts: NodeFacts, now: datetime, policy: PolicyView, state: NodePowerState | None = None
) -> Evaluation:
    """Evaluate every wake gate for `facts` at `now` (see module docstring)."""
    require_aware(now)
    policy_gate = _policy_gate(policy)
    desire = _desired_gate(facts, shutdown=False)
    forced = desire.forced
    refresh: list[FactName] = []

    demand = facts.demand
    if forced:
        demand_gate = GateResult(
            GateName.DEMAND,
            Verdict.WAIVED,
            (),
            (_ev("queued", demand.queued if demand else "not needed", demand),),
        )
    elif demand is None:
        demand_gate = _result(
            GateName.DEMAND, [R.TELEMETRY_MISSING], (Evidence("queued", "missing", "-", None),)
        )
    elif demand.queued == 0:
        demand_gate = _result(GateName.DEMAND, [R.NO_DEMAND], (_ev("queued", 0, demand),))
    else:
        demand_gate = GateResult(
            GateName.DEMAND, Verdict.PASS, (), (_ev("queued", demand.queued, demand),)
        )

    named: tuple[tuple[FactName, Reading | None], ...] = (
        (("power", facts.power),) if forced else (("demand", demand), ("power", facts.power))
    )
    fresh = _telemetry_gate(named, now, policy.telemetry_max_age)
    refresh.extend(fresh.stale + fresh.missing)

    power = facts.power
    if power is None:
        power_gate = _result(
            GateName.POWER, [R.TELEMETRY_MISSING], (Evidence("power", "missing", "-", None),)
        )
    else:
        p_ev = (_ev("power", power.power, power),)
        if power.power == "Off":
            power_gate = GateResult(GateName.POWER, Verdict.PASS, (), p_ev)
        elif power.power == "On":
            power_gate = _result(GateName.POWER, [R.ALREADY_ON], p_ev)
        else:
            power_gate = _result(GateName.POWER, [R.POWER_STATE_UNKNOWN], p_ev)

    timing_gate, timing = _wake_timing(now, policy, state)

    capability_gate, action = _capability_gate(facts, policy, WAKE_ACTIONS)
    fleet_gate = _fleet_gate(facts, policy, state, TransitionKind.WAKE, check_warm=False)
    gates = (
        policy_gate,
        desire.gate,
        demand_gate,
        fresh.gate,
        power_gate,
        timing_gate,
        capability_gate,
        fleet_gate,
    )
    decision, codes = _decide(gates, Decision.START, {}, ())
    recheck = _latest(*(g.recheck for g in gates)) if decision is Decision.DEFER else None
    return Evaluation(
        kind="wake",
        decision=decision,
        reasons=codes,
        gates=gates,
        action=action,
        recheck_at=recheck,
        overrides_applied=(),
        timing=timing,
        stale=fresh.stale,
        missing=fresh.missing,
        oldest_observed_at=fresh.oldest,
        refresh=tuple(refresh),
        forced=forced,
    )


def _wake_timing(
    now: datetime, policy: PolicyView, state: NodePowerState | None
) -> tuple[GateResult, tuple[TimingMeasure, ...]]:
    reasons: list[ReasonCode] = []
    rechecks: list[datetime] = []
    evidence: list[Evidence] = []
    min_off = policy.min_off
    off_since = state.off_since if state is not None else None
    if off_since is None:
        off_measure = TimingMeasure("minOff", min_off.total_seconds(), None, None, None)
        reasons.append(R.TELEMETRY_MISSING)
        evidence.append(Evidence("offForSeconds", "missing", "-", None))
    else:
        off_for = now - off_since
        met = off_for >= min_off
        off_measure = TimingMeasure(
            "minOff", min_off.total_seconds(), off_for.total_seconds(), off_since, met
        )
        evidence.append(Evidence("offForSeconds", off_for.total_seconds(), "nodewarden", off_since))
        if not met:
            reasons.append(R.MIN_OFF_NOT_MET)
            rechecks.append(off_since + min_off)
    cool = _cooldown(state, now, policy)
    evidence.append(
        Evidence(
            "sinceLastTransitionSeconds",
            "never" if cool.measured is None else cool.measured,
            "nodewarden",
            cool.since,
        )
    )
    if not cool.met:
        reasons.append(R.COOLDOWN)
        assert cool.since is not None
        rechecks.append(cool.since + policy.cooldown)
    gate = _result(GateName.TIMING, reasons, tuple(evidence), max(rechecks) if rechecks else None)

    return gate, (off_measure, cool)


def timing_measures(
    facts: NodeFacts, now: datetime, policy: PolicyView, state: NodePowerState
) -> tuple[TimingMeasure, ...]:
    """The timing values and measurements that matter in `state` (for records of steps
    that made no gate evaluation): min-off and cooldown while off or waking, else idle
    threshold, min-on and cooldown."""
    if state.state in (PowerState.OFF, PowerState.WAKING):
        return _wake_timing(now, policy, state)[1]
    return _shutdown_timing(facts, now, policy, state, forced=False)[1]
