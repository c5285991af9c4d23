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
codes follow it). To add a gate: write it as a function of `GateInputs` (in
`gateblocks`, `overrides` or `timing`, next to the gates like it), give it a `GateName`,
add it to the table, and add its reason codes to `reasons` (with docs/reason-codes.md).
A table entry is the gate itself, not a wrapper around it: every call frame costs about
as much as a small gate (the power, telemetry and fleet entries below wrap the blocks the
cloud-VM rules call with other readings).
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
from typing import cast

from nodewarden.policy.base import require_aware
from nodewarden.policy.cloudvm import evaluate_vm_shutdown
from nodewarden.policy.evaluation import (
    Evaluation,
    GateInputs,
    GateName,
    GateResult,
)
from nodewarden.policy.facts import FactName, NodeFacts, Reading
from nodewarden.policy.gateblocks import (
    control_available,
    demand_present,
    drain_context,
    drained,
    fleet_gate,
    no_demand,
    policy_valid,
    power_gate,
    transition_wanted,
)
from nodewarden.policy.overrides import no_inhibitor, same_machine
from nodewarden.policy.precedence import FORCED_SHUTDOWN_RANK, RANK, decide, latest_recheck
from nodewarden.policy.reasons import Decision, R
from nodewarden.policy.state import AdmissionState, NodePowerState, TransitionKind
from nodewarden.policy.timing import shutdown_timing, telemetry_gate, to_refresh, wake_timing
from nodewarden.policy.view import PolicyView

Gate = Callable[[GateInputs], GateResult]
"""One gate: judges the evaluation in progress (and may add to it, see `GateInputs`)."""
GateRun = Callable[[GateInputs], tuple[GateResult, ...]]
"""A gate table run in order on one evaluation in progress."""

_CLOSED = AdmissionState.CLOSED
_WAKE_KIND = TransitionKind.WAKE
_SHUTDOWN, _START, _DEFER = Decision.SHUTDOWN, Decision.START, Decision.DEFER
_ALREADY_OFF, _ALREADY_ON = R.ALREADY_OFF, R.ALREADY_ON


def _in_order(table: tuple[tuple[GateName, Gate], ...], name: str) -> GateRun:
    """`table` as one function that calls its gates in order and returns their results,
    built once at import from the table (as `dataclasses` builds `__init__`).

    A loop over the table would call a different gate from one call site each time, and
    Python 3.11 specialises a call site only for the one function it keeps calling: the
    loop made an evaluation ~4% slower than these direct calls (instructions counted
    under valgrind over bench_policy's fleet)."""
    gates = {f"gate_{i}": gate for i, (_, gate) in enumerate(table)}
    source = f"def {name}(c):\n    return ({', '.join(f'{g}(c)' for g in gates)},)\n"
    namespace: dict[str, object] = dict(gates)
    exec(source, namespace)  # noqa: S102 -- the source is built here from the table's own names
    run = namespace[name]
    assert callable(run)
    return cast(GateRun, run)


# -- the blocks the cloud-VM rules call with their own readings ------------------------
# (the other gates are the building blocks themselves: gateblocks, overrides, timing)


def shutdown_telemetry(c: GateInputs) -> GateResult:
    f = c.facts
    gate, c.stale, c.missing, c.oldest = telemetry_gate(
        (("demand", f.demand), ("work", f.work), ("power", f.power), ("inhibitors", f.inhibitors)),
        c.now,
        c.policy.telemetry_max_age,
    )
    if c.stale or c.missing:
        to_refresh(c.refresh, c.stale, c.missing)
    return gate


def wake_telemetry(c: GateInputs) -> GateResult:
    f = c.facts
    named: tuple[tuple[FactName, Reading | None], ...] = (
        (("power", f.power),) if c.forced else (("demand", f.demand), ("power", f.power))
    )
    gate, c.stale, c.missing, c.oldest = telemetry_gate(named, c.now, c.policy.telemetry_max_age)
    if c.stale or c.missing:
        to_refresh(c.refresh, c.stale, c.missing)
    return gate


