"""State SHUTTING_DOWN: the request's outcome, observed Off, races before the
irreversible step, re-sends, retries and the shutdown deadline.
"""

from __future__ import annotations

from datetime import timedelta

from nodewarden.policy.actions import (
    POLL_OBSERVED_POWER,
)
from nodewarden.policy.events import (
    AdmissionClosed,
    DeadlineReached,
    Evaluate,
    PowerObserved,
    RequestAccepted,
    RequestErrored,
    RequestRejected,
)
from nodewarden.policy.gates import evaluate_shutdown
from nodewarden.policy.overrides import force_off_permitted
from nodewarden.policy.reasons import Decision, R, ReasonCode
from nodewarden.policy.state import (
    AdmissionState,
    Transition,
    TransitionKind,
)
from nodewarden.policy.states.context import StepContext, observed_off, refresh_actions
from nodewarden.policy.states.moves import (
    REQUEST_EVENTS,
    abort_shutdown,
    block,
    close_transition,
    enter_off,
    record_outcome,
    request_shutdown,
    schedule_retry,
)

_RESEND_RECHECK = timedelta(seconds=5)
"""How soon a re-send held back only by stale evidence is tried again."""


def _demand_present(c: StepContext) -> bool:
    d = c.facts.demand
    return d is not None and d.queued > 0


def handle_shutting_down(c: StepContext) -> None:
    t = c.transition
    assert t is not None
    ev = c.event
    if isinstance(ev, REQUEST_EVENTS):
        t = record_outcome(c, t)
    if observed_off(c, t.first_requested_at):
        close_transition(c, t, "Succeeded", R.POWER_OFF_CONFIRMED)
        c.set(last_transition_at=c.now)
        race = (R.RACE_DEMAND_ARRIVED,) if c.get("race") else ()
        enter_off(c, *race)
        return
    if isinstance(ev, AdmissionClosed):
        c.set(admission=AdmissionState.CLOSED, admission_since=min(ev.at, c.now))
    if _demand_present(c):
        if not t.possibly_applied:
            abort_shutdown(c, Decision.NONE, R.DEMAND_PRESENT)
            return
        c.set(race=True)
    race_codes = (R.RACE_DEMAND_ARRIVED,) if c.get("race") else ()
    if isinstance(ev, RequestRejected):
        _retry_or_give_up(c, t, R.REQUEST_REJECTED, race_codes)
        return
    if isinstance(ev, RequestErrored):
        c.act(POLL_OBSERVED_POWER)
        _retry_or_give_up(c, t, R.REQUEST_ERRORED, race_codes)
        return
    if c.now >= t.deadline:
        _shutdown_deadline(c, t, race_codes)
        return
    if t.next_attempt_at is not None and c.now >= t.next_attempt_at:
        _resend_shutdown(c, t, (), race_codes)
        return
    if t.next_attempt_at is not None:
        c.decide(Decision.DEFER, *race_codes, R.BACKOFF)
        c.set(recheck_at=t.next_attempt_at)
        return
    if isinstance(ev, (RequestAccepted, Evaluate, DeadlineReached, PowerObserved)):
        c.act(POLL_OBSERVED_POWER)
    c.decide(Decision.DEFER, *race_codes, R.CONFIRMATION_PENDING)


def _resend_shutdown(
    c: StepContext, t: Transition, lead: tuple[ReasonCode, ...], race_codes: tuple[ReasonCode, ...]
) -> None:
    """Re-evaluate every gate and, only if all pass, send the next attempt."""
    evaluation = evaluate_shutdown(c.facts, c.now, c.policy, c.current())
    c.evaluation = evaluation
    attempt = (t.request.attempt if t.request is not None else 0) + 1
    if evaluation.decision is Decision.SHUTDOWN and evaluation.action is not None:
        # A ForceOff escalation is re-sent only while its override is still permitted.
        force = t.force_off and force_off_permitted(c.facts, c.policy)
        if force:
            request_shutdown(
                c,
                t,
                "ForceOff",
                attempt,
                (*lead, *evaluation.reasons, R.OVERRIDE_APPLIED),
                (*evaluation.overrides_applied, "forceOff"),
                force_off=True,
            )
        else:
            request_shutdown(
                c,
                t,
                evaluation.action,
                attempt,
                (*lead, *evaluation.reasons),
                evaluation.overrides_applied,
            )
        return
    if evaluation.decision in (Decision.NONE, Decision.BLOCK) and not t.possibly_applied:
        abort_shutdown(c, evaluation.decision, *lead, *evaluation.reasons)
        return
    if evaluation.decision in (Decision.NONE, Decision.BLOCK):
        # A request may have taken effect: never send another while a gate fails, and
        # never pretend it did not happen. Wait for observed Off until the deadline.
        c.set(transition=t.model_copy(update={"next_attempt_at": None}))
        c.decide(Decision.DEFER, *race_codes, *lead, R.CONFIRMATION_PENDING, *evaluation.reasons)
        c.act(POLL_OBSERVED_POWER)
        return
    # Evidence is stale or missing: ask for it, and try the re-send again shortly after
    # (not only at the next deadline, when the same evidence may be stale again).
    refresh_actions(c, evaluation.refresh, t.id)
    retry_at = c.now + min(c.policy.initial_backoff, _RESEND_RECHECK)
    c.set(transition=t.model_copy(update={"next_attempt_at": retry_at}))
    c.decide(Decision.DEFER, *race_codes, *lead, *evaluation.reasons)
    c.set(recheck_at=evaluation.recheck_at)


def _retry_or_give_up(
    c: StepContext, t: Transition, code: ReasonCode, race_codes: tuple[ReasonCode, ...]
) -> None:
    if t.retries_used < c.policy.retry_budget:
        schedule_retry(c, t, c.policy.deadline_shutdown)
        c.decide(Decision.DEFER, *race_codes, code, R.BACKOFF)
        return
    _exhausted(c, t, code, race_codes)


def _exhausted(
    c: StepContext, t: Transition, code: ReasonCode, race_codes: tuple[ReasonCode, ...]
) -> None:
    if (
        t.kind is TransitionKind.SHUTDOWN
        and not t.force_off
        and force_off_permitted(c.facts, c.policy)
    ):
        escalated = t.model_copy(update={"force_off": True})
        c.set(transition=escalated)
        evaluation = evaluate_shutdown(c.facts, c.now, c.policy, c.current())
        c.evaluation = evaluation
        if evaluation.decision is Decision.SHUTDOWN:
            attempt = (t.request.attempt if t.request is not None else 0) + 1
            request_shutdown(
                c,
                escalated,
                "ForceOff",
                attempt,
                (code, R.RETRY_BUDGET_EXHAUSTED, R.OVERRIDE_APPLIED, *evaluation.reasons),
                (*evaluation.overrides_applied, "forceOff"),
                force_off=True,
            )
            return
    block(c, *race_codes, code, R.RETRY_BUDGET_EXHAUSTED)


def _shutdown_deadline(c: StepContext, t: Transition, race_codes: tuple[ReasonCode, ...]) -> None:
    """No observed Off by the deadline: re-send (gates permitting) or BLOCK."""
    if t.retries_used < c.policy.retry_budget:
        nt = t.model_copy(
            update={
                "retries_used": t.retries_used + 1,
                "next_attempt_at": None,
                "deadline": c.now + c.policy.deadline_shutdown,
            }
        )
        c.set(transition=nt)
        c.act(POLL_OBSERVED_POWER)
        _resend_shutdown(c, nt, (R.DEADLINE_EXCEEDED,), race_codes)
        return
    _exhausted(c, t, R.DEADLINE_EXCEEDED, race_codes)
