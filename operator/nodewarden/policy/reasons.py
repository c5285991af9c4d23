"""Decisions and reason codes of the power core: the stable, machine-readable vocabulary.

`Decision` is what the core says about a node at one step; `ReasonCode` says why. Both
are `StrEnum`s whose values appear verbatim in PowerIntent status, WorkerNode status,
Kubernetes Events, metrics labels and `nodewarden explain` output, so values never
change once released. Every code is documented in `REASON_DOCS` (meaning + what an
operator does about it); `docs/reason-codes.md` is the same table in prose and a test
keeps the two in step.

`DecisionClass` groups codes by the decision a failing gate leads to; the gate
evaluation in `nodewarden.policy.gates` picks the decision from the classes present.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from nodewarden.policy.base import fast_members


class Decision(StrEnum):
    """What the core decided at one step."""

    SHUTDOWN = "SHUTDOWN"
    """Every shutdown gate passed; a shutdown request is issued at this step."""
    START = "START"
    """Wake gates passed and a wake request is issued, or the node was verified On and
    Ready and admission opens (the reasons say which)."""
    DRAIN = "DRAIN"
    """Begin or continue draining: admission is (being) closed, running work finishes."""
    DEFER = "DEFER"
    """A transition is wanted or in progress but evidence or time is still missing."""
    BLOCK = "BLOCK"
    """The transition cannot proceed without a person (or a policy change)."""
    NONE = "NONE"
    """Nothing to do: the node is needed, or a transition completed."""


class DecisionClass(StrEnum):
    """Which decision a failing gate with this code leads to (see gates module)."""

    NONE = "none"
    BLOCK = "block"
    DEFER = "defer"
    DRAIN = "drain"
    PROGRESS = "progress"
    """Not a failure: a positive statement of progress (e.g. POWER_OFF_CONFIRMED)."""


class ReasonCode(StrEnum):
    """Stable reason codes. See `REASON_DOCS` for meaning and operator action."""

    # -- gate failures ---------------------------------------------------------
    DEMAND_PRESENT = "DEMAND_PRESENT"
    NO_DEMAND = "NO_DEMAND"
    DEMAND_NOT_REREAD = "DEMAND_NOT_REREAD"
    ACTIVE_WORK = "ACTIVE_WORK"
    GPU_IDLE_CPU_DRAIN = "GPU_IDLE_CPU_DRAIN"
    ADMISSION_OPEN = "ADMISSION_OPEN"
    DRAIN_INCOMPLETE = "DRAIN_INCOMPLETE"
    TELEMETRY_STALE = "TELEMETRY_STALE"
    TELEMETRY_MISSING = "TELEMETRY_MISSING"
    TELEMETRY_FROM_FUTURE = "TELEMETRY_FROM_FUTURE"
    POWER_STATE_UNKNOWN = "POWER_STATE_UNKNOWN"
    ALREADY_OFF = "ALREADY_OFF"
    ALREADY_ON = "ALREADY_ON"
    IDLE_WINDOW_NOT_MET = "IDLE_WINDOW_NOT_MET"
    MIN_ON_NOT_MET = "MIN_ON_NOT_MET"
    MIN_OFF_NOT_MET = "MIN_OFF_NOT_MET"
    COOLDOWN = "COOLDOWN"
    BILLING_WINDOW_CLOSED = "BILLING_WINDOW_CLOSED"
    INHIBITOR_ACTIVE = "INHIBITOR_ACTIVE"
    OVERRIDE_NOT_PERMITTED = "OVERRIDE_NOT_PERMITTED"
    REQUESTER_UNVERIFIED = "REQUESTER_UNVERIFIED"
    IDENTITY_MISMATCH = "IDENTITY_MISMATCH"
    IDENTITY_UNVERIFIED = "IDENTITY_UNVERIFIED"
    POWER_CONTROL_UNAVAILABLE = "POWER_CONTROL_UNAVAILABLE"
    ACTION_NOT_ALLOWED = "ACTION_NOT_ALLOWED"
    POLICY_INVALID = "POLICY_INVALID"
    POLICY_PAUSED = "POLICY_PAUSED"
    DESIRED_ON = "DESIRED_ON"
    DESIRED_OFF = "DESIRED_OFF"
    IDLE_BEHAVIOR_HOLD = "IDLE_BEHAVIOR_HOLD"
    INTENT_NOT_SUPPORTED = "INTENT_NOT_SUPPORTED"
    DISRUPTION_BUDGET_EXHAUSTED = "DISRUPTION_BUDGET_EXHAUSTED"
    MIN_WARM_NODES = "MIN_WARM_NODES"
    WARM_WINDOW = "WARM_WINDOW"
    FORECAST_DEMAND = "FORECAST_DEMAND"
    CONSOLIDATION_DRAIN = "CONSOLIDATION_DRAIN"
    # -- transition progress and trouble --------------------------------------
    CONFIRMATION_PENDING = "CONFIRMATION_PENDING"
    READY_PROBE_PENDING = "READY_PROBE_PENDING"
    READY_PROBE_FAILED = "READY_PROBE_FAILED"
    REQUEST_REJECTED = "REQUEST_REJECTED"
    REQUEST_ERRORED = "REQUEST_ERRORED"
    BACKOFF = "BACKOFF"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    RETRY_BUDGET_EXHAUSTED = "RETRY_BUDGET_EXHAUSTED"
    RACE_DEMAND_ARRIVED = "RACE_DEMAND_ARRIVED"
    TRANSITION_ABORTED = "TRANSITION_ABORTED"
    UNEXPECTED_POWER_CHANGE = "UNEXPECTED_POWER_CHANGE"
    STALE_EVENT_IGNORED = "STALE_EVENT_IGNORED"
    CREDENTIALS_REFUSED = "CREDENTIALS_REFUSED"
    # -- positive statements ---------------------------------------------------
    GATES_PASSED = "GATES_PASSED"
    OVERRIDE_APPLIED = "OVERRIDE_APPLIED"
    POWER_ON_CONFIRMED = "POWER_ON_CONFIRMED"
    POWER_OFF_CONFIRMED = "POWER_OFF_CONFIRMED"
    READY_CONFIRMED = "READY_CONFIRMED"
    SHADOW_MODE = "SHADOW_MODE"
    # -- node-manager rules for cloud VMs (which rule fired) -----------------------
    NODE_DELETED = "NODE_DELETED"
    WORKER_DOWN = "WORKER_DOWN"
    LAME_NODE = "LAME_NODE"
    BOOT_GRACE_EXCEEDED = "BOOT_GRACE_EXCEEDED"
    NODE_BROKEN = "NODE_BROKEN"
    POWER_PINNED_OFF = "POWER_PINNED_OFF"
    IDLE_BEHAVIOR_DRAIN = "IDLE_BEHAVIOR_DRAIN"
    IDLE_EXCEEDED = "IDLE_EXCEEDED"


R = fast_members(ReasonCode)
"""ReasonCode's members, cheaper to read on the hot path (`base.fast_members`):
`R.X is ReasonCode.X`."""


@dataclass(frozen=True, slots=True)
class ReasonDoc:
    """Documentation of one reason code."""

    decision_class: DecisionClass
    meaning: str
    operator_action: str


_R = ReasonCode
_C = DecisionClass

REASON_DOCS: dict[ReasonCode, ReasonDoc] = {
    _R.DEMAND_PRESENT: ReasonDoc(
        _C.NONE,
        "Qualified queued demand exists for this node (containers that fit it are waiting). "
        "Blocks a shutdown; justifies a wake.",
        "Nothing: the node is needed. If the demand is unexpected, inspect "
        "`kubectl get containerdispatches` for queued containers that fit the node.",
    ),
    _R.NO_DEMAND: ReasonDoc(
        _C.NONE,
        "No qualified queued demand for this node, so there is no reason to wake it.",
        "Nothing. Create a Wake PowerIntent or set spec.power On to wake it anyway.",
    ),
    _R.DEMAND_NOT_REREAD: ReasonDoc(
        _C.DRAIN,
        "The demand reading predates the moment admission closed; the queue must be "
        "re-read (not served from a cache) before the irreversible step.",
        "Nothing: nodewarden re-reads the queue. If it persists, check the queue adapter.",
    ),
    _R.ACTIVE_WORK: ReasonDoc(
        _C.NONE,
        "Jobs are running on the node and admission is open: the node is busy.",
        "Nothing. To switch it off anyway, create a Shutdown PowerIntent: the node is "
        "drained first, then switched off.",
    ),
    _R.GPU_IDLE_CPU_DRAIN: ReasonDoc(
        _C.NONE,
        "The node's GPUs have been idle for the idle threshold while CPU-only containers "
        "run on it: it takes only GPU work now (admission GPUOnly) so its CPU work drains "
        "away; the running containers keep it busy until they end (given with ACTIVE_WORK; "
        "the GPU evidence is in the work gate).",
        "Nothing: once the CPU work ends the usual idle path applies. To keep CPU work on "
        "GPU nodes, set spec.placement.gpuIdle: Off in the PowerPolicy.",
    ),
    _R.ADMISSION_OPEN: ReasonDoc(
        _C.DRAIN,
        "Admission is not (yet confirmed) closed, so new work could still be placed.",
        "Nothing: nodewarden closes admission as the first step of a shutdown.",
    ),
    _R.DRAIN_INCOMPLETE: ReasonDoc(
        _C.DRAIN,
        "Admission is closed but jobs are still running, or the job count was read "
        "before admission closed and cannot prove the node drained.",
        "Wait for the jobs to finish (bounded by deadlines.drain). Cancel them if the "
        "node must go off sooner.",
    ),
    _R.TELEMETRY_STALE: ReasonDoc(
        _C.DEFER,
        "A decisive reading (demand, jobs, power, inhibitors) is older than the policy's "
        "telemetryMaxAge. Stale evidence never counts as 'all fine'.",
        "Check the named reading's source in the gate table: an unreachable BMC, a failing "
        "SSH probe or a lagging queue watch.",
    ),
    _R.TELEMETRY_MISSING: ReasonDoc(
        _C.DEFER,
        "A decisive reading has never been supplied (e.g. no probe yet, no boot time, "
        "no idle-since).",
        "Check that probes reach the node and that the adapter named in the gate table "
        "is configured.",
    ),
    _R.TELEMETRY_FROM_FUTURE: ReasonDoc(
        _C.DEFER,
        "A reading carries a timestamp later than the decision clock (beyond the skew "
        "tolerance), so it cannot be ordered against other evidence.",
        "Fix clock synchronisation (NTP) between the operator and the reading's source.",
    ),
    _R.POWER_STATE_UNKNOWN: ReasonDoc(
        _C.DEFER,
        "The trusted power source reports Unknown, PoweringOn or PoweringOff.",
        "Wait; if it persists, check the BMC / cloud console for the node.",
    ),
    _R.ALREADY_OFF: ReasonDoc(
        _C.NONE,
        "Observed power is already Off; there is nothing to switch off.",
        "Nothing.",
    ),
    _R.ALREADY_ON: ReasonDoc(
        _C.NONE,
        "Observed power is already On; there is nothing to wake.",
        "Nothing.",
    ),
    _R.IDLE_WINDOW_NOT_MET: ReasonDoc(
        _C.DEFER,
        "The node has not been idle for the policy's idleThreshold yet.",
        "Nothing: re-evaluated at recheckAt. Lower idleThreshold to switch off sooner.",
    ),
    _R.MIN_ON_NOT_MET: ReasonDoc(
        _C.DEFER,
        "The node has been on for less than the policy's minOn.",
        "Nothing: re-evaluated at recheckAt.",
    ),
    _R.MIN_OFF_NOT_MET: ReasonDoc(
        _C.DEFER,
        "The node has been off for less than the policy's minOff (protects the hardware "
        "from rapid power cycling).",
        "Nothing: the wake happens at recheckAt if demand remains.",
    ),
    _R.COOLDOWN: ReasonDoc(
        _C.DEFER,
        "The last power transition of this node finished less than the policy's cooldown ago.",
        "Nothing: re-evaluated at recheckAt.",
    ),
    _R.BILLING_WINDOW_CLOSED: ReasonDoc(
        _C.DEFER,
        "Cloud VM: the current moment of the billing period is outside the shutdown "
        "window, so switching off now saves nothing.",
        "Nothing: re-evaluated when the window opens (recheckAt).",
    ),
    _R.INHIBITOR_ACTIVE: ReasonDoc(
        _C.BLOCK,
        "An active systemd block-mode inhibitor on 'shutdown' is held on the node "
        "(what/who/why are in the record).",
        "Ask the holder (who) to release it, or create a Manual PowerIntent with "
        "spec.override.inhibitors if the policy permits audited overrides.",
    ),
    _R.OVERRIDE_NOT_PERMITTED: ReasonDoc(
        _C.BLOCK,
        "A manual intent asks to override a gate, but the PowerPolicy does not permit it "
        "(inhibitorOverride.permitted / permitForceOff / allowedRequesters).",
        "Change the PowerPolicy through GitOps, or resolve the inhibitor instead.",
    ),
    _R.REQUESTER_UNVERIFIED: ReasonDoc(
        _C.BLOCK,
        "A manual intent asks to override a gate, but its requester is not verified: the "
        "admission policy that makes spec.requestedBy the authenticated user (and checks the "
        "powerintents/override permission) is not in force, so the name is only what the "
        "requester wrote.",
        "Install the chart's requester admission policy (requesters.admissionPolicy, "
        "Kubernetes >= 1.30); `nodewarden check` says whether it is in force.",
    ),
    _R.IDENTITY_MISMATCH: ReasonDoc(
        _C.BLOCK,
        "The BMC's ComputerSystem.UUID differs from the DMI product UUID the host reports "
        "over SSH: the BMC does not manage the machine whose work, inhibitors and uptime "
        "were read, so its power-off would hit another machine.",
        "Fix spec.bmc (endpoint, systemId) or spec.ssh.address so both name one machine "
        "(re-enrolment, docs/security.md).",
    ),
    _R.IDENTITY_UNVERIFIED: ReasonDoc(
        _C.BLOCK,
        "The host's DMI product UUID cannot be read over SSH (the login may not read "
        "/sys/class/dmi/id/product_uuid), or the BMC reports no ComputerSystem.UUID: nothing "
        "proves the BMC manages this host, so it does not switch it off. Only a Manual "
        "PowerIntent with an audited override (override.recordedIdentity) may rely on the "
        "match recorded at enrolment.",
        "Give the SSH user read access to the product UUID (one sudo rule and "
        "ssh.product_uuid_command, docs/operations.md), or fix the BMC's system.",
    ),
    _R.POWER_CONTROL_UNAVAILABLE: ReasonDoc(
        _C.BLOCK,
        "The node has no usable control method for the needed action, or its allowable "
        "actions are unknown (discovery failed).",
        "Check spec.controlMethod, the BMC's ResetType@Redfish.AllowableValues or the "
        "NIC's Wake-on support.",
    ),
    _R.ACTION_NOT_ALLOWED: ReasonDoc(
        _C.BLOCK,
        "The node supports the action but the PowerPolicy's allowedActions does not list it.",
        "Add the action to allowedActions if it is intended.",
    ),
    _R.POLICY_INVALID: ReasonDoc(
        _C.BLOCK,
        "The PowerPolicy is inconsistent (e.g. windowStart after windowEnd); no new "
        "transition is started under it.",
        "Fix the PowerPolicy; the problems are listed in the policy gate's evidence.",
    ),
    _R.POLICY_PAUSED: ReasonDoc(
        _C.NONE,
        "The PowerPolicy has paused: true; no automatic transition is made.",
        "Unpause the policy when transitions should resume.",
    ),
    _R.DESIRED_ON: ReasonDoc(
        _C.NONE,
        "spec.power is On (or a Wake intent is active): the node is never switched off "
        "automatically.",
        "Set spec.power to Auto to let the policy decide.",
    ),
    _R.DESIRED_OFF: ReasonDoc(
        _C.NONE,
        "spec.power is Off (or a Shutdown intent is active): the node is never woken.",
        "Set spec.power to Auto or On.",
    ),
    _R.IDLE_BEHAVIOR_HOLD: ReasonDoc(
        _C.NONE,
        "spec.idleBehavior is hold (or a Drain intent is active): the node accepts no new "
        "work and is not switched off automatically.",
        "Set idleBehavior to run or drain, or delete the Drain intent.",
    ),
    _R.INTENT_NOT_SUPPORTED: ReasonDoc(
        _C.BLOCK,
        "The manual PowerIntent asks for an action the power core does not perform (Restart).",
        "Delete the intent; restart the node through its BMC directly.",
    ),
    _R.DISRUPTION_BUDGET_EXHAUSTED: ReasonDoc(
        _C.DEFER,
        "The policy's disruptionBudget.maxConcurrentTransitions is reached.",
        "Nothing: the transition starts when another finishes.",
    ),
    _R.MIN_WARM_NODES: ReasonDoc(
        _C.NONE,
        "Switching this node off would leave fewer idle nodes than minWarmNodes.",
        "Nothing; lower minWarmNodes to allow it.",
    ),
    _R.WARM_WINDOW: ReasonDoc(
        _C.NONE,
        "A warm window of the PowerPolicy (warmCapacity.windows) is open for the node's class: "
        "switching it off would leave fewer warm nodes of the class than the window's minWarm "
        "(a shutdown is held), or the class has fewer warm and waking nodes than that (the "
        "node is woken; the wake gates still apply). The record names the window.",
        "Nothing; edit or remove the window, or set warmCapacity.mode Shadow or Off.",
    ),
    _R.FORECAST_DEMAND: ReasonDoc(
        _C.NONE,
        "The forecast (forecastWake) expects more arrivals of the node's class within its "
        "bootTime than the class's warm nodes can take: the node is kept on (a shutdown is "
        "held) or woken ahead of them (the wake gates still apply). The record gives the "
        "hour's rate and the quantile.",
        "Nothing; lower forecastWake.confidence or maxWarmNodes, or set its mode Shadow or Off.",
    ),
    _R.CONSOLIDATION_DRAIN: ReasonDoc(
        _C.DRAIN,
        "Consolidation by drain (spec.consolidation): the node is lightly used, dear per "
        "used resource, and every container it runs fits on other open nodes, so it stops "
        "admitting new work; it finishes what it runs (nothing is evicted), then the usual "
        "idle path applies. The record's consolidation evidence gives the utilisation, the "
        "price and where its work could go.",
        "Nothing; annotate the node or a container nodewarden.io/do-not-consolidate=true to "
        "keep it, or set consolidation.mode Shadow or Off.",
    ),
    _R.CONFIRMATION_PENDING: ReasonDoc(
        _C.DEFER,
        "A power request was made; the trusted source has not yet shown the requested "
        "power state. A request proves only acceptance.",
        "Nothing until the deadline; then the request is retried or the node BLOCKed.",
    ),
    _R.READY_PROBE_PENDING: ReasonDoc(
        _C.DEFER,
        "Power On is observed but the ready probe has not passed yet; admission stays closed.",
        "Nothing until deadlines.ready.",
    ),
    _R.READY_PROBE_FAILED: ReasonDoc(
        _C.DEFER,
        "The ready probe failed; no work is bound to the node. Retried with back-off "
        "until the deadline.",
        "Check the probe output in the record (services the workload needs).",
    ),
    _R.REQUEST_REJECTED: ReasonDoc(
        _C.DEFER,
        "The control endpoint refused the power request (e.g. HTTP 4xx); it was not applied.",
        "Check the request detail; retried with back-off within the retry budget.",
    ),
    _R.REQUEST_ERRORED: ReasonDoc(
        _C.DEFER,
        "The power request failed without a clear answer (timeout, 5xx): it may or may "
        "not have been applied.",
        "Check the BMC / network; retried with back-off within the retry budget.",
    ),
    _R.BACKOFF: ReasonDoc(
        _C.DEFER,
        "Waiting for the back-off delay before the next attempt (nextAttemptAt).",
        "Nothing.",
    ),
    _R.DEADLINE_EXCEEDED: ReasonDoc(
        _C.BLOCK,
        "A transition step passed its deadline without the evidence it waited for. "
        "Success is never assumed: the step is retried while budget remains, else BLOCK.",
        "Inspect the node (BMC console, power, network) and the record's request/confirmation.",
    ),
    _R.RETRY_BUDGET_EXHAUSTED: ReasonDoc(
        _C.BLOCK,
        "The policy's retry budget for this transition is used up; the node is BLOCKED.",
        "Fix the cause, then create a new PowerIntent (or change the policy) to re-verify "
        "the node.",
    ),
    _R.RACE_DEMAND_ARRIVED: ReasonDoc(
        _C.NONE,
        "Demand appeared while the node was draining or shutting down. Before the "
        "irreversible step the shutdown is aborted and admission reopens only after "
        "verified On+Ready; after it, the node is woken once confirmed Off.",
        "Nothing; frequent races suggest idleThreshold is too short.",
    ),
    _R.TRANSITION_ABORTED: ReasonDoc(
        _C.NONE,
        "The transition in progress was abandoned before its irreversible step because a "
        "gate stopped passing, or its replica stopped before recording it on the WorkerNode "
        "(then no request of it was sent).",
        "Nothing; the other reason codes say which gate.",
    ),
    _R.UNEXPECTED_POWER_CHANGE: ReasonDoc(
        _C.NONE,
        "The trusted source reported a power state nodewarden did not request (someone "
        "used the BMC or the power button).",
        "Check who changed the node's power; nodewarden re-verifies it.",
    ),
    _R.STALE_EVENT_IGNORED: ReasonDoc(
        _C.NONE,
        "An event referred to a transition or attempt that is no longer current; it was "
        "recorded and ignored.",
        "Nothing.",
    ),
    _R.CREDENTIALS_REFUSED: ReasonDoc(
        _C.BLOCK,
        "The credential resolver refused the node's BMC, SSH or Wake-on-LAN credentials (a "
        "Secret not designated for the use, or an endpoint not admitted): nothing is sent to "
        "the node, so its power cannot be observed or controlled.",
        "Read the node's Valid condition (it names the field and the rule) and "
        "docs/security.md; an administrator designates the Secret or admits the endpoint.",
    ),
    _R.GATES_PASSED: ReasonDoc(
        _C.PROGRESS,
        "Every gate passed with fresh evidence; the request in this step is justified.",
        "Nothing.",
    ),
    _R.OVERRIDE_APPLIED: ReasonDoc(
        _C.PROGRESS,
        "A pre-authorised, audited manual override passed a gate (inhibitor or ForceOff); "
        "the record names the intent, requester and justification.",
        "Review the override in the PowerIntent if it was not expected.",
    ),
    _R.POWER_ON_CONFIRMED: ReasonDoc(
        _C.PROGRESS,
        "The trusted source shows power On after the wake request.",
        "Nothing.",
    ),
    _R.POWER_OFF_CONFIRMED: ReasonDoc(
        _C.PROGRESS,
        "The trusted source shows power Off; the node is recorded OFF.",
        "Nothing.",
    ),
    _R.READY_CONFIRMED: ReasonDoc(
        _C.PROGRESS,
        "Power On and a passing ready probe are both observed; admission may open.",
        "Nothing.",
    ),
    _R.SHADOW_MODE: ReasonDoc(
        _C.PROGRESS,
        "The PowerPolicy is in Shadow mode: the decision is made and recorded (PowerIntent "
        "phase Shadow, Events) but never carried out.",
        "Review the records; set spec.mode Normal when the decisions look right.",
    ),
    _R.NODE_DELETED: ReasonDoc(
        _C.PROGRESS,
        "Cloud VM rule: the WorkerNode was deleted, so its instance is destroyed (containers "
        "still on it are requeued).",
        "Nothing; the WorkerNode disappears once the instance has left the cloud list.",
    ),
    _R.WORKER_DOWN: ReasonDoc(
        _C.PROGRESS,
        "Cloud VM rule (node-manager matrix 'down'): the node was paired but no probe has "
        "succeeded for heartbeatStaleAfter, or the cloud lists it stopped (nodewarden never "
        "stops VMs); it is destroyed whatever the billing window, and its containers are "
        "requeued once it is gone.",
        "Check why the node stopped answering or stopped (the record's probe and 'stopped' "
        "evidence); nothing else.",
    ),
    _R.LAME_NODE: ReasonDoc(
        _C.PROGRESS,
        "Cloud VM rule: up for dispatch.lameAfter with at least dispatch.lameMinProbes probe "
        "attempts and never a successful probe; it is shut down.",
        "Check the image and the ready command if this happens often.",
    ),
    _R.BOOT_GRACE_EXCEEDED: ReasonDoc(
        _C.PROGRESS,
        "Cloud VM rule (node-manager matrix 'unpaired'): the node never paired (no successful "
        "probe) within bootGrace; it is shut down.",
        "Check the image boots and the ready command passes; raise bootGrace for slow images.",
    ),
    _R.NODE_BROKEN: ReasonDoc(
        _C.PROGRESS,
        "Cloud VM rule: the runner reported the node broken; it takes no new work and is shut "
        "down once its containers are gone.",
        "Look at the node's runner report before it goes, if it matters.",
    ),
    _R.POWER_PINNED_OFF: ReasonDoc(
        _C.PROGRESS,
        "Cloud VM rule: spec.power is Off; the node takes no new work and is destroyed once idle.",
        "Set spec.power to Auto to keep it.",
    ),
    _R.IDLE_BEHAVIOR_DRAIN: ReasonDoc(
        _C.PROGRESS,
        "Cloud VM rule: spec.idleBehavior is drain; the node takes no new work and is shut "
        "down once idle.",
        "Set idleBehavior to run to keep it.",
    ),
    _R.IDLE_EXCEEDED: ReasonDoc(
        _C.PROGRESS,
        "Cloud VM rule (node-manager matrix 'idle'): idle for idleThreshold with the billing "
        "window open; it is drained and shut down.",
        "Raise idleThreshold or minWarmNodes to keep idle nodes longer.",
    ),
}


def decision_class(code: ReasonCode) -> DecisionClass:
    """The decision class a failing gate with `code` belongs to."""
    return REASON_DOCS[code].decision_class