def observed_on(c: GateInputs) -> GateResult:
    return power_gate(c.facts.power, "On", _ALREADY_OFF)


def observed_off(c: GateInputs) -> GateResult:
    return power_gate(c.facts.power, "Off", _ALREADY_ON)


def shutdown_fleet(c: GateInputs) -> GateResult:
    return fleet_gate(
        c.facts.fleet, c.policy, c.own_transition, check_warm=not c.forced, state=c.state
    )


def wake_fleet(c: GateInputs) -> GateResult:
    return fleet_gate(c.facts.fleet, c.policy, c.own_transition, check_warm=False)


# -- shutdown ---------------------------------------------------------------------------


SHUTDOWN_GATES: tuple[tuple[GateName, Gate], ...] = (
    (GateName.POLICY, policy_valid),
    (GateName.DESIRED, transition_wanted),
    (GateName.DEMAND, no_demand),
    (GateName.WORK, drained),
    (GateName.TELEMETRY, shutdown_telemetry),
    (GateName.POWER, observed_on),
    (GateName.TIMING, shutdown_timing),
    (GateName.INHIBITORS, no_inhibitor),
    (GateName.CAPABILITY, control_available),
    (GateName.IDENTITY, same_machine),
    (GateName.FLEET, shutdown_fleet),
)
"""The side-node shutdown gates, in order (the desired gate sets `forced`, which the
gates after it read)."""
_shutdown_gates = _in_order(SHUTDOWN_GATES, "shutdown_gates")


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
        True, facts, now, policy, state, facts.intent, admission, admission_since, draining, floor
    )
    gates = _shutdown_gates(c)
    forced = c.forced
    decision, reasons = decide(
        gates, _SHUTDOWN, FORCED_SHUTDOWN_RANK if forced else RANK, c.applied
    )
    return Evaluation(  # positional, in field order: keyword arguments cost twice as much
        "shutdown",  # kind
        decision,  # decision
        reasons,  # reasons
        gates,  # gates
        c.action,  # action
        latest_recheck(gates) if decision is _DEFER else None,  # recheck_at
        c.applied,  # overrides_applied
        c.timing,  # timing
        c.stale,  # stale
        c.missing,  # missing
        c.oldest,  # oldest_observed_at
        tuple(c.refresh),  # refresh
        forced,  # forced
    )


# -- wake -------------------------------------------------------------------------------


WAKE_GATES: tuple[tuple[GateName, Gate], ...] = (
    (GateName.POLICY, policy_valid),
    (GateName.DESIRED, transition_wanted),
    (GateName.DEMAND, demand_present),
    (GateName.TELEMETRY, wake_telemetry),
    (GateName.POWER, observed_off),
    (GateName.TIMING, wake_timing),
    (GateName.CAPABILITY, control_available),
    (GateName.FLEET, wake_fleet),
)
"""The wake gates, in order (the desired gate sets `forced`)."""
_wake_gates = _in_order(WAKE_GATES, "wake_gates")


def evaluate_wake(
    facts: NodeFacts, now: datetime, policy: PolicyView, state: NodePowerState | None = None
) -> Evaluation:
    """Evaluate every wake gate for `facts` at `now` (see module docstring)."""
    require_aware(now)
    transition = state.transition if state is not None else None
    waking = transition is not None and transition.kind is _WAKE_KIND
    c = GateInputs(False, facts, now, policy, state, facts.intent, _CLOSED, None, waking, None)
    gates = _wake_gates(c)
    decision, codes = decide(gates, _START, RANK, ())
    if c.warm is not None and decision is _START:
        codes = (*codes, c.warm)  # woken for warm capacity: the record says which lever
    return Evaluation(  # positional, in field order: keyword arguments cost twice as much
        "wake",  # kind
        decision,  # decision
        codes,  # reasons
        gates,  # gates
        c.action,  # action
        latest_recheck(gates) if decision is _DEFER else None,  # recheck_at
        (),  # overrides_applied
        c.timing,  # timing
        c.stale,  # stale
        c.missing,  # missing
        c.oldest,  # oldest_observed_at
        tuple(c.refresh),  # refresh
        c.forced,  # forced
    )
