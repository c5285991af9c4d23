"""States ON_IDLE and ACTIVE: keep admission in step with the desired state, evaluate
the shutdown gates and begin a drain when they pass.
"""

from __future__ import annotations

from datetime import datetime

from nodewarden.policy.actions import (
    POLL_OBSERVED_POWER,
    RUN_READY_PROBE,
)
from nodewarden.policy.events import (
    AdmissionClosed,
)
from nodewarden.policy.gates import evaluate_shutdown
from nodewarden.policy.gpuidle import gpu_only_at
from nodewarden.policy.reasons import Decision, R
from nodewarden.policy.state import (
    AdmissionState,
)
from nodewarden.policy.states.context import (
    StepContext,
    accepts_work,
    observed_off,
    on_state,
    refresh_actions,
    verified_on_ready,
)
from nodewarden.policy.states.moves import (
    admit_if_wanted,
    begin_shutdown,
    close_admission,
    enter_off,
    enter_verify,
)


def handle_on(c: StepContext) -> None:
    ev = c.event
    if observed_off(c, None):
        close_admission(c, None)
        enter_off(c, R.UNEXPECTED_POWER_CHANGE)
        return
    p, r = c.facts.power, c.facts.ready
    if p is None or p.power != "On":
        enter_verify(c, Decision.DEFER, R.UNEXPECTED_POWER_CHANGE)
        return
    if r is None or not r.passed:
        enter_verify(c, Decision.DEFER, R.READY_PROBE_FAILED)
        return
    if type(ev) is AdmissionClosed and c.get("admission") is AdmissionState.CLOSING:
        c.set(admission=AdmissionState.CLOSED, admission_since=min(ev.at, c.now))
    c.set(state=on_state(c))
    evaluation = evaluate_shutdown(c.facts, c.now, c.policy, c.current())
    c.evaluation = evaluation
    if evaluation.decision in (Decision.SHUTDOWN, Decision.DRAIN):
        begin_shutdown(c, evaluation)
        return
    if c.facts.consolidation is not None and c.get("admission") is AdmissionState.OPEN:
        # consolidation by drain: stop admitting, finish what it runs (never evict);
        # once its work ends the usual idle path applies
        close_admission(c, None)
        refresh_actions(c, evaluation.refresh, None)
        c.decide(Decision.DRAIN, R.CONSOLIDATION_DRAIN)
        c.set(recheck_at=evaluation.recheck_at)
        return
    if not accepts_work(c.facts):
        close_admission(c, None)
    elif c.get("admission") is not AdmissionState.OPEN:
        if verified_on_ready(c, None):
            admit_if_wanted(c, None)
        else:
            c.act(POLL_OBSERVED_POWER, RUN_READY_PROBE)
    refresh_actions(c, evaluation.refresh, None)
    c.decide(evaluation.decision, *evaluation.reasons)
    c.set(recheck_at=_earlier(evaluation.recheck_at, _gpu_only_at(c)))


def _gpu_only_at(c: StepContext) -> datetime | None:
    """When the node's GPUs will have been idle long enough for it to take only GPU work
    (`policy.gpuidle`): stepped again then, so its status and record say so on time."""
    work = c.facts.work
    if work is None or work.gpu is None:
        return None
    at = gpu_only_at(work, c.policy.idle_threshold, c.policy.gpu_only)
    return at if at is not None and at > c.now else None


def _earlier(a: datetime | None, b: datetime | None) -> datetime | None:
    if a is None:
        return b
    return a if b is None else min(a, b)
