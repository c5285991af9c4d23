"""Why not yet: when a node becomes eligible for its next power transition, and what holds
it now -- read off one step of the machine (`policy.machine.step`), so WorkerNode status
(`status.eligibility`, written by the power controller) and `nodewarden explain` say the
same thing from the same rule code.

    eligibility(step, policy) -> Eligibility
    judged(decision, reasons, evaluation, policy) -> Eligibility   (a scenario's result)
    first_blocking(decision, reasons) -> ReasonCode | None
    to_status(e) -> dict (the wire form of status.eligibility)

* `heldBy`: the first blocking reason of the step (the first reason code of a decision
  that is not the transition itself: min-on, cooldown, the idle threshold, a window, the
  budget, an inhibitor, a drain in progress, no demand...); none when the step acts.
* `heldUntil`: for a hold that ends by the clock (idle threshold, min-on, min-off,
  cooldown, billing window), when it ends.
* `eligibleAt`: when every timing rule of the direction evaluated is met (the latest of
  idle since + idle threshold, on since + min-on, last transition + cooldown, off since +
  min-off, the billing window's next opening; for a node being drained, the idle
  threshold counts as met when the drain began) -- a time, not a countdown: it stays the
  same from one step to the next while the facts do. None while the node is busy or a
  timing reading is missing.

Pure: no I/O, no clock of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from nodewarden.policy.evaluation import Evaluation, GateName
from nodewarden.policy.machine import Step
from nodewarden.policy.reasons import Decision, R, ReasonCode
from nodewarden.policy.state import TransitionKind
from nodewarden.policy.view import PolicyView
from nodewarden.units import format_duration, rfc3339

Direction = Literal["Shutdown", "Wake"]

_ACTS = frozenset({Decision.SHUTDOWN, Decision.START})
_CLOCK_HOLDS: dict[ReasonCode, str] = {
    R.IDLE_WINDOW_NOT_MET: "idleThreshold",
    R.MIN_ON_NOT_MET: "minOn",
    R.MIN_OFF_NOT_MET: "minOff",
    R.COOLDOWN: "cooldown",
}
"""Holds that end by the clock, and the timing measure that says when."""


@dataclass(frozen=True, slots=True)
class Eligibility:
    """A node's eligibility for its next transition (see the module docstring)."""

    direction: Direction | None
    decision: Decision
    held_by: ReasonCode | None
    held_until: datetime | None
    eligible_at: datetime | None
    idle_threshold: timedelta


def first_blocking(decision: Decision, reasons: tuple[ReasonCode, ...]) -> ReasonCode | None:
    """The reason that holds the node: the first code of a decision that does not act."""
    if decision in _ACTS or not reasons:
        return None
    return reasons[0]


def _timing_recheck(evaluation: Evaluation) -> datetime | None:
    for gate in evaluation.gates:
        if gate.gate is GateName.TIMING:
            return gate.recheck
    return None


def _eligible_at(evaluation: Evaluation, drain_began: datetime | None) -> datetime | None:
    """The latest time a timing rule of `evaluation` is met (None: one cannot say). The
    idle threshold of a node being drained was checked when the drain began (`drain_began`)."""
    times: list[datetime] = []
    for m in evaluation.timing:
        if m.waived:
            continue
        if m.name == "idleThreshold" and m.since is None and m.met and drain_began is not None:
            times.append(drain_began)
            continue
        if m.name == "billingWindow":
            if not m.met:
                recheck = _timing_recheck(evaluation)
                if recheck is None:
                    return None
                times.append(recheck)
            continue
        if m.since is None:
            if m.met:
                continue  # never transitioned, or checked when the drain began
            return None  # busy, or the reading is missing
        times.append(m.since + timedelta(seconds=m.required))
    return max(times) if times else None


def _held_until(evaluation: Evaluation | None, held: ReasonCode | None) -> datetime | None:
    if evaluation is None or held is None:
        return None
    if held is R.BILLING_WINDOW_CLOSED:
        return _timing_recheck(evaluation)
    name = _CLOCK_HOLDS.get(held)
    if name is None:
        return None
    for m in evaluation.timing:
        if m.name == name and m.since is not None:
            return m.since + timedelta(seconds=m.required)
    return None


def eligibility(step: Step, policy: PolicyView) -> Eligibility:
    """What `step` (one step of the machine) says of the node's next transition."""
    t = step.next.transition
    began = t.started_at if t is not None and t.kind is TransitionKind.SHUTDOWN else None
    return judged(step.decision, step.reasons, step.evaluation, policy, began)


def judged(
    decision: Decision,
    reasons: tuple[ReasonCode, ...],
    evaluation: Evaluation | None,
    policy: PolicyView,
    drain_began: datetime | None = None,
) -> Eligibility:
    """What a decision, its reasons and its gate evaluation say of the next transition."""
    held = first_blocking(decision, reasons)
    direction: Direction | None = None
    eligible: datetime | None = None
    if evaluation is not None:
        direction = "Shutdown" if evaluation.kind == "shutdown" else "Wake"
        eligible = _eligible_at(evaluation, drain_began)
    return Eligibility(
        direction,
        decision,
        held,
        _held_until(evaluation, held),
        eligible,
        policy.idle_threshold,
    )


def to_status(e: Eligibility) -> dict[str, Any]:
    """`status.eligibility` (no null members: a merge patch deletes what is absent by the
    null the writer sends for a key it held)."""
    out: dict[str, Any] = {
        "direction": e.direction,
        "decision": e.decision.value,
        "heldBy": e.held_by.value if e.held_by is not None else None,
        "heldUntil": rfc3339(e.held_until),
        "eligibleAt": rfc3339(e.eligible_at),
        "idleThreshold": format_duration(e.idle_threshold),
    }
    return out
