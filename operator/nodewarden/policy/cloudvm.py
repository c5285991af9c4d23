"""Cloud VMs: the node-manager rules, in order, and the shutdown evaluation built on them.

    evaluate_vm_shutdown(facts, now, policy, state=None) -> Evaluation
    fire(facts, now, policy) -> Fired            (which rule fires, with its evidence)

A cloud VM goes through the same state machine as a side node (`machine.step`, with
`NodeFacts(node_type="CloudVM")`); only the shutdown evaluation differs:
`gates.evaluate_shutdown` hands a CloudVM to `evaluate_vm_shutdown`. The trusted power
source is the cloud's instance list (destroy is confirmed by the instance leaving it),
the request is a destroy (`GracefulShutdown` on controlMethod Cloud), and instead of the
side-node timing and inhibitor gates an ordered list of small rule functions -- Arvados
`worker.go` (eligibleForShutdown, shutdownIfBroken, shutdownIfIdle) and the node-manager
matrix (`nodemanager.decide`) -- says whether the VM should go:

    rule                 fires when                                          kind     code
    deleted              the WorkerNode was deleted                          forced   NODE_DELETED
    down                 matrix 'down': paired, no probe success for         forced   WORKER_DOWN
                         heartbeatStaleAfter
    lame                 never paired, up lameAfter, >= lameMinProbes tries  forced   LAME_NODE
    unpaired             matrix 'unpaired' past bootGrace                    forced   BOOT_GRACE_EXCEEDED
    broken               the runner reported the node broken                 drain    NODE_BROKEN
    pinned off           spec.power Off                                      drain    POWER_PINNED_OFF
    drain                spec.idleBehavior drain                             drain    IDLE_BEHAVIOR_DRAIN
    idle                 matrix 'idle' + idle grace exceeded + billing       drain    IDLE_EXCEEDED
                         window open (not one of the minWarmNodes)

`idleBehavior: hold` keeps a VM whatever rule fires (as in Arvados), except deletion;
`spec.power: On` keeps it from automatic shutdowns. A *forced* rule means the VM cannot
do useful work: it is destroyed without draining (its containers are requeued by the
dispatcher once it is gone). A *drain* rule closes admission, re-reads demand, waits for
running work to end (bounded by deadlines.drain), then destroys. Either way the gates
that remain are recorded with their evidence: the policy, the rule (the matrix tuple and
every input with its source), demand and drain (drain rules), telemetry freshness (the
cloud list and the probe history must be fresh), observed power, the destroy capability,
and min warm nodes (idle rule).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from nodewarden.policy.evaluation import (
    Evaluation,
    Evidence,
    GateInputs,
    GateName,
    GateResult,
    TimingMeasure,
    Verdict,
    evidence_of,
    gate_result,
    new_evaluation,
)
from nodewarden.policy.facts import FactName, NodeFacts, Reading, VmReading
from nodewarden.policy.gateblocks import (
    control_available,
    drain_context,
    drained,
    fleet_gate,
    no_demand,
    policy_valid,
    power_gate,
    transition_wanted,
)
from nodewarden.policy.nodemanager import (
    BillingWindowState,
    CloudWorkerFacts,
    IdleGrace,
    MatrixInputs,
    NodeManagerAction,
    WorkerState,
    derive_inputs,
    next_billing_window_open,
)
from nodewarden.policy.nodemanager import (
    decide as matrix_decide,
)
from nodewarden.policy.precedence import FORCED_SHUTDOWN_RANK, RANK, decide, latest_recheck
from nodewarden.policy.reasons import Decision, R, ReasonCode
from nodewarden.policy.state import NodePowerState
from nodewarden.policy.timing import telemetry_gate, to_refresh
from nodewarden.policy.view import PolicyView

RuleKind = Literal["forced", "drain"]


@dataclass(frozen=True, slots=True)
class Fired:
    """The outcome of the rule list: the rule that fired (or None) and why not otherwise."""

    rule: str | None
    kind: RuleKind | None
    code: ReasonCode | None
    inputs: MatrixInputs | None
    not_fired: tuple[ReasonCode, ...] = ()
    recheck: datetime | None = None


@dataclass(frozen=True, slots=True)
class _Ctx:
    facts: NodeFacts
    vm: VmReading
    now: datetime
    policy: PolicyView
    inputs: MatrixInputs
    action: NodeManagerAction | None
    busy: bool


Rule = Callable[[_Ctx], tuple[RuleKind, ReasonCode] | None]


def _deleted(c: _Ctx) -> tuple[RuleKind, ReasonCode] | None:
    return ("forced", R.NODE_DELETED) if c.vm.deletion_requested else None


def _down(c: _Ctx) -> tuple[RuleKind, ReasonCode] | None:
    if c.action is NodeManagerAction.START_SHUTDOWN and c.inputs.worker_state is WorkerState.DOWN:
        return "forced", R.WORKER_DOWN
    return None


def _lame(c: _Ctx) -> tuple[RuleKind, ReasonCode] | None:
    vm = c.vm
    up = c.now - vm.grace_from
    if (
        not vm.paired
        and up >= c.policy.lame_after
        and vm.probe_attempts >= c.policy.lame_min_probes
    ):
        return "forced", R.LAME_NODE
    return None


def _unpaired(c: _Ctx) -> tuple[RuleKind, ReasonCode] | None:
    if (
        c.action is NodeManagerAction.START_SHUTDOWN
        and c.inputs.worker_state is WorkerState.UNPAIRED
    ):
        return "forced", R.BOOT_GRACE_EXCEEDED
    return None


def _broken(c: _Ctx) -> tuple[RuleKind, ReasonCode] | None:
    return ("drain", R.NODE_BROKEN) if c.vm.broken else None


def _pinned_off(c: _Ctx) -> tuple[RuleKind, ReasonCode] | None:
    desired = c.facts.desired
    return ("drain", R.POWER_PINNED_OFF) if desired is not None and desired.power == "Off" else None


def _drain(c: _Ctx) -> tuple[RuleKind, ReasonCode] | None:
    desired = c.facts.desired
    if desired is not None and desired.idle_behavior == "drain":
        return "drain", R.IDLE_BEHAVIOR_DRAIN
    return None


def _idle(c: _Ctx) -> tuple[RuleKind, ReasonCode] | None:
    if c.action is NodeManagerAction.START_DRAIN:
        return "drain", R.IDLE_EXCEEDED
    return None


RULES: tuple[tuple[str, Rule], ...] = (
    ("deleted", _deleted),
    ("down", _down),
    ("lame", _lame),
    ("unpaired", _unpaired),
    ("broken", _broken),
    ("pinnedOff", _pinned_off),
    ("drain", _drain),
    ("idle", _idle),
)
"""The node-manager rules in the order they are tried; the first that fires decides."""


def fire(facts: NodeFacts, now: datetime, policy: PolicyView) -> Fired:
    """Run the rules for a cloud VM; `facts.vm` must be present."""
    vm = facts.vm
    assert vm is not None
    work = facts.work
    busy = work is None or work.active_jobs > 0
    idle_since = None if busy or work is None else work.idle_since
    inputs = derive_inputs(
        CloudWorkerFacts(
            paired=vm.paired,
            # a stopped VM is 'down' whatever its last probe said
            scheduler_state="down" if vm.stopped else ("alloc" if busy else "idle"),
            last_heartbeat=vm.last_heartbeat,
            booted_at=vm.booted_at,
            idle_since=idle_since,
            grace_from=vm.grace_from,
        ),
        policy,
        now,
    )
    action = matrix_decide(
        inputs.worker_state, inputs.billing_window, inputs.boot_grace, inputs.idle_grace
    )
    ctx = _Ctx(facts, vm, now, policy, inputs, action, busy)
    for name, rule in RULES:
        outcome = rule(ctx)
        if outcome is not None:
            return Fired(name, outcome[0], outcome[1], inputs)
    return _why_not(ctx)


def _why_not(c: _Ctx) -> Fired:
    """No rule fired: the reason codes (and when to look again) for the record."""
    inputs, vm, policy = c.inputs, c.vm, c.policy
    ws = inputs.worker_state
    if ws is WorkerState.UNPAIRED:
        return Fired(
            None, None, None, inputs, (R.READY_PROBE_PENDING,), vm.grace_from + policy.boot_grace
        )
    if c.busy:
        code = R.TELEMETRY_MISSING if c.facts.work is None else R.ACTIVE_WORK
        return Fired(None, None, None, inputs, (code,))
    work = c.facts.work
    if inputs.idle_grace is IdleGrace.WAIT and work is not None and work.idle_since is not None:
        return Fired(
            None,
            None,
            None,
            inputs,
            (R.IDLE_WINDOW_NOT_MET,),
            work.idle_since + policy.idle_threshold,
        )
    if inputs.idle_grace is IdleGrace.NOT_IDLE:
        return Fired(None, None, None, inputs, (R.TELEMETRY_MISSING,))
    if inputs.billing_window is BillingWindowState.CLOSED:
        recheck = next_billing_window_open(
            booted_at=vm.booted_at,
            period=policy.billing_period,
            window_start=policy.billing_window_start,
            window_end=policy.billing_window_end,
            now=c.now,
        )
        return Fired(None, None, None, inputs, (R.BILLING_WINDOW_CLOSED,), recheck)
    return Fired(None, None, None, inputs, (R.ACTIVE_WORK,))


def _rule_gate(facts: NodeFacts, fired: Fired, now: datetime) -> GateResult:
    vm = facts.vm
    assert vm is not None
    evidence: list[Evidence] = []
    if fired.inputs is not None:
        i = fired.inputs
        evidence.append(
            evidence_of(
                "matrix",
                f"{i.worker_state.value}, billing {i.billing_window.value}, "
                f"{i.boot_grace.value}, {i.idle_grace.value}",
                vm,
            )
        )
    evidence += [
        evidence_of("rule", fired.rule or "none fired", vm),
        evidence_of("bootedAt", vm.booted_at.isoformat(), vm),
        evidence_of("paired", vm.paired, vm),
        evidence_of(
            "lastHeartbeat", vm.last_heartbeat.isoformat() if vm.last_heartbeat else "never", vm
        ),
        evidence_of("probeAttemptsSinceSuccess", vm.probe_attempts, vm),
    ]
    if vm.stopped:
        evidence.append(evidence_of("stopped", True, vm))
    if vm.broken:
        evidence.append(evidence_of("broken", True, vm))
    if vm.deletion_requested:
        evidence.append(evidence_of("deletionRequested", True, vm))
    if fired.rule is not None:
        assert fired.code is not None
        return GateResult(GateName.NODE_MANAGER, Verdict.PASS, (fired.code,), tuple(evidence))
    return gate_result(GateName.NODE_MANAGER, list(fired.not_fired), tuple(evidence), fired.recheck)


def _skipped(gate: GateName, why: str) -> GateResult:
    return GateResult(gate, Verdict.SKIPPED, (), (Evidence(gate.value, why, "nodewarden", None),))


def _timing(
    facts: NodeFacts, fired: Fired, now: datetime, policy: PolicyView
) -> tuple[TimingMeasure, ...]:
    vm = facts.vm
    work = facts.work
    assert vm is not None
    seconds = policy.seconds
    idle_since = work.idle_since if work is not None and work.active_jobs == 0 else None
    idle = TimingMeasure(
        "idleThreshold",
        seconds.idle_threshold,
        None if idle_since is None else (now - idle_since).total_seconds(),
        idle_since,
        None if idle_since is None else now - idle_since >= policy.idle_threshold,
    )
    window = None if fired.inputs is None else fired.inputs.billing_window
    billing = TimingMeasure(
        "billingWindow",
        seconds.billing_period,
        (now - vm.booted_at).total_seconds(),
        vm.booted_at,
        None if window is None else window is BillingWindowState.OPEN,
    )
    return (idle, billing)


def evaluate_vm_shutdown(
    facts: NodeFacts, now: datetime, policy: PolicyView, state: NodePowerState | None = None
) -> Evaluation:
    """The shutdown evaluation of a cloud VM (see the module docstring)."""
    admission, admission_since, draining, floor = drain_context(state)
    c = GateInputs(
        True, facts, now, policy, state, facts.intent, admission, admission_since, draining, floor
    )
    pol_gate = policy_valid(c)
    vm = facts.vm
    refresh = c.refresh
    if vm is None:
        rule_gate = gate_result(
            GateName.NODE_MANAGER, [R.TELEMETRY_MISSING], (Evidence("vm", "missing", "-", None),)
        )
        fired = Fired(None, None, None, None, (R.TELEMETRY_MISSING,))
        refresh.append("vm")
    else:
        fired = fire(facts, now, policy)
        rule_gate = _rule_gate(facts, fired, now)
    forced = fired.kind == "forced"
    deleted = fired.code is R.NODE_DELETED
    # hold keeps the VM whatever fired (except deletion); spec.power On keeps it too
    if deleted:
        wanted = GateResult(
            GateName.DESIRED,
            Verdict.PASS,
            (),
            (Evidence("deletion", "requested", "WorkerNode", None),),
        )
    else:
        wanted = transition_wanted(c)  # its `forced` is not the rule's: set below
    demand = facts.demand
    work = facts.work
    power = facts.power
    if forced:
        skip_why = f"forced by rule {fired.rule}: the node cannot run work"
        demand_g = _skipped(GateName.DEMAND, skip_why)
        work_g = _skipped(GateName.WORK, skip_why)
        named: tuple[tuple[FactName, Reading | None], ...] = (("power", power), ("vm", vm))
        fleet_g = _skipped(GateName.FLEET, skip_why)
    else:
        if fired.code in (R.NODE_BROKEN, R.POWER_PINNED_OFF, R.IDLE_BEHAVIOR_DRAIN):
            demand_g = _skipped(GateName.DEMAND, "the node takes no new work")
            named = (("work", work), ("power", power), ("vm", vm))
        else:
            demand_g = no_demand(c)
            named = (("demand", demand), ("work", work), ("power", power), ("vm", vm))
        going = fired.rule is not None and fired.code is not R.IDLE_EXCEEDED
        c.forced = going
        work_g = drained(c)
        if fired.code is R.IDLE_EXCEEDED:
            # min warm nodes only: the disruption budget protects fixed capacity
            fleet_g = fleet_gate(
                facts.fleet, policy, False, check_warm=True, check_budget=False, state=state
            )
        else:
            fleet_g = _skipped(
                GateName.FLEET, "cloud VMs: the disruption budget protects fixed capacity only"
            )
    tel_gate, stale, missing, oldest = telemetry_gate(named, now, policy.telemetry_max_age)
    to_refresh(refresh, stale, missing)
    # a stopped VM is destroyed like a running one (only leaving the list confirms it gone)
    stopped = forced and vm is not None and vm.stopped and power is not None
    pwr_gate = power_gate(power, "Off" if stopped else "On", R.ALREADY_OFF)
    cap_gate = control_available(c)
    gates = (pol_gate, wanted, rule_gate, demand_g, work_g, tel_gate, pwr_gate, cap_gate, fleet_g)
    # A VM that should go anyway (forced, broken, pinned off, drain) waits for queued
    # demand instead of being kept for it; an idle VM is kept when work fits it.
    wanted_anyway = fired.rule is not None and fired.code is not R.IDLE_EXCEEDED
    rank = FORCED_SHUTDOWN_RANK if wanted_anyway else RANK
    decision, reasons = decide(gates, Decision.SHUTDOWN, rank, ())
    if fired.code is not None and fired.code not in reasons:
        reasons = (*reasons, fired.code)
    return new_evaluation(
        kind="shutdown",
        decision=decision,
        reasons=reasons,
        gates=gates,
        action=c.action,
        recheck_at=latest_recheck(gates) if decision is Decision.DEFER else None,
        overrides_applied=(),
        timing=_timing(facts, fired, now, policy) if vm is not None else (),
        stale=stale,
        missing=missing,
        oldest_observed_at=oldest,
        refresh=tuple(refresh),
        forced=forced or deleted,
    )
