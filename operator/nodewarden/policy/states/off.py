"""State OFF: evaluate the wake gates and begin a wake when they pass."""

from __future__ import annotations

from nodewarden.policy.events import (
    AdmissionClosed,
    PowerObserved,
)
from nodewarden.policy.gates import evaluate_wake
from nodewarden.policy.reasons import Decision, R
from nodewarden.policy.state import (
    AdmissionState,
)
from nodewarden.policy.states.context import StepContext, refresh_actions
from nodewarden.policy.states.moves import begin_wake, enter_verify, vm_forced_shutdown


def handle_off(c: StepContext) -> None:
    ev = c.event
    # by exact type (no event model has a subclass): a failing isinstance against a
    # pydantic model goes through ABCMeta, and most steps here are Evaluate
    observed = type(ev) is PowerObserved
    power = c.facts.power
    off_since = c.state.off_since
    if (
        observed
        and isinstance(ev, PowerObserved)  # (for mypy: the exact type, the cheap path)
        and power is ev.reading
        and power.power in ("On", "PoweringOn")
        and (off_since is None or power.observed_at >= off_since)
    ):
        enter_verify(c, Decision.DEFER, R.UNEXPECTED_POWER_CHANGE)
        return
    # a cloud VM the cloud still lists, stopped by itself: destroyed by the 'down' rule
    # (not on the Off reading itself, which may be the one saying it left the list)
    if not observed and vm_forced_shutdown(c):
        return
    if type(ev) is AdmissionClosed:
        c.set(admission=AdmissionState.CLOSED, admission_since=min(ev.at, c.now))
    evaluation = evaluate_wake(c.facts, c.now, c.policy, c.current())
    c.evaluation = evaluation
    if evaluation.decision is Decision.START and evaluation.action is not None:
        begin_wake(c, evaluation.action, evaluation)
        return
    refresh_actions(c, evaluation.refresh, None)
    c.decide(evaluation.decision, *evaluation.reasons)
    c.set(recheck_at=evaluation.recheck_at)
