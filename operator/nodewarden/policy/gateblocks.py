"""Gate building blocks shared by the side-node gates (`gates`) and the cloud-VM rules
(`cloudvm`): policy, desired, demand, work, power, capability and fleet, and the
control-method action tables.

The blocks both callers judge the same way are gates themselves: they take the
evaluation in progress (`GateInputs`) and are entries of `gates.SHUTDOWN_GATES` /
`gates.WAKE_GATES` as they are (one call per gate; `cloudvm` builds a `GateInputs` too).
`power_gate` and `fleet_gate` take their readings and options instead, because the
cloud-VM rules call them with other ones (a stopped VM must be Off; no disruption
budget). Each block reads each reading's fields once into locals: attribute reads on
pydantic models cost ~4x those on plain objects, and a fleet evaluation makes ~100 per
node. Gate results that depend on nothing but the policy, or on no input at all (the
policy gate, the desired gate when neither spec.power nor an intent is supplied, the
fleet gate without a fleet reading), are built once and shared by every evaluation; gate
results are read-only (see `evaluation.Evidence`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from nodewarden.api.powerpolicy import ResetAction
from nodewarden.policy.evaluation import (
    Evidence,
    GateInputs,
    GateName,
    GateResult,
    Verdict,
    evidence_of,
    gate_result,
)
from nodewarden.policy.facts import (
    FleetReading,
    GpuWork,
    PowerReading,
    WorkReading,
)
from nodewarden.policy.gpuidle import gpu_only
from nodewarden.policy.reasons import R, ReasonCode
from nodewarden.policy.state import AdmissionState, NodePowerState, PowerState, TransitionKind
from nodewarden.policy.view import PolicyView

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
_G_POLICY, _G_DESIRED, _G_DEMAND, _G_WORK = (
    GateName.POLICY,
    GateName.DESIRED,
    GateName.DEMAND,
    GateName.WORK,
)
_G_POWER, _G_CAPABILITY, _G_FLEET = GateName.POWER, GateName.CAPABILITY, GateName.FLEET
_CLOSED, _OPEN = AdmissionState.CLOSED, AdmissionState.OPEN
_ON_IDLE = PowerState.ON_IDLE
_SHUTDOWN_KIND = TransitionKind.SHUTDOWN
_ADMISSION_TEXT: dict[AdmissionState, str] = {a: a.value for a in AdmissionState}


def policy_valid(c: GateInputs) -> GateResult:
    """The policy is valid and not paused (built once per policy version)."""
    policy = c.policy
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
    return gate_result(_G_POLICY, reasons, evidence)


_DEFAULT_DESIRED_EVIDENCE = (
    Evidence("spec.power/idleBehavior", "Auto/run", "default (not supplied)"),
)
_DEFAULT_DESIRED_PASS = GateResult(_G_DESIRED, _PASS, (), _DEFAULT_DESIRED_EVIDENCE)


def transition_wanted(c: GateInputs) -> GateResult:
    """Is the transition wanted? Sets `c.forced` when it is forced (manual, or pinned by
    spec.power).

    A pinned spec.power wins over everything (a node pinned On is never switched off,
    one pinned Off never woken, manual intents included); then a manual intent; then
    spec.power / idleBehavior; then the policy."""
    desired, intent, shutdown = c.facts.desired, c.intent, c.shutdown
    if desired is None and intent is None:
        # Auto/run and no intent: wanted if the other gates agree, never forced.
        return _DEFAULT_DESIRED_PASS
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
        return gate_result(_G_DESIRED, [R.DESIRED_ON], evidence)
    if not shutdown and power == "Off":
        return gate_result(_G_DESIRED, [R.DESIRED_OFF], evidence)
    if intent is not None:
        evidence = (*evidence, evidence_of("intent", f"{intent.action} ({intent.name})", intent))
        action = intent.action
        if action == "Restart":
            return gate_result(_G_DESIRED, [R.INTENT_NOT_SUPPORTED], evidence)
        if action == "Drain":
            return gate_result(_G_DESIRED, [R.IDLE_BEHAVIOR_HOLD], evidence)
        if (action == "Shutdown") == shutdown:
            c.forced = True
            return GateResult(_G_DESIRED, _PASS, (), evidence)
        code = R.DESIRED_ON if shutdown else R.DESIRED_OFF
        return gate_result(_G_DESIRED, [code], evidence)
    if shutdown:
        if power == "Off":
            c.forced = True
            return GateResult(_G_DESIRED, _PASS, (), evidence)
        if behavior == "hold":
            return gate_result(_G_DESIRED, [R.IDLE_BEHAVIOR_HOLD], evidence)
        c.forced = behavior == "drain"
        return GateResult(_G_DESIRED, _PASS, (), evidence)
    if power == "On":
        c.forced = True
        return GateResult(_G_DESIRED, _PASS, (), evidence)
    if behavior != "run":
        return gate_result(_G_DESIRED, [R.IDLE_BEHAVIOR_HOLD], evidence)
    return GateResult(_G_DESIRED, _PASS, (), evidence)


def power_gate(
    power: PowerReading | None, wanted: Literal["On", "Off"], already: ReasonCode
) -> GateResult:
    """Observed power is `wanted` (from a trusted source); `already` if it is the other one."""
    if power is None:
        return gate_result(
            _G_POWER, [R.TELEMETRY_MISSING], (Evidence("power", "missing", "-", None),)
        )
    value = power.power
    evidence = (Evidence("power", value, power.source, power.observed_at),)
    if value == wanted:
        return GateResult(_G_POWER, _PASS, (), evidence)
    if value == "On" or value == "Off":
        return GateResult(_G_POWER, _FAIL, (already,), evidence)
    return GateResult(_G_POWER, _FAIL, (R.POWER_STATE_UNKNOWN,), evidence)


def control_available(c: GateInputs) -> GateResult:
    """The control method exists and an action of the direction evaluated is both
    allowable on the node and allowed by the policy; sets `c.action` to it."""
    cap, policy = c.facts.capability, c.policy
    table = SHUTDOWN_ACTIONS if c.shutdown else WAKE_ACTIONS
    evidence: tuple[Evidence, ...]
    if cap is None:
        evidence = (Evidence("controlMethod", "unknown", "-", None),)
        return gate_result(_G_CAPABILITY, [R.POWER_CONTROL_UNAVAILABLE], evidence)
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
        return gate_result(
            _G_CAPABILITY, [R.CREDENTIALS_REFUSED, R.POWER_CONTROL_UNAVAILABLE], evidence
        )
    candidates = table.get(method, ())
    if not candidates or allowable is None:
        return gate_result(_G_CAPABILITY, [R.POWER_CONTROL_UNAVAILABLE], evidence)
    # The first candidate (in table order) the node allows and the policy permits.
    supported = False
    for candidate in candidates:
        if candidate in allowable:
            supported = True
            if candidate in policy.allowed_actions:
                c.action = candidate
                return GateResult(_G_CAPABILITY, _PASS, (), evidence)
    if not supported:
        return gate_result(_G_CAPABILITY, [R.POWER_CONTROL_UNAVAILABLE], evidence)
    evidence = (
        *evidence,
        Evidence(
            "policy.allowedActions",
            ",".join(sorted(policy.allowed_actions)),
            "PowerPolicy/" + policy.version.name,
            None,
        ),
    )
    return gate_result(_G_CAPABILITY, [R.ACTION_NOT_ALLOWED], evidence)


_FLEET_NOT_SUPPLIED = GateResult(
    _G_FLEET, _SKIPPED, (), (Evidence("fleet", "not supplied", "-", None),)
)


def fleet_gate(
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
    is idle with admission open).

    The result depends on nothing but the reading, the policy and these flags: it is kept
    in the policy's memo for the last reading seen (the nodes a round steps share their
    policy's reading, `rules.fleet.FleetTally.reading`), and shared like the other
    read-only gate results."""
    if fleet is None:
        return _FLEET_NOT_SUPPLIED
    counted = state is not None and state.state is _ON_IDLE and state.admission is _OPEN
    key = (own_transition, check_warm, check_budget, counted)
    memo: tuple[FleetReading, dict[tuple[bool, ...], GateResult]] | None = policy.memo.get(
        "fleet_gate"
    )
    if memo is None or memo[0] is not fleet:  # (holding the reading keeps its id unique)
        memo = policy.memo["fleet_gate"] = (fleet, {})
    else:
        found = memo[1].get(key)
        if found is not None:
            return found
    made = memo[1][key] = _fleet_gate(
        fleet, policy, own_transition, check_warm, check_budget, counted
    )
    return made


