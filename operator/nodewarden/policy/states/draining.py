"""State DRAINING: admission closed, wait for demand re-read and work to end, then send
the shutdown request (or abort the shutdown on new demand).
"""

from __future__ import annotations

from nodewarden.policy.events import (
    AdmissionClosed,
    DeadlineReached,
    Evaluate,
)
from nodewarden.policy.gates import evaluate_shutdown
from nodewarden.policy.reasons import Decision, R
from nodewarden.policy.state import (
    AdmissionState,
)
from nodewarden.policy.states.context import StepContext, observed_off, refresh_actions
from nodewarden.policy.states.moves import (
    abort_shutdown,
    close_transition,
    enter_off,
    request_shutdown,
)


def handle_draining(c: StepContext) -> None:
    t = c.transition
    assert t is not None
    ev = c.event
    if isinstance(ev, AdmissionClosed) and c.get("admission") is not AdmissionState.CLOSED:
        at = min(max(ev.at, t.started_at), c.now)
        c.set(admission=AdmissionState.CLOSED, admission_since=at)
    if observed_off(c, t.started_at):
        close_transition(c, t, "Aborted", R.UNEXPECTED_POWER_CHANGE)
        c.set(last_transition_at=c.now)
        enter_off(c, R.UNEXPECTED_POWER_CHANGE)
        return
    evaluation = evaluate_shutdown(c.facts, c.now, c.policy, c.current())
    c.evaluation = evaluation
    if c.now >= t.deadline and evaluation.decision is not Decision.SHUTDOWN:
        abort_shutdown(c, Decision.DEFER, R.DEADLINE_EXCEEDED, *evaluation.reasons)
        return
    decision = evaluation.decision
    if decision is Decision.SHUTDOWN and evaluation.action is not None:
        request_shutdown(
            c, t, evaluation.action, 1, evaluation.reasons, evaluation.overrides_applied
        )
        return
    if decision in (Decision.NONE, Decision.BLOCK):
        abort_shutdown(c, decision, *evaluation.reasons)
        return
    if c.get("admission") is AdmissionState.CLOSED or isinstance(ev, (Evaluate, DeadlineReached)):
        refresh_actions(c, evaluation.refresh, t.id)
    c.decide(decision, *evaluation.reasons)
    c.set(recheck_at=evaluation.recheck_at)
