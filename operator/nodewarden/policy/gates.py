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
    identity    Redfish power-off: the BMC's ComputerSystem.UUID equals the host's DMI
                product UUID read over SSH (no older than telemetryMaxAge); a mismatch,
                an unreadable UUID or a BMC without one BLOCKs; a UUID not read yet or
                too long ago DEFERs; only a Manual intent with an audited override
                (recordedIdentity) may rely on the match recorded at enrolment instead
                (SKIPPED for other control methods)
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
from typing import Literal, TypeAlias

from nodewarden.api.powerpolicy import ResetAction
from nodewarden.api.workernode import NodeType
from nodewarden.policy.base import CLOCK_SKEW_TOLERANCE, require_aware
from nodewarden.policy.facts import (
    CapabilityReading,
    DemandReading,
    DesiredReading,
    FactName,
    FleetReading,
    IdentityReading,
    ManualIntent,
    NodeFacts,
    PowerReading,
    Reading,
    UptimeReading,
    WorkReading,
)
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
    IDENTITY = "identity"
    """Redfish power-off: the BMC manages the host whose facts were read (UUIDs match)."""
    FLEET = "fleet"
    NODE_MANAGER = "nodeManager"
    """Cloud VMs: which node-manager rule fired (nodewarden.policy.cloudvm)."""


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
    construction costs 4x more and a fleet evaluation builds ~25 per node; they are
    created fresh for every evaluation (except the few that depend on no input or only
    on the policy, which are built once and shared) and must be treated as read-only.
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


def _evaluation(
    *,
    kind: Literal["shutdown", "wake"],
    decision: Decision,
    reasons: tuple[ReasonCode, ...],
    gates: tuple[GateResult, ...],
    action: ResetAction | None,
    recheck_at: datetime | None,
    overrides_applied: tuple[str, ...],
    timing: tuple[TimingMeasure, ...],
    stale: tuple[FactName, ...],
    missing: tuple[FactName, ...],
    oldest_observed_at: datetime | None,
    refresh: tuple[FactName, ...],
    forced: bool,
) -> Evaluation:
    """`Evaluation(...)`, named at the call sites and positional here: keyword arguments
    to a class are packed into a dict for `__init__`, which doubles the cost."""
    return Evaluation(
        kind,
        decision,
        reasons,
        gates,
        action,
        recheck_at,
        overrides_applied,
        timing,
        stale,
        missing,
        oldest_observed_at,
        refresh,
        forced,
    )


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

# -- hot-path names ---------------------------------------------------------------------
# Enum members bound to module names. On Python 3.11 reading a member off its class
# (`Verdict.PASS`) goes through EnumType.__getattr__ and costs ~80 ns, and a fleet
# evaluation reads dozens per node; these are the same objects (`_PASS is Verdict.PASS`).
_PASS, _FAIL, _WAIVED, _SKIPPED = Verdict.PASS, Verdict.FAIL, Verdict.WAIVED, Verdict.SKIPPED
_G_POLICY, _G_DESIRED, _G_DEMAND, _G_WORK, _G_TELEMETRY = (
    GateName.POLICY,
    GateName.DESIRED,
    GateName.DEMAND,
    GateName.WORK,
    GateName.TELEMETRY,
)
_G_POWER, _G_TIMING, _G_INHIBITORS, _G_CAPABILITY, _G_FLEET = (
    GateName.POWER,
    GateName.TIMING,
    GateName.INHIBITORS,
    GateName.CAPABILITY,
    GateName.FLEET,
)
_CLOSED = AdmissionState.CLOSED
_SHUTDOWN_KIND, _WAKE_KIND = TransitionKind.SHUTDOWN, TransitionKind.WAKE
_SHUTDOWN, _START, _DEFER = Decision.SHUTDOWN, Decision.START, Decision.DEFER
_ADMISSION_TEXT: dict[AdmissionState, str] = {a: a.value for a in AdmissionState}

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
        return GateResult(gate, _FAIL, tuple(reasons), evidence, recheck_at)
    return GateResult(gate, _WAIVED if waived else _PASS, tuple(reasons), evidence, None)