def _fleet_gate(
    fleet: FleetReading,
    policy: PolicyView,
    own_transition: bool,
    check_warm: bool,
    check_budget: bool,
    counted: bool,
) -> GateResult:
    reasons: list[ReasonCode] = []
    left = max(0, fleet.warm_idle_nodes - (1 if counted else 0))
    source, seen = fleet.source, fleet.observed_at
    evidence = (
        Evidence("transitionsInProgress", fleet.transitions_in_progress, source, seen),
        Evidence("maxConcurrentTransitions", policy.max_concurrent_transitions, "-", None),
        Evidence("warmIdleNodes", fleet.warm_idle_nodes, source, seen),
        Evidence("warmIdleNodesLeft", left, source, seen),
    )
    if (
        check_budget
        and not own_transition
        and fleet.transitions_in_progress >= policy.max_concurrent_transitions
    ):
        reasons.append(R.DISRUPTION_BUDGET_EXHAUSTED)
    if check_warm and left < policy.min_warm_nodes:
        reasons.append(R.MIN_WARM_NODES)
    if check_warm and fleet.node_class is not None:
        with_class, held = _class_warmth(fleet, counted, evidence)
        if held is not None:
            reasons.append(held)
        return gate_result(_G_FLEET, reasons, with_class)
    return gate_result(_G_FLEET, reasons, evidence)


