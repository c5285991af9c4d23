"""The power gates, as tables: is it safe (and worth it) to switch a node off or wake it?

    evaluate_shutdown(facts, now, policy, state=None) -> Evaluation
    evaluate_wake(facts, now, policy, state=None) -> Evaluation
    SHUTDOWN_GATES, WAKE_GATES: the gates, in order (name, gate)

Pure functions: the same facts, clock, policy and state always give the same
`Evaluation` (decision, reason codes, the gate table with evidence, the power action
that would be used, when to look again, which readings to refresh). They make no state
transition; the state machine (`nodewarden.policy.machine`) calls them at each step,
`nodewarden explain` prints them, and the operator's periodic "should this node go
off / be woken?" check can call them directly.

Each gate takes the `GateInputs` of the evaluation in progress and returns its
`GateResult`; the gates run in table order (the decision and the order of the reason
codes follow it). To add a gate: write its function (the judging block in `gateblocks`,
`overrides` or `timing`, or a function of `GateInputs` directly), give it a `GateName`,
add it to the table, and add its reason codes to `reasons` (with docs/reason-codes.md).
The blocks live below this module (`evaluation` -> `gateblocks`, `overrides`, `timing`,
`precedence` -> `cloudvm` -> `gates`), so the cloud-VM rules share them without a cycle.

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

from collections.abc import Callable
from datetime import datetime

from nodewarden.policy.base import require_aware
from nodewarden.policy.cloudvm import evaluate_vm_shutdown
from nodewarden.policy.evaluation import (
    Evaluation,
    GateInputs,
    GateName,
    GateResult,
    new_evaluation,
)
from nodewarden.policy.facts import FactName, NodeFacts, Reading
from nodewarden.policy.gateblocks import (
    SHUTDOWN_ACTIONS,
    WAKE_ACTIONS,
    capability_gate,
    demand_gate_for,
    desired_gate,
    drain_context,
    fleet_gate,
    policy_gate,
    power_gate,
    wake_demand_gate,
    work_gate_for,
)
from nodewarden.policy.overrides import identity_gate, inhibitor_gate
from nodewarden.policy.precedence import FORCED_SHUTDOWN_RANK, RANK, decide, latest_recheck
from nodewarden.policy.reasons import Decision, ReasonCode
from nodewarden.policy.state import AdmissionState, NodePowerState, TransitionKind
from nodewarden.policy.timing import shutdown_timing, telemetry_gate, wake_timing
from nodewarden.policy.view import PolicyView

R = ReasonCode
Gate = Callable[[GateInputs], GateResult]
"""One gate: judges the evaluation in progress (and may add to it, see `GateInputs`)."""

_CLOSED = AdmissionState.CLOSED
_WAKE_KIND = TransitionKind.WAKE
_SHUTDOWN, _START, _DEFER = Decision.SHUTDOWN, Decision.START, Decision.DEFER


def _freshness(c: GateInputs, named: tuple[tuple[FactName, Reading | None], ...]) -> GateResult:
    """The telemetry gate over `named`; stale and missing readings are to be refreshed."""
    gate, c.stale, c.missing, c.oldest = telemetry_gate(named, c.now, c.policy.telemetry_max_age)
    refresh = c.refresh
    for name in c.stale + c.missing:
        if name not in refresh:
            refresh.append(name)
    return gate


# -- both directions --------------------------------------------------------------------


def policy_valid(c: GateInputs) -> GateResult:
    return policy_gate(c.policy)


# -- shutdown ---------------------------------------------------------------------------


def shutdown_wanted(c: GateInputs) -> GateResult:
    gate, c.forced = desired_gate(c.facts.desired, c.intent, shutdown=True)
    return gate


def no_demand(c: GateInputs) -> GateResult:
    return demand_gate_for(c.facts.demand, c.admission, c.floor, c.refresh)


def drained(c: GateInputs) -> GateResult:
    return work_gate_for(c.facts.work, c.admission, c.admission_since, c.floor, c.forced, c.refresh)


def shutdown_telemetry(c: GateInputs) -> GateResult:
    f = c.facts
    return _freshness(
        c,
        (("demand", f.demand), ("work", f.work), ("power", f.power), ("inhibitors", f.inhibitors)),
    )


def observed_on(c: GateInputs) -> GateResult:
    return power_gate(c.facts.power, "On", R.ALREADY_OFF)


def shutdown_timing_gate(c: GateInputs) -> GateResult:
    f = c.facts
    gate, c.timing = shutdown_timing(
        f.work, f.uptime, f.node_type, c.now, c.policy, c.state, c.own_transition, c.forced
    )
    return gate


def no_inhibitor(c: GateInputs) -> GateResult:
    gate, waived = inhibitor_gate(c.facts.inhibitors, c.intent, c.policy)
    if waived:
        c.applied = (*c.applied, "inhibitors")
    return gate


def can_shut_down(c: GateInputs) -> GateResult:
    gate, c.action = capability_gate(c.facts.capability, c.policy, SHUTDOWN_ACTIONS)
    return gate


def same_machine(c: GateInputs) -> GateResult:
    f = c.facts
    gate, waived = identity_gate(
        f.identity, f.capability, c.intent, c.now, c.policy.telemetry_max_age, c.refresh
    )
    if waived:
        c.applied = (*c.applied, "identity")
    return gate


def shutdown_fleet(c: GateInputs) -> GateResult:
    return fleet_gate(
        c.facts.fleet, c.policy, c.own_transition, check_warm=not c.forced, state=c.state
    )


SHUTDOWN_GATES: tuple[tuple[GateName, Gate], ...] = (
    (GateName.POLICY, policy_valid),
    (GateName.DESIRED, shutdown_wanted),
    (GateName.DEMAND, no_demand),
    (GateName.WORK, drained),
    (GateName.TELEMETRY, shutdown_telemetry),
    (GateName.POWER, observed_on),
    (GateName.TIMING, shutdown_timing_gate),
    (GateName.INHIBITORS, no_inhibitor),
    (GateName.CAPABILITY, can_shut_down),
    (GateName.IDENTITY, same_machine),
    (GateName.FLEET, shutdown_fleet),
)
"""The side-node shutdown gates, in order (the desired gate sets `forced`, which the
gates after it read)."""


def evaluate_shutdown(
    facts: NodeFacts, now: datetime, policy: PolicyView, state: NodePowerState | None = None
) -> Evaluation:
    """Evaluate every shutdown gate for `facts` at `now` (see module docstring). Cloud VMs
    are decided by the node-manager rules instead (`nodewarden.policy.cloudvm`)."""
    require_aware(now)
    if facts.node_type == "CloudVM":
        return evaluate_vm_shutdown(facts, now, policy, state)
    admission, admission_since, draining, floor = drain_context(state)
    c = GateInputs(
        facts, now, policy, state, facts.intent, admission, admission_since, draining, floor
    )
    gates = tuple([gate(c) for _, gate in SHUTDOWN_GATES])
    forced = c.forced
    decision, reasons = decide(
        gates, _SHUTDOWN, FORCED_SHUTDOWN_RANK if forced else RANK, c.applied
    )
    return new_evaluation(
        kind="shutdown",
        decision=decision,
        reasons=reasons,
        gates=gates,
        action=c.action,
        recheck_at=latest_recheck(gates) if decision is _DEFER else None,
        overrides_applied=c.applied,
        timing=c.timing,
        stale=c.stale,
        missing=c.missing,
        oldest_observed_at=c.oldest,
        refresh=tuple(c.refresh),
        forced=forced,
    )


# -- wake -------------------------------------------------------------------------------


def wake_wanted(c: GateInputs) -> GateResult:
    gate, c.forced = desired_gate(c.facts.desired, c.intent, shutdown=False)
    return gate


def demand_present(c: GateInputs) -> GateResult:
    return wake_demand_gate(c.facts.demand, c.forced)


def wake_telemetry(c: GateInputs) -> GateResult:
    f = c.facts
    if c.forced:
        return _freshness(c, (("power", f.power),))
    return _freshness(c, (("demand", f.demand), ("power", f.power)))


def observed_off(c: GateInputs) -> GateResult:
    return power_gate(c.facts.power, "Off", R.ALREADY_ON)


def wake_timing_gate(c: GateInputs) -> GateResult:
    gate, c.timing = wake_timing(c.now, c.policy, c.state)
    return gate


def can_wake(c: GateInputs) -> GateResult:
    gate, c.action = capability_gate(c.facts.capability, c.policy, WAKE_ACTIONS)
    return gate


def wake_fleet(c: GateInputs) -> GateResult:
    return fleet_gate(c.facts.fleet, c.policy, c.own_transition, check_warm=False)


WAKE_GATES: tuple[tuple[GateName, Gate], ...] = (
    (GateName.POLICY, policy_valid),
    (GateName.DESIRED, wake_wanted),
    (GateName.DEMAND, demand_present),
    (GateName.TELEMETRY, wake_telemetry),
    (GateName.POWER, observed_off),
    (GateName.TIMING, wake_timing_gate),
    (GateName.CAPABILITY, can_wake),
    (GateName.FLEET, wake_fleet),
)
"""The wake gates, in order (the desired gate sets `forced`)."""


def evaluate_wake(
    facts: NodeFacts, now: datetime, policy: PolicyView, state: NodePowerState | None = None
) -> Evaluation:
    """Evaluate every wake gate for `facts` at `now` (see module docstring)."""
    require_aware(now)
    transition = state.transition if state is not None else None
    waking = transition is not None and transition.kind is _WAKE_KIND
    c = GateInputs(facts, now, policy, state, facts.intent, _CLOSED, None, waking, None)
    gates = tuple([gate(c) for _, gate in WAKE_GATES])
    decision, codes = decide(gates, _START, RANK, ())
    return new_evaluation(
        kind="wake",
        decision=decision,
        reasons=codes,
        gates=gates,
        action=c.action,
        recheck_at=latest_recheck(gates) if decision is _DEFER else None,
        overrides_applied=(),
        timing=c.timing,
        stale=c.stale,
        missing=c.missing,
        oldest_observed_at=c.oldest,
        refresh=tuple(c.refresh),
        forced=c.forced,
    )