# -- gates shared by both directions ----------------------------------------------------
#
# Gate results that depend on nothing but the policy, or on no input at all (the policy
# gate, the desired gate when neither spec.power nor an intent is supplied, the fleet
# gate without a fleet reading), are built once and shared by every evaluation, like the
# constant evidence they hold. Gate results are read-only (see Evidence).
#
# The gate helpers take the readings they judge rather than the whole NodeFacts, and
# each reading's fields are read once into locals: attribute reads on pydantic models
# cost ~4x those on plain objects, and a fleet evaluation makes ~100 per node.


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
    return _result(_G_POLICY, reasons, evidence)


_DEFAULT_DESIRED_EVIDENCE = (
    Evidence("spec.power/idleBehavior", "Auto/run", "default (not supplied)"),
)
_DEFAULT_DESIRED_PASS = GateResult(_G_DESIRED, _PASS, (), _DEFAULT_DESIRED_EVIDENCE)


def _desired_gate(
    desired: DesiredReading | None, intent: ManualIntent | None, shutdown: bool
) -> tuple[GateResult, bool]:
    """Is the transition wanted, and is it forced (manual, or pinned by spec.power)?

    A pinned spec.power wins over everything (a node pinned On is never switched off,
    one pinned Off never woken, manual intents included); then a manual intent; then
    spec.power / idleBehavior; then the policy."""
    if desired is None and intent is None:
        # Auto/run and no intent: wanted if the other gates agree, never forced.
        return _DEFAULT_DESIRED_PASS, False
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
        return _result(_G_DESIRED, [R.DESIRED_ON], evidence), False
    if not shutdown and power == "Off":
        return _result(_G_DESIRED, [R.DESIRED_OFF], evidence), False
    if intent is not None:
        evidence = (*evidence, _ev("intent", f"{intent.action} ({intent.name})", intent))
        action = intent.action
        if action == "Restart":
            return _result(_G_DESIRED, [R.INTENT_NOT_SUPPORTED], evidence), False
        if action == "Drain":
            return _result(_G_DESIRED, [R.IDLE_BEHAVIOR_HOLD], evidence), False
        if (action == "Shutdown") == shutdown:
            return GateResult(_G_DESIRED, _PASS, (), evidence), True
        code = R.DESIRED_ON if shutdown else R.DESIRED_OFF
        return _result(_G_DESIRED, [code], evidence), False
    if shutdown:
        if power == "Off":
            return GateResult(_G_DESIRED, _PASS, (), evidence), True
        if behavior == "hold":
            return _result(_G_DESIRED, [R.IDLE_BEHAVIOR_HOLD], evidence), False
        return GateResult(_G_DESIRED, _PASS, (), evidence), behavior == "drain"
    if power == "On":
        return GateResult(_G_DESIRED, _PASS, (), evidence), True
    if behavior != "run":
        return _result(_G_DESIRED, [R.IDLE_BEHAVIOR_HOLD], evidence), False
    return GateResult(_G_DESIRED, _PASS, (), evidence), False


