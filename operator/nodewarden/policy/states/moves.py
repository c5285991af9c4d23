"""The moves shared by the state handlers: enter OFF / UNKNOWN (verify) / ON / BLOCKED,
open, abort and close transitions, close and open admission, send the shutdown
request, record a request's outcome and schedule a retry.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Literal

from nodewarden.api.powerpolicy import ResetAction
from nodewarden.policy.actions import (
    POLL_OBSERVED_POWER,
    RUN_READY_PROBE,
    CancelPendingShutdown,
    CloseAdmission,
    CloseTransition,
    OpenAdmission,
    TransitionOutcome,
    open_transition_action,
    refresh_facts,
    request_power,
    reread_demand,
    schedule_recheck,
)
from nodewarden.policy.backoff import backoff_delay
from nodewarden.policy.evaluation import Evaluation
from nodewarden.policy.events import (
    Event,
    RequestAccepted,
    RequestErrored,
    RequestRejected,
)
from nodewarden.policy.gates import evaluate_shutdown
from nodewarden.policy.reasons import Decision, R, ReasonCode
from nodewarden.policy.state import (
    AdmissionState,
    PowerRequest,
    PowerState,
    RequestStatus,
    Transition,
    TransitionKind,
    new_request,
    new_transition,
)
from nodewarden.policy.states.context import (
    StepContext,
    accepts_work,
    dedupe,
    on_state,
    transition_id,
)

REQUEST_EVENTS = (RequestAccepted, RequestRejected, RequestErrored)


def close_admission(c: StepContext, tid: str | None) -> None:
    if c.get("admission") is AdmissionState.OPEN:
        c.act(CloseAdmission(transition_id=tid))
        c.set(admission=AdmissionState.CLOSING, admission_since=c.now)


def admit_if_wanted(c: StepContext, tid: str | None) -> bool:
    """Open admission if the node should take work; returns whether it did."""
    if not accepts_work(c.facts):
        return False
    if c.get("admission") is not AdmissionState.OPEN:
        c.act(OpenAdmission(transition_id=tid))
        c.set(admission=AdmissionState.OPEN, admission_since=c.now)
    return True


def close_transition(
    c: StepContext, t: Transition, outcome: TransitionOutcome, *reasons: ReasonCode
) -> None:
    if t.kind is not TransitionKind.VERIFY:
        c.act(
            CloseTransition(
                transition_id=t.id, kind=t.kind, outcome=outcome, reasons=tuple(reasons)
            )
        )


def enter_off(c: StepContext, *reasons: ReasonCode) -> None:
    """Record OFF (only ever called on an observed-Off event)."""
    power = c.facts.power
    assert power is not None
    closed_since = c.get("admission_since") if c.get("admission") is AdmissionState.CLOSED else None
    c.set(
        state=PowerState.OFF,
        transition=None,
        off_since=power.observed_at,
        admission=AdmissionState.CLOSED,
        admission_since=closed_since or c.now,  # closed since the drain, if it was
        blocked_reasons=(),
        blocked_transition=None,
    )
    c.act(schedule_recheck(c.now, "evaluate wake after observed Off"))
    c.decide(Decision.NONE, *reasons, R.POWER_OFF_CONFIRMED)


def enter_verify(c: StepContext, decision: Decision, *reasons: ReasonCode) -> None:
    """Guard state UNKNOWN: re-establish observed power and readiness from fresh evidence."""
    seq = c.state.seq
    tid = transition_id(c.state.node, TransitionKind.VERIFY, c.now, seq)
    close_admission(c, tid)
    t = new_transition(
        id=tid,
        kind=TransitionKind.VERIFY,
        started_at=c.now,
        deadline=c.now + c.policy.deadline_ready,
        verify_since=c.now,
    )
    c.set(state=PowerState.UNKNOWN, transition=t, blocked_reasons=(), blocked_transition=None)
    c.act(POLL_OBSERVED_POWER, RUN_READY_PROBE)
    c.decide(decision, *reasons, R.POWER_STATE_UNKNOWN, R.READY_PROBE_PENDING)


def enter_on(c: StepContext, on_since: datetime, *reasons: ReasonCode) -> None:
    t = c.transition
    tid = t.id if t is not None else None
    c.set(state=on_state(c), transition=None, on_since=on_since, blocked_reasons=())
    if admit_if_wanted(c, tid):
        c.decide(Decision.START, *reasons, R.READY_CONFIRMED)
    else:
        c.decide(Decision.NONE, *reasons, R.READY_CONFIRMED, R.IDLE_BEHAVIOR_HOLD)


def block(c: StepContext, *reasons: ReasonCode) -> None:
    t = c.transition
    if t is not None:
        close_transition(c, t, "Blocked", *reasons)
    close_admission(c, t.id if t is not None else None)
    codes = tuple(dedupe(reasons))
    c.set(
        state=PowerState.BLOCKED,
        transition=None,
        blocked_reasons=codes,
        blocked_transition=t.kind if t is not None else None,
    )
    c.decide(Decision.BLOCK, *codes)


def abort_shutdown(c: StepContext, decision: Decision, *reasons: ReasonCode) -> None:
    """Abandon a shutdown before its irreversible step; re-verify before reopening."""
    t = c.transition
    assert t is not None
    race = R.DEMAND_PRESENT in reasons
    codes = ((R.RACE_DEMAND_ARRIVED,) if race else ()) + (R.TRANSITION_ABORTED, *reasons)
    c.act(CancelPendingShutdown(transition_id=t.id))
    close_transition(c, t, "Aborted", *codes)
    if race:
        c.set(race=True)
    enter_verify(c, decision, *codes)


def open_transition(
    c: StepContext, kind: TransitionKind, deadline: datetime, request: PowerRequest | None = None
) -> Transition:
    """A new transition of `kind`, Manual when a PowerIntent asks for it; emits OpenTransition."""
    manual = c.facts.intent
    if manual is not None and manual.action != kind.value:  # PowerIntent says Shutdown/Wake
        manual = None
    origin: Literal["Policy", "Manual"] = "Policy" if manual is None else "Manual"
    t = new_transition(
        id=transition_id(c.state.node, kind, c.now, c.state.seq),
        kind=kind,
        origin=origin,
        intent=None if manual is None else manual.name,
        started_at=c.now,
        deadline=deadline,
        request=request,
        first_requested_at=None if request is None else c.now,
    )
    c.act(open_transition_action(t.id, kind, origin, t.intent, deadline))
    return t


def begin_wake(c: StepContext, action: ResetAction, evaluation: Evaluation) -> None:
    t = open_transition(
        c,
        TransitionKind.WAKE,
        c.now + c.policy.deadline_wake,
        new_request(action, 1, c.now),
    )
    c.set(state=PowerState.WAKING, transition=t, race=False, blocked_reasons=())
    c.act(request_power(t.id, action, 1))
    c.decide(Decision.START, *evaluation.reasons)


def closed_since_ever(c: StepContext) -> None:
    """Admission that was never opened (a held node) is confirmed closed as of now."""
    if c.get("admission") is AdmissionState.CLOSED and c.get("admission_since") is None:
        c.set(admission_since=c.now)


def begin_shutdown(c: StepContext, evaluation: Evaluation) -> None:
    t = open_transition(c, TransitionKind.SHUTDOWN, c.now + c.policy.deadline_drain)
    c.set(state=PowerState.DRAINING, transition=t, race=False)
    closed_since_ever(c)
    if c.get("admission") is AdmissionState.CLOSED:
        c.act(reread_demand(t.id), refresh_facts(("work", "inhibitors")))
    else:
        c.act(CloseAdmission(transition_id=t.id))
        c.set(admission=AdmissionState.CLOSING, admission_since=c.now)
    reasons = (
        evaluation.reasons if evaluation.decision is Decision.DRAIN else (R.DEMAND_NOT_REREAD,)
    )
    c.decide(Decision.DRAIN, *reasons)


def request_shutdown(
    c: StepContext,
    t: Transition,
    action: ResetAction,
    attempt: int,
    reasons: tuple[ReasonCode, ...],
    overrides: tuple[str, ...],
    *,
    force_off: bool = False,
) -> None:
    prior = t.possibly_applied
    request = new_request(action, attempt, c.now)
    nt = t.model_copy(
        update={
            "request": request,
            "first_requested_at": t.first_requested_at or c.now,
            "prior_possibly_applied": prior,
            "next_attempt_at": None,
            "deadline": c.now + c.policy.deadline_shutdown,
            "force_off": force_off,
        }
    )
    intent = c.facts.intent
    c.set(state=PowerState.SHUTTING_DOWN, transition=nt)
    c.act(
        request_power(
            t.id,
            action,
            attempt,
            intent.name if action == "ForceOff" and intent is not None else None,
        )
    )
    c.overrides = overrides
    c.decide(Decision.SHUTDOWN, *reasons)


_REQUEST_EVENT_TYPES: frozenset[type] = frozenset(REQUEST_EVENTS)
"""By exact type (the event models have no subclasses, tests check): every step asks,
and a failing `isinstance` against pydantic models goes through `ABCMeta`."""


def matching_outcome(t: Transition | None, ev: Event) -> bool:
    if type(ev) not in _REQUEST_EVENT_TYPES:
        return True
    assert isinstance(ev, REQUEST_EVENTS)  # for mypy (request outcomes are rare)
    if t is None or t.request is None:
        return False
    req = t.request
    return (
        ev.transition_id == t.id
        and ev.attempt == req.attempt
        and ev.action == req.action
        and req.status is RequestStatus.IN_FLIGHT
    )


def record_outcome(c: StepContext, t: Transition) -> Transition:
    ev = c.event
    assert isinstance(ev, REQUEST_EVENTS) and t.request is not None
    status = {
        "RequestAccepted": RequestStatus.ACCEPTED,
        "RequestRejected": RequestStatus.REJECTED,
        "RequestErrored": RequestStatus.ERRORED,
    }[ev.type]
    request = t.request.model_copy(
        update={"status": status, "result_at": ev.at, "source": ev.source, "detail": ev.detail}
    )
    nt = t.model_copy(update={"request": request})
    c.set(transition=nt)
    return nt


def schedule_retry(c: StepContext, t: Transition, step_deadline: timedelta) -> None:
    """Use one retry: the next attempt waits for the back-off, and the deadline covers
    the wait plus one more step (an outcome may arrive after the old deadline)."""
    n = t.retries_used + 1
    nxt = c.now + backoff_delay(n, c.policy, t.id)
    deadline = max(t.deadline, nxt + step_deadline)
    c.set(
        transition=t.model_copy(
            update={"retries_used": n, "next_attempt_at": nxt, "deadline": deadline}
        ),
        recheck_at=nxt,
    )


def refused(c: StepContext) -> bool:
    cap = c.facts.capability
    return cap is not None and cap.refusal is not None


def vm_forced_shutdown(c: StepContext) -> bool:
    """A cloud VM that cannot do useful work (a forced node-manager rule fired: deleted,
    down, lame, unpaired past boot grace) is shut down from UNKNOWN or BLOCKED without
    draining, once every remaining gate passes. Returns whether it began."""
    if c.facts.node_type != "CloudVM" or c.facts.vm is None:
        return False
    evaluation = evaluate_shutdown(c.facts, c.now, c.policy, c.current())
    if evaluation.decision is not Decision.SHUTDOWN or evaluation.action is None:
        return False
    if not evaluation.forced:
        return False
    c.evaluation = evaluation
    t = open_transition(c, TransitionKind.SHUTDOWN, c.now + c.policy.deadline_shutdown)
    c.set(transition=t, race=False, blocked_reasons=())
    close_admission(c, t.id)
    closed_since_ever(c)
    request_shutdown(c, t, evaluation.action, 1, evaluation.reasons, ())
    return True
