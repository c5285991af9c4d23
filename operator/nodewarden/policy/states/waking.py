"""State WAKING: the wake request's outcome, observed On + ready, re-sends, retries
and the wake deadline.
"""

from __future__ import annotations

from nodewarden.policy.actions import (
    POLL_OBSERVED_POWER,
    RUN_READY_PROBE,
    request_power,
)
from nodewarden.policy.backoff import backoff_delay
from nodewarden.policy.events import (
    AdmissionClosed,
    DeadlineReached,
    Evaluate,
    ReadyProbeResult,
    RequestAccepted,
    RequestErrored,
    RequestRejected,
)
from nodewarden.policy.gates import evaluate_wake
from nodewarden.policy.reasons import Decision, R, ReasonCode
from nodewarden.policy.state import (
    AdmissionState,
    Transition,
    new_request,
)
from nodewarden.policy.states.context import StepContext, poll_missing, verified_on_ready
from nodewarden.policy.states.moves import (
    REQUEST_EVENTS,
    block,
    close_transition,
    enter_on,
    record_outcome,
    schedule_retry,
)


def handle_waking(c: StepContext) -> None:
    t = c.transition
    assert t is not None
    ev = c.event
    if isinstance(ev, REQUEST_EVENTS):
        t = record_outcome(c, t)
        if isinstance(ev, (RequestRejected, RequestErrored)):
            if isinstance(ev, RequestErrored):
                c.act(POLL_OBSERVED_POWER)
            code = R.REQUEST_REJECTED if isinstance(ev, RequestRejected) else R.REQUEST_ERRORED
            if t.retries_used < c.policy.retry_budget:
                schedule_retry(c, t, c.policy.deadline_wake)
                c.decide(Decision.DEFER, code, R.BACKOFF)
            else:
                block(c, code, R.RETRY_BUDGET_EXHAUSTED)
            return
    if isinstance(ev, AdmissionClosed):
        c.set(admission=AdmissionState.CLOSED, admission_since=min(ev.at, c.now))
    p, r = c.facts.power, c.facts.ready
    requested = t.first_requested_at
    seen = t.power_on_seen_at
    if (
        seen is None
        and p is not None
        and p.power == "On"
        and requested is not None
        and p.observed_at >= requested
    ):
        seen = p.observed_at
        t = t.model_copy(
            update={
                "power_on_seen_at": seen,
                "deadline": c.now + c.policy.deadline_ready,
                "next_attempt_at": None,
            }
        )
        c.set(transition=t)
        if not verified_on_ready(c, seen):
            c.act(RUN_READY_PROBE)
            c.decide(Decision.DEFER, R.POWER_ON_CONFIRMED, R.READY_PROBE_PENDING)
            return
    if seen is not None:
        if p is not None and p.power == "Off" and p.observed_at > seen:
            t = t.model_copy(update={"power_on_seen_at": None})
            c.set(transition=t)
            seen = None
        elif verified_on_ready(c, seen):
            close_transition(c, t, "Succeeded", R.READY_CONFIRMED)
            c.set(last_transition_at=c.now)
            enter_on(c, seen, R.POWER_ON_CONFIRMED)
            return
    if c.now >= t.deadline:
        _wake_deadline(c, t)
        return
    if seen is not None:
        failed = r is not None and not r.passed and r.observed_at >= seen
        if isinstance(ev, ReadyProbeResult) and failed:
            failures = t.probe_failures + 1
            nxt = c.now + backoff_delay(failures, c.policy, t.id + "/probe")
            c.set(
                transition=t.model_copy(update={"probe_failures": failures, "next_attempt_at": nxt})
            )
            c.set(recheck_at=nxt)
            c.decide(Decision.DEFER, R.READY_PROBE_FAILED, R.BACKOFF)
            return
        due = t.next_attempt_at is None or c.now >= t.next_attempt_at
        pending = poll_missing(c, seen, due)
        c.decide(Decision.DEFER, R.READY_PROBE_FAILED if failed else pending)
        return
    if t.next_attempt_at is not None and c.now >= t.next_attempt_at:
        _resend_wake(c, t, ())
        return
    if t.next_attempt_at is not None:
        c.decide(Decision.DEFER, R.BACKOFF)
        c.set(recheck_at=t.next_attempt_at)
        return
    if isinstance(ev, (RequestAccepted, Evaluate, DeadlineReached)):
        c.act(POLL_OBSERVED_POWER)
    c.decide(Decision.DEFER, R.CONFIRMATION_PENDING)


def _resend_wake(c: StepContext, t: Transition, lead: tuple[ReasonCode, ...]) -> None:
    """Re-send the wake request unless the policy or capability now forbids it."""
    evaluation = evaluate_wake(c.facts, c.now, c.policy, c.current())
    c.evaluation = evaluation
    if evaluation.decision is Decision.BLOCK or evaluation.action is None:
        block(c, *lead, *evaluation.reasons)
        return
    attempt = (t.request.attempt if t.request is not None else 0) + 1
    request = new_request(evaluation.action, attempt, c.now)
    nt = t.model_copy(
        update={
            "request": request,
            "next_attempt_at": None,
            "deadline": c.now + c.policy.deadline_wake,
        }
    )
    c.set(transition=nt)
    c.act(request_power(t.id, evaluation.action, attempt))
    c.decide(Decision.DEFER, *lead, R.CONFIRMATION_PENDING)


def _wake_deadline(c: StepContext, t: Transition) -> None:
    seen = t.power_on_seen_at
    if seen is not None:
        r = c.facts.ready
        failed = r is not None and not r.passed and r.observed_at >= seen
        pending = R.READY_PROBE_FAILED if failed else R.READY_PROBE_PENDING
        if t.retries_used < c.policy.retry_budget:
            nt = t.model_copy(
                update={
                    "retries_used": t.retries_used + 1,
                    "deadline": c.now + c.policy.deadline_ready,
                    "next_attempt_at": None,
                }
            )
            c.set(transition=nt)
            c.act(RUN_READY_PROBE)
            c.decide(Decision.DEFER, R.DEADLINE_EXCEEDED, pending)
        else:
            block(c, R.DEADLINE_EXCEEDED, R.RETRY_BUDGET_EXHAUSTED, pending)
        return
    if t.retries_used < c.policy.retry_budget:
        nt = t.model_copy(update={"retries_used": t.retries_used + 1})
        c.set(transition=nt)
        c.act(POLL_OBSERVED_POWER)
        _resend_wake(c, nt, (R.DEADLINE_EXCEEDED,))
    else:
        block(c, R.DEADLINE_EXCEEDED, R.RETRY_BUDGET_EXHAUSTED, R.CONFIRMATION_PENDING)