_Freshness: TypeAlias = tuple[
    GateResult, tuple[FactName, ...], tuple[FactName, ...], datetime | None
]
"""The telemetry gate, the stale and the missing readings' names, the oldest reading's time."""


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
        fresh_evidence: tuple[Evidence, ...] = ()
        if oldest_reading is not None:
            fresh_evidence = (
                Evidence(f"oldest: {oldest_name}", "fresh", oldest_reading.source, oldest),
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


def _power_gate(
    power: PowerReading | None, wanted: Literal["On", "Off"], already: ReasonCode
) -> GateResult:
    """Observed power is `wanted` (from a trusted source); `already` if it is the other one."""
    if power is None:
        return _result(_G_POWER, [R.TELEMETRY_MISSING], (Evidence("power", "missing", "-", None),))
    value = power.power
    evidence = (Evidence("power", value, power.source, power.observed_at),)
    if value == wanted:
        return GateResult(_G_POWER, _PASS, (), evidence)
    if value == "On" or value == "Off":
        return GateResult(_G_POWER, _FAIL, (already,), evidence)
    return GateResult(_G_POWER, _FAIL, (R.POWER_STATE_UNKNOWN,), evidence)


def _cooldown(
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
    required = policy.seconds.cooldown
    if last is None:
        evidence.append(Evidence("sinceLastTransitionSeconds", "never", "nodewarden", None))
        return TimingMeasure("cooldown", required, None, None, True)
    measured = now - last
    seconds = measured.total_seconds()
    evidence.append(Evidence("sinceLastTransitionSeconds", seconds, "nodewarden", last))
    met = measured >= policy.cooldown
    if not met:
        reasons.append(R.COOLDOWN)
        rechecks.append(last + policy.cooldown)
    return TimingMeasure("cooldown", required, seconds, last, met)


def _capability_gate(
    cap: CapabilityReading | None, policy: PolicyView, table: dict[str, tuple[ResetAction, ...]]
) -> tuple[GateResult, ResetAction | None]:
    evidence: tuple[Evidence, ...]
    if cap is None:
        evidence = (Evidence("controlMethod", "unknown", "-", None),)
        return _result(_G_CAPABILITY, [R.POWER_CONTROL_UNAVAILABLE], evidence), None
    method = cap.control_method
    allowable = cap.allowable
    source, seen = cap.source, cap.observed_at
    evidence = (
        Evidence("controlMethod", method, source, seen),
        Evidence(
            "allowable",
            "unknown" if allowable is None else ",".join(allowable) or "none",
            source,
            seen,
        ),
    )
    if cap.refusal is not None:
        evidence = (*evidence, Evidence("credentials", cap.refusal, source, seen))
        return (
            _result(_G_CAPABILITY, [R.CREDENTIALS_REFUSED, R.POWER_CONTROL_UNAVAILABLE], evidence),
            None,
        )
    candidates = table.get(method, ())
    if not candidates or allowable is None:
        return _result(_G_CAPABILITY, [R.POWER_CONTROL_UNAVAILABLE], evidence), None
    # The first candidate (in table order) the node allows and the policy permits.
    supported = False
    for candidate in candidates:
        if candidate in allowable:
            supported = True
            if candidate in policy.allowed_actions:
                return GateResult(_G_CAPABILITY, _PASS, (), evidence), candidate
    if not supported:
        return _result(_G_CAPABILITY, [R.POWER_CONTROL_UNAVAILABLE], evidence), None
    evidence = (
        *evidence,
        Evidence(
            "policy.allowedActions",
            ",".join(sorted(policy.allowed_actions)),
            "PowerPolicy/" + policy.version.name,
            None,
        ),
    )
    return _result(_G_CAPABILITY, [R.ACTION_NOT_ALLOWED], evidence), None


_IDENTITY_NOT_NEEDED = GateResult(
    GateName.IDENTITY,
    _SKIPPED,
    (),
    (Evidence("identity", "power-off does not go through a BMC", "-", None),),
)


def _identity_gate(
    identity: IdentityReading | None,
    cap: CapabilityReading | None,
    intent: ManualIntent | None,
    now: datetime,
    max_age: timedelta,
    refresh: list[FactName],
) -> tuple[GateResult, bool]:
    """Does the BMC that would switch the node off manage the host whose work, inhibitors
    and uptime were read? (docs/security.md, "One machine, one BMC"). The gate result and
    whether an audited override let the recorded match stand in."""
    if cap is None or cap.control_method != "Redfish":
        return _IDENTITY_NOT_NEEDED, False
    if identity is None or identity.bmc_uuid is None:
        evidence = (Evidence("bmcUuid", "unknown", "-", None),)
        refresh.append("identity")
        return _result(GateName.IDENTITY, [R.IDENTITY_UNVERIFIED], evidence), False
    bmc = identity.bmc_uuid
    evidence_list = [Evidence("bmcUuid", bmc, identity.bmc_source, identity.bmc_observed_at)]
    host, host_at = identity.host_uuid, identity.host_observed_at
    evidence_list.append(
        Evidence(
            "hostUuid",
            host if host is not None else f"unreadable: {identity.host_problem or 'not read'}",
            identity.host_source,
            host_at,
        )
    )
    if host is not None and host != bmc:
        return _result(GateName.IDENTITY, [R.IDENTITY_MISMATCH], tuple(evidence_list)), False
    fresh = (
        host_at is not None and host_at <= now + CLOCK_SKEW_TOLERANCE and now - host_at <= max_age
    )
    if host is not None and fresh:
        evidence_list.append(Evidence("match", True, identity.host_source, host_at))
        return GateResult(GateName.IDENTITY, _PASS, (), tuple(evidence_list)), False
    refresh.append("identity")
    # unreadable (the command failed) needs a person; not read yet, or read too long ago,
    # waits for the next probe like any other telemetry
    if host is None and identity.host_problem is not None:
        code = R.IDENTITY_UNVERIFIED
    else:
        code = R.TELEMETRY_MISSING if host_at is None else R.TELEMETRY_STALE
    recorded = identity.matched_at
    if recorded is not None and identity.matched_uuid == bmc:
        age = (now - recorded).total_seconds()
        evidence_list.append(
            Evidence(
                "recordedMatch",
                f"{identity.matched_uuid}, {age:.0f} s old",
                "status.enrolment",
                recorded,
            )
        )
    overridden = (
        intent is not None
        and intent.action == "Shutdown"
        and intent.override is not None
        and intent.override.recorded_identity
        and intent.requester_verified
        and recorded is not None
        and identity.matched_uuid == bmc
    )
    if overridden:
        assert intent is not None
        evidence_list.append(
            _ev("override", f"{intent.name} by {intent.requested_by} (recorded match)", intent)
        )
        return (
            _result(
                GateName.IDENTITY, [code, R.OVERRIDE_APPLIED], tuple(evidence_list), waived=True
            ),
            True,
        )
    return _result(GateName.IDENTITY, [code], tuple(evidence_list)), False


_FLEET_NOT_SUPPLIED = GateResult(
    _G_FLEET, _SKIPPED, (), (Evidence("fleet", "not supplied", "-", None),)
)


def _fleet_gate(
    fleet: FleetReading | None,
    policy: PolicyView,
    own_transition: bool,
    check_warm: bool,
    check_budget: bool = True,
    state: NodePowerState | None = None,
) -> GateResult:
    """Disruption budget (a transition of this kind already in progress on the node is
    counted in it; unless `check_budget` is off) and, if `check_warm`, the minimum of warm
    idle nodes: the warm idle nodes left once this one goes (it is one of them while it
    is idle with admission open)."""
    if fleet is None:
        return _FLEET_NOT_SUPPLIED
    reasons: list[ReasonCode] = []
    counted = (
        state is not None
        and state.state is PowerState.ON_IDLE
        and state.admission is AdmissionState.OPEN
    )
    left = max(0, fleet.warm_idle_nodes - (1 if counted else 0))
    evidence = (
        _ev("transitionsInProgress", fleet.transitions_in_progress, fleet),
        _ev("maxConcurrentTransitions", policy.max_concurrent_transitions, None),
        _ev("warmIdleNodes", fleet.warm_idle_nodes, fleet),
        _ev("warmIdleNodesLeft", left, fleet),
    )
    if (
        check_budget
        and not own_transition
        and fleet.transitions_in_progress >= policy.max_concurrent_transitions
    ):
        reasons.append(R.DISRUPTION_BUDGET_EXHAUSTED)
    if check_warm and left < policy.min_warm_nodes:
        reasons.append(R.MIN_WARM_NODES)
    return _result(_G_FLEET, reasons, evidence)


_BY_STRENGTH: tuple[tuple[DecisionClass, Decision], ...] = (
    (DecisionClass.NONE, Decision.NONE),
    (DecisionClass.BLOCK, Decision.BLOCK),
    (DecisionClass.DEFER, Decision.DEFER),
    (DecisionClass.DRAIN, Decision.DRAIN),
)
_NOT_DECISIVE = len(_BY_STRENGTH)
"""Rank of codes whose class decides nothing (PROGRESS)."""


def _ranks(classes: dict[ReasonCode, DecisionClass]) -> dict[ReasonCode, int]:
    """Each code's strength: its class's position in _BY_STRENGTH (0 = strongest)."""
    position = {cls: i for i, (cls, _) in enumerate(_BY_STRENGTH)}
    return {code: position.get(cls, _NOT_DECISIVE) for code, cls in classes.items()}


_CLASS_OF: dict[ReasonCode, DecisionClass] = {code: decision_class(code) for code in ReasonCode}
_RANK: dict[ReasonCode, int] = _ranks(_CLASS_OF)
_FORCED_SHUTDOWN_RANK: dict[ReasonCode, int] = _ranks(
    {**_CLASS_OF, R.DEMAND_PRESENT: DecisionClass.DEFER}
)
"""A manual or pinned shutdown waits for queued demand (DEFER) instead of dropping it."""
_GATES_PASSED = (R.GATES_PASSED,)
_GATES_PASSED_WITH_OVERRIDE = (R.GATES_PASSED, R.OVERRIDE_APPLIED)


def _decide(
    gates: tuple[GateResult, ...],
    success: Decision,
    rank: dict[ReasonCode, int],
    applied: tuple[str, ...],
) -> tuple[Decision, tuple[ReasonCode, ...]]:
    """Pick the decision from the failing gates' codes (strongest class first, `rank`
    says each code's class strength) and order the codes with the decisive class first,
    the others after, each in gate order."""
    failing: list[ReasonCode] = []
    for g in gates:
        if g.verdict is _FAIL:
            for code in g.reasons:
                if code not in failing:
                    failing.append(code)
    if not failing:
        return success, _GATES_PASSED_WITH_OVERRIDE if applied else _GATES_PASSED
    strongest = min([rank[c] for c in failing])
    if strongest == _NOT_DECISIVE:
        return _DEFER, tuple(failing)
    first: list[ReasonCode] = []
    rest: list[ReasonCode] = []
    for code in failing:
        (first if rank[code] == strongest else rest).append(code)
    return _BY_STRENGTH[strongest][1], (*first, *rest)


def _latest_recheck(gates: tuple[GateResult, ...]) -> datetime | None:
    """The latest recheck time any gate asks for (None if none does)."""
    latest: datetime | None = None
    for g in gates:
        at = g.recheck
        if at is not None and (latest is None or at > latest):
            latest = at
    return latest


# -- shutdown ---------------------------------------------------------------------------


def _override_allowed(intent: ManualIntent | None, policy: PolicyView) -> bool:
    if intent is None or intent.override is None or not intent.override.inhibitors:
        return False
    if not policy.override_permitted or not intent.requester_verified:
        return False
    return not policy.override_requesters or intent.requested_by in policy.override_requesters


def _override_refusal(intent: ManualIntent) -> ReasonCode:
    """Why an override is refused: the requester is not who the API server says, or the
    policy does not permit it."""
    return R.OVERRIDE_NOT_PERMITTED if intent.requester_verified else R.REQUESTER_UNVERIFIED


def force_off_permitted(facts: NodeFacts, policy: PolicyView) -> bool:
    """Whether ForceOff may follow a failed GracefulShutdown: only with a Manual Shutdown
    intent carrying override.forceOff, a policy with permitForceOff (requester allowed),
    ForceOff listed in allowedActions and allowable on the node."""
    intent = facts.intent
    if intent is None or intent.action != "Shutdown" or intent.override is None:
        return False
    if not intent.override.force_off or not policy.permit_force_off:
        return False
    if not intent.requester_verified:
        return False
    if policy.override_requesters and intent.requested_by not in policy.override_requesters:
        return False
    if "ForceOff" not in policy.allowed_actions:
        return False
    cap = facts.capability
    return cap is not None and cap.allowable is not None and "ForceOff" in cap.allowable


def drain_context(
    state: NodePowerState | None,
) -> tuple[AdmissionState, datetime | None, bool, datetime | None]:
    """Admission, since when, whether a shutdown transition is in progress, and the floor:
    demand and work must have been read after admission closed (and after the shutdown
    transition began, if one is in progress)."""
    if state is not None:
        admission, admission_since, transition = (
            state.admission,
            state.admission_since,
            state.transition,
        )
    else:
        admission, admission_since, transition = _CLOSED, None, None
    draining = transition is not None and transition.kind is _SHUTDOWN_KIND
    floor: datetime | None = None
    if admission is _CLOSED:
        floor = admission_since
        if floor is not None and draining:
            assert transition is not None
            floor = max(floor, transition.started_at)
    return admission, admission_since, draining, floor


def demand_gate_for(
    demand: DemandReading | None,
    admission: AdmissionState,
    floor: datetime | None,
    refresh: list[FactName],
) -> GateResult:
    """No qualified queued demand; once admission is closed, re-read after closing."""
    if demand is None:
        return GateResult(
            _G_DEMAND, _FAIL, (R.TELEMETRY_MISSING,), (Evidence("queued", "missing", "-", None),)
        )
    queued = demand.queued
    demand_seen = demand.observed_at
    d_reasons: tuple[ReasonCode, ...] = (R.DEMAND_PRESENT,) if queued > 0 else ()
    if admission is _CLOSED and (floor is None or demand_seen < floor):
        d_reasons = (*d_reasons, R.DEMAND_NOT_REREAD)
        refresh.append("demand")
    return GateResult(
        _G_DEMAND,
        _FAIL if d_reasons else _PASS,
        d_reasons,
        (Evidence("queued", queued, demand.source, demand_seen),),
    )


def work_gate_for(
    work: WorkReading | None,
    admission: AdmissionState,
    admission_since: datetime | None,
    floor: datetime | None,
    forced: bool,
    refresh: list[FactName],
) -> GateResult:
    """No active jobs, admission confirmed closed, drain complete (a job count read after
    admission closed shows 0). `forced`: running work means drain, not "busy"."""
    admission_ev = Evidence("admission", _ADMISSION_TEXT[admission], "nodewarden", admission_since)
    if work is None:
        w_evidence: tuple[Evidence, ...] = (
            Evidence("activeJobs", "missing", "-", None),
            admission_ev,
        )
        return GateResult(_G_WORK, _FAIL, (R.TELEMETRY_MISSING,), w_evidence)
    active = work.active_jobs
    work_seen = work.observed_at
    w_evidence = (Evidence("activeJobs", active, work.source, work_seen), admission_ev)
    if admission is not _CLOSED:
        code = R.ACTIVE_WORK if active > 0 and not forced else R.ADMISSION_OPEN
        return GateResult(_G_WORK, _FAIL, (code,), w_evidence)
    if active > 0 or floor is None or work_seen < floor:
        refresh.append("work")
        return GateResult(_G_WORK, _FAIL, (R.DRAIN_INCOMPLETE,), w_evidence)
    return GateResult(_G_WORK, _PASS, (), w_evidence)


def evaluate_shutdown(
    facts: NodeFacts, now: datetime, policy: PolicyView, state: NodePowerState | None = None
) -> Evaluation:
    """Evaluate every shutdown gate for `facts` at `now` (see module docstring). Cloud VMs
    are decided by the node-manager rules instead (`nodewarden.policy.cloudvm`)."""
    require_aware(now)
    if facts.node_type == "CloudVM":
        return _cloudvm.evaluate_vm_shutdown(facts, now, policy, state)
    intent = facts.intent
    policy_gate = _policy_gate(policy)
    desired_gate, forced = _desired_gate(facts.desired, intent, shutdown=True)
    admission, admission_since, draining, floor = drain_context(state)
    refresh: list[FactName] = []
    demand = facts.demand
    demand_gate = demand_gate_for(demand, admission, floor, refresh)
    work = facts.work
    work_gate = work_gate_for(work, admission, admission_since, floor, forced, refresh)

    # telemetry freshness
    power = facts.power
    inhibitors = facts.inhibitors
    telemetry_gate, stale, missing, oldest = _telemetry_gate(
        (("demand", demand), ("work", work), ("power", power), ("inhibitors", inhibitors)),
        now,
        policy.telemetry_max_age,
    )
    for name in stale + missing:
        if name not in refresh:
            refresh.append(name)

    # observed power
    power_gate = _power_gate(power, "On", R.ALREADY_OFF)

    # timing
    timing_gate, timing = _shutdown_timing(
        work, facts.uptime, facts.node_type, now, policy, state, draining, forced
    )

    # inhibitors
    applied: tuple[str, ...] = ()
    if inhibitors is None:
        inhibitor_gate = _result(
            _G_INHIBITORS,
            [R.TELEMETRY_MISSING],
            (Evidence("inhibitors", "missing", "-", None),),
        )
    else:
        held = inhibitors.inhibitors
        blocking = inhibitors.blocking if held else ()
        if not blocking:
            inhibitor_gate = GateResult(
                _G_INHIBITORS,
                _PASS,
                (),
                (
                    Evidence(
                        "blocking",
                        f"0 of {len(held)} held",
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
                    _ev(
                        "override",
                        f"{intent.name} by {intent.requested_by} (authenticated at admission)",
                        intent,
                    ),
                )
                inhibitor_gate = _result(
                    _G_INHIBITORS, [R.INHIBITOR_ACTIVE, R.OVERRIDE_APPLIED], i_ev, waived=True
                )
                applied = ("inhibitors",)
            elif wants_override:
                assert intent is not None
                inhibitor_gate = _result(
                    _G_INHIBITORS, [R.INHIBITOR_ACTIVE, _override_refusal(intent)], i_ev
                )
            else:
                inhibitor_gate = _result(_G_INHIBITORS, [R.INHIBITOR_ACTIVE], i_ev)

    capability_gate, action = _capability_gate(facts.capability, policy, SHUTDOWN_ACTIONS)
    identity_gate, identity_waived = _identity_gate(
        facts.identity, facts.capability, intent, now, policy.telemetry_max_age, refresh
    )
    if identity_waived:
        applied = (*applied, "identity")
    fleet_gate = _fleet_gate(facts.fleet, policy, draining, check_warm=not forced, state=state)

    gates = (
        policy_gate,
        desired_gate,
        demand_gate,
        work_gate,
        telemetry_gate,
        power_gate,
        timing_gate,
        inhibitor_gate,
        capability_gate,
        identity_gate,
        fleet_gate,
    )
    decision, reasons = _decide(
        gates, _SHUTDOWN, _FORCED_SHUTDOWN_RANK if forced else _RANK, applied
    )
    return _evaluation(
        kind="shutdown",
        decision=decision,
        reasons=reasons,
        gates=gates,
        action=action,
        recheck_at=_latest_recheck(gates) if decision is _DEFER else None,
        overrides_applied=applied,
        timing=timing,
        stale=stale,
        missing=missing,
        oldest_observed_at=oldest,
        refresh=tuple(refresh),
        forced=forced,
    )


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


def _shutdown_timing(
    work: WorkReading | None,
    uptime: UptimeReading | None,
    node_type: NodeType,
    now: datetime,
    policy: PolicyView,
    state: NodePowerState | None,
    draining: bool,
    forced: bool,
) -> tuple[GateResult, tuple[TimingMeasure, ...]]:
    """Idle threshold, min-on, cooldown and (cloud VMs) the billing window. `draining`:
    a shutdown transition is in progress; `forced`: a manual or pinned shutdown."""
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
    on_since, on_source, on_seen = _on_since(uptime, state)
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
    cool = _cooldown(
        state.last_transition_at if state is not None else None,
        now,
        policy,
        evidence,
        reasons,
        rechecks,
    )
    measures: tuple[TimingMeasure, ...] = (idle, min_on, cool)
    # billing window (cloud VMs, automatic shutdowns only)
    if node_type == "CloudVM" and not forced and policy.valid and on_since is not None:
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
    recheck = max(rechecks) if rechecks else None
    return _result(_G_TIMING, reasons, tuple(evidence), recheck), measures


# -- wake -------------------------------------------------------------------------------


def evaluate_wake(
    facts: NodeFacts, now: datetime, policy: PolicyView, state: NodePowerState | None = None
) -> Evaluation:
    """Evaluate every wake gate for `facts` at `now` (see module docstring)."""
    require_aware(now)
    policy_gate = _policy_gate(policy)
    desired_gate, forced = _desired_gate(facts.desired, facts.intent, shutdown=False)

    demand = facts.demand
    if forced:
        demand_gate = GateResult(
            _G_DEMAND,
            _WAIVED,
            (),
            (_ev("queued", demand.queued if demand else "not needed", demand),),
        )
    elif demand is None:
        demand_gate = _result(
            _G_DEMAND, [R.TELEMETRY_MISSING], (Evidence("queued", "missing", "-", None),)
        )
    else:
        queued = demand.queued
        d_evidence = (Evidence("queued", queued, demand.source, demand.observed_at),)
        if queued == 0:
            demand_gate = GateResult(_G_DEMAND, _FAIL, (R.NO_DEMAND,), d_evidence)
        else:
            demand_gate = GateResult(_G_DEMAND, _PASS, (), d_evidence)

    power = facts.power
    named: tuple[tuple[FactName, Reading | None], ...] = (
        (("power", power),) if forced else (("demand", demand), ("power", power))
    )
    telemetry_gate, stale, missing, oldest = _telemetry_gate(named, now, policy.telemetry_max_age)

    power_gate = _power_gate(power, "Off", R.ALREADY_ON)
    timing_gate, timing = _wake_timing(now, policy, state)
    capability_gate, action = _capability_gate(facts.capability, policy, WAKE_ACTIONS)
    transition = state.transition if state is not None else None
    waking = transition is not None and transition.kind is _WAKE_KIND
    fleet_gate = _fleet_gate(facts.fleet, policy, waking, check_warm=False)
    gates = (
        policy_gate,
        desired_gate,
        demand_gate,
        telemetry_gate,
        power_gate,
        timing_gate,
        capability_gate,
        fleet_gate,
    )
    decision, codes = _decide(gates, _START, _RANK, ())
    return _evaluation(
        kind="wake",
        decision=decision,
        reasons=codes,
        gates=gates,
        action=action,
        recheck_at=_latest_recheck(gates) if decision is _DEFER else None,
        overrides_applied=(),
        timing=timing,
        stale=stale,
        missing=missing,
        oldest_observed_at=oldest,
        refresh=stale + missing,
        forced=forced,
    )


def _wake_timing(
    now: datetime, policy: PolicyView, state: NodePowerState | None
) -> tuple[GateResult, tuple[TimingMeasure, ...]]:
    """Min-off and cooldown, both measured from the state."""
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
    cool = _cooldown(last_transition_at, now, policy, evidence, reasons, rechecks)
    gate = _result(_G_TIMING, reasons, tuple(evidence), max(rechecks) if rechecks else None)
    return gate, (off_measure, cool)


def timing_measures(
    facts: NodeFacts, now: datetime, policy: PolicyView, state: NodePowerState
) -> tuple[TimingMeasure, ...]:
    """The timing values and measurements that matter in `state` (for records of steps
    that made no gate evaluation): min-off and cooldown while off or waking, else idle
    threshold, min-on and cooldown."""
    if state.state in (PowerState.OFF, PowerState.WAKING):
        return _wake_timing(now, policy, state)[1]
    transition = state.transition
    draining = transition is not None and transition.kind is _SHUTDOWN_KIND
    return _shutdown_timing(
        facts.work, facts.uptime, facts.node_type, now, policy, state, draining, forced=False
    )[1]


# -- building blocks shared with the cloud-VM rules (nodewarden.policy.cloudvm) -----------
policy_gate = _policy_gate
desired_gate = _desired_gate
telemetry_gate = _telemetry_gate
power_gate = _power_gate
capability_gate = _capability_gate
fleet_gate = _fleet_gate
gate_result = _result
evaluation = _evaluation
decide = _decide
latest_recheck = _latest_recheck
RANK = _RANK
FORCED_SHUTDOWN_RANK = _FORCED_SHUTDOWN_RANK

# Imported last: cloudvm builds on the names above (no cycle at import time).
from nodewarden.policy import cloudvm as _cloudvm  # noqa: E402
