"""nodewarden.policy: the pure decision core (facts in, decision and evidence out, no I/O).

Nothing here performs I/O, reads the clock or imports adapters, kopf or Kubernetes
clients: every function takes the facts, a timezone-aware `now` and the policy, and
returns values. The kopf handlers and the dispatcher call it through these seams:

Cloud worker nodes (node-manager matrix, `nodemanager`)
    decide(worker_state, billing_window, boot_grace, idle_grace) -> NodeManagerAction | None
    decide_for(CloudWorkerFacts, PolicyView, now) -> MatrixDecision   (derives the tuple)

Power gates (`gates`): "should this node go off / be woken?", no transition made
    evaluate_shutdown(facts, now, policy, state=None) -> Evaluation
    evaluate_wake(facts, now, policy, state=None) -> Evaluation

Power state machine (`machine`) for side nodes and VMs
    step(state, facts, event, now, policy) -> Step(next, actions, decision, reasons,
                                                   evaluation, facts, record)
    The shell persists `Step.next` (NodePowerState, JSON via model_dump(by_alias=True)),
    carries `Step.facts` forward, executes `Step.actions` (`actions`) and feeds the
    outcomes back as events (`events`).

Safety Record (`record`)
    Step.record / record_for_evaluation(...) -> SafetyRecord
    record.to_status() -> PowerIntent status.safetyRecord; record.summary() -> one line;
    event_summary(record) -> Kubernetes Event reason/type/message.

WorkerNode status values: api_state(PowerState) -> status.state, api_admission(...) ->
status.admission (Closing counts as Closed).

Policy (`view`): PolicyView.from_spec(PowerPolicySpec, name=, generation=) parses the
knobs once and carries the policy version (name, generation, content hash).

Vocabulary (`reasons`): Decision, ReasonCode (documented in REASON_DOCS and
docs/reason-codes.md). Scenarios for `nodewarden explain` (`scenario`).
"""

from __future__ import annotations

from nodewarden.policy.actions import (
    Action,
    CancelPendingShutdown,
    CloseAdmission,
    CloseTransition,
    OpenAdmission,
    OpenTransition,
    PollObservedPower,
    RefreshFacts,
    RequestPower,
    RereadDemand,
    RunReadyProbe,
    ScheduleRecheck,
)
from nodewarden.policy.evaluation import Evaluation, Evidence, GateName, GateResult, Verdict
from nodewarden.policy.events import (
    AdmissionClosed,
    DeadlineReached,
    DemandReread,
    Evaluate,
    Event,
    ManualOverride,
    NewDemand,
    PolicyChanged,
    PowerObserved,
    ReadyProbeResult,
    RequestAccepted,
    RequestErrored,
    RequestRejected,
    apply_event,
)
from nodewarden.policy.facts import (
    CapabilityReading,
    DemandReading,
    DesiredReading,
    FleetReading,
    Inhibitor,
    InhibitorReading,
    ManualIntent,
    NodeFacts,
    OverrideRequest,
    PowerReading,
    ReadyReading,
    UptimeReading,
    WorkReading,
)
from nodewarden.policy.gates import evaluate_shutdown, evaluate_wake
from nodewarden.policy.machine import Step, replay, step
from nodewarden.policy.nodemanager import NodeManagerAction, decide, decide_for
from nodewarden.policy.reasons import REASON_DOCS, Decision, ReasonCode
from nodewarden.policy.record import EventSummary, SafetyRecord, event_summary
from nodewarden.policy.record_build import record_for_evaluation
from nodewarden.policy.state import (
    AdmissionState,
    NodePowerState,
    PowerState,
    Transition,
    TransitionKind,
    api_admission,
    api_state,
)
from nodewarden.policy.view import PolicyVersion, PolicyView

__all__ = [
    "REASON_DOCS",
    "Action",
    "AdmissionClosed",
    "AdmissionState",
    "CancelPendingShutdown",
    "CapabilityReading",
    "CloseAdmission",
    "CloseTransition",
    "DeadlineReached",
    "Decision",
    "DemandReading",
    "DemandReread",
    "DesiredReading",
    "Evaluate",
    "Evaluation",
    "Event",
    "EventSummary",
    "Evidence",
    "FleetReading",
    "GateName",
    "GateResult",
    "Inhibitor",
    "InhibitorReading",
    "ManualIntent",
    "ManualOverride",
    "NewDemand",
    "NodeFacts",
    "NodeManagerAction",
    "NodePowerState",
    "OpenAdmission",
    "OpenTransition",
    "OverrideRequest",
    "PolicyChanged",
    "PolicyVersion",
    "PolicyView",
    "PollObservedPower",
    "PowerObserved",
    "PowerReading",
    "PowerState",
    "ReadyProbeResult",
    "ReadyReading",
    "ReasonCode",
    "RefreshFacts",
    "RequestAccepted",
    "RequestErrored",
    "RequestPower",
    "RequestRejected",
    "RereadDemand",
    "RunReadyProbe",
    "SafetyRecord",
    "ScheduleRecheck",
    "Step",
    "Transition",
    "TransitionKind",
    "UptimeReading",
    "Verdict",
    "WorkReading",
    "api_admission",
    "api_state",
    "apply_event",
    "decide",
    "decide_for",
    "evaluate_shutdown",
    "evaluate_wake",
    "event_summary",
    "record_for_evaluation",
    "replay",
    "step",
]
