"""State UNKNOWN: re-establish observed power and readiness from fresh evidence
(the verify transition), or block.
"""

from __future__ import annotations

from nodewarden.policy.actions import (
    POLL_OBSERVED_POWER,
    RUN_READY_PROBE,
)
from nodewarden.policy.backoff import backoff_delay
from nodewarden.policy.events import (
    AdmissionClosed,
    ReadyProbeResult,
)
from nodewarden.policy.reasons import Decision, R, ReasonCode
from nodewarden.policy.state import (
    AdmissionState,
    Transition,
    TransitionKind,
)
from nodewarden.policy.states.context import (
    StepContext,
    observed_off,
    poll_missing,
    verified_on_ready,
)
from nodewarden.policy.states.moves import (
    block,
    enter_off,
    enter_on,
    enter_verify,
    refused,
    vm_forced_shutdown,
)


def handle_unknown(c: StepContext) -> None:
    if vm_forced_shutdown(c):
        return
    if refused(c):
        # nothing may be sent to the node: its power can be neither observed nor changed
        block(c, R.CREDENTIALS_REFUSED, R.POWER_CONTROL_UNAVAILABLE)
        return
    t = c.transition
    if t is None or t.kind is not TransitionKind.VERIFY:
        enter_verify(c, Decision.DEFER)
        return
    since = t.verify_since
    if observed_off(c, since):
        enter_off(c)
        return
    if verified_on_ready(c, since):
        uptime = c.facts.uptime
        power = c.facts.power
        assert power is not None
        on_since = (
            uptime.on_since if uptime is not None else (c.state.on_since or power.observed_at)
        )
        enter_on(c, on_since)
        return
    if c.now >= t.deadline:
        pending = _verify_pending(c, t)
        if t.retries_used < c.policy.retry_budget:
            c.set(
                transition=t.model_copy(
                    update={
                        "retries_used": t.retries_used + 1,
                        "deadline": c.now + c.policy.deadline_ready,
                    }
                )
            )
            c.act(POLL_OBSERVED_POWER, RUN_READY_PROBE)
            c.decide(Decision.DEFER, R.DEADLINE_EXCEEDED, pending)
        else:
            block(c, R.DEADLINE_EXCEEDED, R.RETRY_BUDGET_EXHAUSTED, pending)
        return
    _verify_wait(c, t)


def _verify_pending(c: StepContext, t: Transition) -> ReasonCode:
    p = c.facts.power
    since = t.verify_since
    if p is None or p.power != "On" or (since is not None and p.observed_at < since):
        return R.POWER_STATE_UNKNOWN
    r = c.facts.ready
    if r is not None and not r.passed and (since is None or r.observed_at >= since):
        return R.READY_PROBE_FAILED
    return R.READY_PROBE_PENDING


def _verify_wait(c: StepContext, t: Transition) -> None:
    """Wait for fresh power + ready evidence in UNKNOWN, probing with back-off."""
    ev = c.event
    pending = _verify_pending(c, t)
    if isinstance(ev, ReadyProbeResult) and pending is R.READY_PROBE_FAILED:
        failures = t.probe_failures + 1
        nxt = c.now + backoff_delay(failures, c.policy, t.id + "/probe")
        c.set(transition=t.model_copy(update={"probe_failures": failures, "next_attempt_at": nxt}))
        c.decide(Decision.DEFER, R.READY_PROBE_FAILED, R.BACKOFF)
        c.set(recheck_at=nxt)
        return
    if isinstance(ev, AdmissionClosed):
        c.set(admission=AdmissionState.CLOSED, admission_since=min(ev.at, c.now))
    due = t.next_attempt_at is None or c.now >= t.next_attempt_at
    pending = poll_missing(c, t.verify_since, due)
    c.decide(Decision.DEFER, pending)