def _class_warmth(
    fleet: FleetReading, counted: bool, before: tuple[Evidence, ...]
) -> tuple[tuple[Evidence, ...], ReasonCode | None]:
    """The warm-capacity levers on a shutdown (`rules.warm`): the code that holds the node
    when going would leave its class fewer warm nodes than the levers in force want
    (None: nothing holds it), with the evidence; a Shadow lever's hold is evidence only."""
    left = max(0, fleet.class_warm_idle - (1 if counted else 0))
    target, shadow = fleet.warm_target, fleet.shadow_target
    if target <= 0 and shadow <= 0:
        return before, None
    evidence: tuple[Evidence, ...] = (
        *before,
        evidence_of("nodeClass", fleet.node_class, fleet),
        evidence_of("classWarmNodesLeft", left, fleet),
    )
    held: ReasonCode | None = None
    if target > 0:
        evidence = (*evidence, evidence_of("warmTarget", f"{target}: {fleet.warm_why}", fleet))
        if left < target:
            held = R.FORECAST_DEMAND if fleet.warm_lever == "Forecast" else R.WARM_WINDOW
    if shadow > 0 and left < shadow:
        evidence = (
            *evidence,
            evidence_of(
                "shadowWarmHold", f"would keep it on ({shadow}): {fleet.shadow_why}", fleet
            ),
        )
    return evidence, held


def warm_wake(fleet: FleetReading | None) -> ReasonCode | None:
    """The lever that wants a node of this class woken: its class has fewer warm and coming
    nodes than the levers in force want (None: none does)."""
    if fleet is None or fleet.warm_target <= 0:
        return None
    if fleet.class_warm_idle + fleet.class_coming >= fleet.warm_target:
        return None
    return R.FORECAST_DEMAND if fleet.warm_lever == "Forecast" else R.WARM_WINDOW


def _warm_wake_evidence(fleet: FleetReading) -> tuple[Evidence, ...]:
    return (
        evidence_of("nodeClass", fleet.node_class, fleet),
        evidence_of("classWarmAndComing", fleet.class_warm_idle + fleet.class_coming, fleet),
        evidence_of("warmTarget", f"{fleet.warm_target}: {fleet.warm_why}", fleet),
    )


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


def no_demand(c: GateInputs) -> GateResult:
    """No qualified queued demand; once admission is closed, re-read after closing."""
    demand = c.facts.demand
    if demand is None:
        return GateResult(
            _G_DEMAND, _FAIL, (R.TELEMETRY_MISSING,), (Evidence("queued", "missing", "-", None),)
        )
    queued = demand.queued
    demand_seen = demand.observed_at
    d_reasons: tuple[ReasonCode, ...] = (R.DEMAND_PRESENT,) if queued > 0 else ()
    if c.admission is _CLOSED and ((floor := c.floor) is None or demand_seen < floor):
        d_reasons = (*d_reasons, R.DEMAND_NOT_REREAD)
        c.refresh.append("demand")
    return GateResult(
        _G_DEMAND,
        _FAIL if d_reasons else _PASS,
        d_reasons,
        (Evidence("queued", queued, demand.source, demand_seen),),
    )


