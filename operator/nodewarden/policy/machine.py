"""The power transition state machine for side nodes and VMs: a pure function.

    step(state, facts, event, now, policy) -> Step(next, actions, record, decision, ...)

`state` is the persisted `NodePowerState`, `facts` the latest `NodeFacts`, `event` what
happened (`nodewarden.policy.events`), `now` a timezone-aware clock reading and `policy`
a `PolicyView`. The result is the next state, the actions the shell must carry out
(`nodewarden.policy.actions`), the decision with its reason codes and the Safety
Record. Nothing is mutated and nothing is read from the environment: the same inputs
always give the same outputs (transition ids and back-off jitter are derived by hashing).

Rules that hold in every state (the hypothesis test in tests/policy proves them):

* A shutdown request (GracefulShutdown / SshPoweroff / ForceOff) and the SHUTDOWN
  decision are only issued when every shutdown gate passes at that step.
* The state becomes OFF only on a PowerObserved event whose reading is Off.
* Admission is Open only while the latest facts show observed power On and a passing
  ready probe; it opens only on both, observed after the transition began.
* WAKING, DRAINING, SHUTTING_DOWN and UNKNOWN always carry a deadline.
* ForceOff is only requested after GracefulShutdown failed, with a manual intent whose
  override the policy permits; the record lists the override as applied.
* A request proves acceptance only. Before any request that may have taken effect,
  new demand aborts the shutdown (race flag) and admission reopens only after a fresh
  verification of power On + ready; after it, the shutdown runs to observed Off.
* At a deadline success is never assumed: retry while the budget lasts, else BLOCKED.

The transition table is in docs/state-machine.md. `step` is the dispatcher: it applies
the event, runs the handler of the current state (`HANDLERS`, one module per state in
`nodewarden.policy.states`) and builds the Safety Record.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime

from nodewarden.policy.actions import (
    Action,
    CloseTransition,
    OpenTransition,
    RequestPower,
    ScheduleRecheck,
    describe,
    schedule_recheck,
)
from nodewarden.policy.base import require_aware, trusted
from nodewarden.policy.evaluation import Evaluation
from nodewarden.policy.events import (
    Evaluate,
    Event,
    apply_event,
)
from nodewarden.policy.facts import NodeFacts
from nodewarden.policy.reasons import Decision, R, ReasonCode
from nodewarden.policy.record import SafetyRecord
from nodewarden.policy.record_build import build_record, reevaluated, same_decision
from nodewarden.policy.state import (
    NON_TERMINAL_STATES,
    NodePowerState,
    PowerState,
    check_invariants,
)
from nodewarden.policy.states.blocked import handle_blocked
from nodewarden.policy.states.context import StepContext
from nodewarden.policy.states.draining import handle_draining
from nodewarden.policy.states.moves import matching_outcome
from nodewarden.policy.states.off import handle_off
from nodewarden.policy.states.on import handle_on
from nodewarden.policy.states.shutting_down import handle_shutting_down
from nodewarden.policy.states.unknown import handle_unknown
from nodewarden.policy.states.waking import handle_waking
from nodewarden.policy.view import PolicyView


@dataclass(frozen=True, slots=True)
class Step:
    """The outcome of one step."""

    next: NodePowerState
    actions: tuple[Action, ...]
    decision: Decision
    reasons: tuple[ReasonCode, ...]
    evaluation: Evaluation | None
    facts: NodeFacts
    record: SafetyRecord | None
    overrides_applied: tuple[str, ...] = ()
    record_reused: bool = False
    """`record` is the `previous` record given to `step`, re-evaluated (same decision)."""


HANDLERS: dict[PowerState, Callable[[StepContext], None]] = {
    PowerState.UNKNOWN: handle_unknown,
    PowerState.OFF: handle_off,
    PowerState.ON_IDLE: handle_on,
    PowerState.ACTIVE: handle_on,
    PowerState.DRAINING: handle_draining,
    PowerState.SHUTTING_DOWN: handle_shutting_down,
    PowerState.WAKING: handle_waking,
    PowerState.BLOCKED: handle_blocked,
}


def step(
    state: NodePowerState,
    facts: NodeFacts,
    event: Event,
    now: datetime,
    policy: PolicyView,
    *,
    with_record: bool = True,
    previous: SafetyRecord | None = None,
) -> Step:
    """Advance the machine by one event. Pure; see the module docstring.

    `previous`: the node's last Safety Record. When this step reaches the same decision
    (`record.same_decision`) and opens, closes or requests nothing, the record is
    `previous` with the new evaluation time (`record_reused`), not a full one."""
    require_aware(now)
    if facts.node != state.node:
        raise ValueError(f"facts are for node {facts.node!r} but state is for {state.node!r}")
    merged = apply_event(facts, event)
    stale = not matching_outcome(state.transition, event)
    effective: Event = Evaluate() if stale else event
    c = StepContext(state, merged, effective, now, policy)  # positional: half the cost
    HANDLERS[state.state](c)
    if stale:
        c.reasons.append(R.STALE_EVENT_IGNORED)
    nxt = _finish(c)
    actions = tuple(c.actions)
    reasons = tuple(c.reasons)
    record = None
    reused = False
    if (
        with_record
        and previous is not None
        and not _any_of(actions, _RECORD_ALWAYS)
        and same_decision(
            previous,
            before=state,
            after=nxt,
            facts=merged,
            now=now,
            policy=policy,
            evaluation=c.evaluation,
            decision=c.decision,
            reasons=reasons,
            overrides_applied=c.overrides,
        )
    ):
        record, reused = reevaluated(previous, now), True
    elif with_record:
        record = build_record(
            before=state,
            after=nxt,
            facts=merged,
            event=event.type,
            now=now,
            policy=policy,
            evaluation=c.evaluation,
            decision=c.decision,
            reasons=reasons,
            actions=tuple(map(describe, actions)),
            overrides_applied=c.overrides,
        )
    # positional, in field order (keyword arguments to a class cost twice as much)
    return Step(
        nxt, actions, c.decision, reasons, c.evaluation, merged, record, c.overrides, reused
    )


_RECORD_ALWAYS: frozenset[type] = frozenset({OpenTransition, CloseTransition, RequestPower})
"""Actions whose step always gets a full record."""
_RECHECK: frozenset[type] = frozenset({ScheduleRecheck})


def _any_of(actions: Iterable[Action], kinds: frozenset[type]) -> bool:
    """Whether an action is of one of the types `kinds` (the action models have no
    subclasses, `actions.ACTION_TYPES`: an exact type lookup, ~10x cheaper than a failing
    `isinstance` against pydantic models, which goes through `ABCMeta`; a loop: `any()`
    over a generator costs a frame per call)."""
    for a in actions:  # noqa: SIM110 -- see the docstring
        if type(a) in kinds:
            return True
    return False


def _finish(c: StepContext) -> NodePowerState:
    new_state: PowerState = c.get("state")
    if new_state is not c.state.state:
        c.set(state_since=c.now)
    t = c.transition
    recheck: datetime | None = c.upd.get("recheck_at")  # only what the handler asked for
    if new_state in NON_TERMINAL_STATES and t is not None:
        wake_at = t.deadline if recheck is None else min(recheck, t.deadline)
        if t.next_attempt_at is not None:
            wake_at = min(wake_at, t.next_attempt_at)
        recheck = wake_at
    if len(c.actions) > 1:  # (comparing models costs a Python call each)
        unique: list[Action] = []
        for a in c.actions:
            if a not in unique:
                unique.append(a)
        c.actions = unique
    if recheck is not None and not _any_of(c.actions, _RECHECK):
        c.act(schedule_recheck(max(recheck, c.now), c.decision.value))
    seq = c.state.seq + 1
    c.set(recheck_at=recheck, seq=seq, last_decision=c.decision, last_reasons=tuple(c.reasons))
    # Built without re-validating its fields: each is the state's own (validated) value
    # or one a handler set from validated models and the clock (types checked by mypy,
    # and tests/policy compare these states with fully validated ones). The model's
    # invariants (deadlines, admission) are checked here, as its validator would.
    # Saves a full validation (~20 % of a step, counted under valgrind).
    check_invariants(new_state, c.get("transition"), seq, c.get("admission"))
    return trusted(NodePowerState, {**c.state.__dict__, **c.upd})


def replay(
    state: NodePowerState,
    facts: NodeFacts,
    events: list[tuple[datetime, Event]],
    policy: PolicyView,
) -> list[Step]:
    """Feed events in order (each at its time), carrying state and merged facts along."""
    steps: list[Step] = []
    for at, event in events:
        result = step(state, facts, event, at, policy)
        steps.append(result)
        state, facts = result.next, result.facts
    return steps


__all__ = ["HANDLERS", "Step", "replay", "step"]