def drained(c: GateInputs) -> GateResult:
    """No active jobs, admission confirmed closed, drain complete (a job count read after
    admission closed shows 0). `c.forced`: running work means drain, not "busy"."""
    work, admission, admission_since = c.facts.work, c.admission, c.admission_since
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
    gpu = work.gpu
    if gpu is not None:
        w_evidence = (*w_evidence, *_gpu_evidence(c, work, gpu))
    if admission is not _CLOSED:
        code = R.ACTIVE_WORK if active > 0 and not c.forced else R.ADMISSION_OPEN
        if code is R.ACTIVE_WORK and gpu is not None and _gpu_only(c, work):
            # still busy; GPU work only from now on: its CPU work drains away
            return GateResult(_G_WORK, _FAIL, (code, R.GPU_IDLE_CPU_DRAIN), w_evidence)
        return GateResult(_G_WORK, _FAIL, (code,), w_evidence)
    if active > 0 or (floor := c.floor) is None or work_seen < floor:
        c.refresh.append("work")
        return GateResult(_G_WORK, _FAIL, (R.DRAIN_INCOMPLETE,), w_evidence)
    return GateResult(_G_WORK, _PASS, (), w_evidence)


def _gpu_only(c: GateInputs, work: WorkReading) -> bool:
    p = c.policy
    return gpu_only(work, p.idle_threshold, p.telemetry_max_age, c.now, p.gpu_only)


def _gpu_evidence(c: GateInputs, work: WorkReading, gpu: GpuWork) -> tuple[Evidence, ...]:
    """A GPU node's GPU evidence (`policy.gpuidle`): GPUs held, since when idle, the
    probe's utilisation, and whether it takes only GPU work now (admission GPUOnly)."""
    since = gpu.gpu_idle_since
    out = [
        Evidence("gpus", gpu.gpus, gpu.source, gpu.observed_at),
        Evidence("gpuJobs", gpu.gpu_jobs, gpu.source, gpu.observed_at),
        Evidence(
            "gpuIdleSince", since.isoformat() if since else "busy", gpu.source, gpu.observed_at
        ),
    ]
    util = gpu.utilisation
    out.append(
        Evidence(
            "gpuUtilisation",
            "none read"
            if util is None
            else ",".join("N/A" if u is None else f"{u:g}%" for u in util) or "no GPUs listed",
            gpu.utilisation_source or "-",
            gpu.utilisation_at,
        )
    )
    out.append(Evidence("gpuOnly", _gpu_only(c, work), "nodewarden", c.now))
    return tuple(out)


def demand_present(c: GateInputs) -> GateResult:
    """Qualified demand present (waived for a Wake intent or spec.power On)."""
    demand = c.facts.demand
    if c.forced:
        return GateResult(
            _G_DEMAND,
            _WAIVED,
            (),
            (evidence_of("queued", demand.queued if demand else "not needed", demand),),
        )
    if demand is None:
        return gate_result(
            _G_DEMAND, [R.TELEMETRY_MISSING], (Evidence("queued", "missing", "-", None),)
        )
    queued = demand.queued
    d_evidence = (Evidence("queued", queued, demand.source, demand.observed_at),)
    if queued == 0:
        fleet = c.facts.fleet
        # warm capacity wakes side nodes only (cloud VMs are created by the dispatcher)
        warm = warm_wake(fleet) if c.facts.node_type == "SideNode" else None
        if warm is not None and fleet is not None:
            c.warm = warm  # no queued demand: warm capacity justifies the wake
            return GateResult(_G_DEMAND, _PASS, (), (*d_evidence, *_warm_wake_evidence(fleet)))
        if fleet is not None and fleet.shadow_target > fleet.class_warm_idle + fleet.class_coming:
            shadow = Evidence("shadowWarmWake", f"would wake it: {fleet.shadow_why}", fleet.source)
            return GateResult(_G_DEMAND, _FAIL, (R.NO_DEMAND,), (*d_evidence, shadow))
        return GateResult(_G_DEMAND, _FAIL, (R.NO_DEMAND,), d_evidence)
    return GateResult(_G_DEMAND, _PASS, (), d_evidence)
