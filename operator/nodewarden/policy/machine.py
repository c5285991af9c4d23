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

The transition table is in docs/state-machine.md.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from nodewarden.api.powerpolicy import ResetAction
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
    TransitionOutcome,
    describe,
)
from nodewarden.policy.backoff import backoff_delay
from nodewarden.policy.base import require_aware, trusted
from nodewarden.policy.events import (
    AdmissionClosed,
    DeadlineReached,
    Evaluate,
    Event,
    ManualOverride,
    PolicyChanged,
    PowerObserved,
    ReadyProbeResult,
    RequestAccepted,
    RequestErrored,
    RequestRejected,
    apply_event,
)
from nodewarden.policy.facts import FactName, NodeFacts
from nodewarden.policy.gates import (
    Evaluation,
    evaluate_shutdown,
    evaluate_wake,
    force_off_permitted,
)
from nodewarden.policy.reasons import Decision, ReasonCode
from nodewarden.policy.record import SafetyRecord, build_record, reevaluated, same_decision
from nodewarden.policy.state import (
    NON_TERMINAL_STATES,
    AdmissionState,
    NodePowerState,
    PowerRequest,
    PowerState,
    RequestStatus,
    Transition,
    TransitionKind,
)
from nodewarden.policy.view import PolicyView

R = ReasonCode
_REQUEST_EVENTS = (RequestAccepted, RequestRejected, RequestErrored)


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


@dataclass(slots=True)
class _Ctx:
    """Scratch space of one step (local to `step`, never escapes)."""

    state: NodePowerState
    facts: NodeFacts
    event: Event
    now: datetime
    policy: PolicyView
    upd: dict[str, Any] = field(default_factory=dict)
    actions: list[Action] = field(default_factory=list)
    decision: Decision = Decision.NONE
    reasons: list[ReasonCode] = field(default_factory=list)
    evaluation: Evaluation | None = None
    overrides: tuple[str, ...] = ()

    def get(self, name: str) -> Any:
        return self.upd[name] if name in self.upd else getattr(self.state, name)

    @property
    def transition(self) -> Transition | None:
        t: Transition | None = self.get("transition")
        return t

    def current(self) -> NodePowerState:
        """The state as updated so far (unvalidated view for gate evaluation; the state
        the step returns is validated in `_finish`)."""
        if not self.upd:
            return self.state
        return trusted(NodePowerState, {**self.state.__dict__, **self.upd})

    def set(self, **values: Any) -> None:
        self.upd.update(values)

    def decide(self, decision: Decision, *reasons: ReasonCode) -> None:
        self.decision = decision
        self.reasons = _dedupe(reasons)

    def act(self, *actions: Action) -> None:
        self.actions.extend(actions)


def _dedupe(codes: Any) -> list[ReasonCode]:
    out: list[ReasonCode] = []
    for c in codes:
        if c not in out:
            out.append(c)
    return out


def transition_id(node: str, kind: TransitionKind, now: datetime, seq: int) -> str:
    """Deterministic, DNS-label-safe transition id: kind-date-time-hash."""
    digest = hashlib.sha256(f"{node}|{kind.value}|{now.isoformat()}|{seq}".encode()).hexdigest()
    return f"{kind.value.lower()}-{now.astimezone(UTC):%Y%m%d-%H%M%S}-{digest[:8]}"


# -- helpers ------------------------------------------------------------------------------


def _fresh(c: _Ctx, at: datetime) -> bool:
    return c.now - at <= c.policy.telemetry_max_age


def _accepts_work(facts: NodeFacts) -> bool:
    """Whether the node should take new work once verified (desired, not observed)."""
    intent = facts.intent
    if intent is not None and intent.action in ("Shutdown", "Drain"):
        return False
    desired = facts.desired
    if desired is None:
        return True
    return desired.power != "Off" and desired.idle_behavior == "run"


def _observed_off(c: _Ctx, since: datetime | None) -> bool:
    """The event is a PowerObserved Off reading, now the node's latest power reading."""
    ev = c.event
    if not isinstance(ev, PowerObserved) or ev.reading.power != "Off":
        return False
    if c.facts.power is not ev.reading:
        return False
    return since is None or ev.reading.observed_at >= since


def _verified_on_ready(c: _Ctx, since: datetime | None) -> bool:
    """Observed On and a passing ready probe, both fresh and observed at/after `since`."""
    p, r = c.facts.power, c.facts.ready
    if p is None or r is None or p.power != "On" or not r.passed:
        return False
    if not (_fresh(c, p.observed_at) and _fresh(c, r.observed_at)):
        return False
    return since is None or (p.observed_at >= since and r.observed_at >= since)


def _poll_missing(c: _Ctx, since: datetime | None, probe_due: bool) -> ReasonCode:
    """Ask for whichever of power / readiness is not yet fresh evidence after `since`;
    returns the reason code of what is still pending."""
    p, r = c.facts.power, c.facts.ready
    power_ok = (
        p is not None
        and p.power == "On"
        and _fresh(c, p.observed_at)
        and (since is None or p.observed_at >= since)
    )
    ready_ok = (
        r is not None
        and r.passed
        and _fresh(c, r.observed_at)
        and (since is None or r.observed_at >= since)
    )
    if not power_ok:
        c.act(PollObservedPower())
    if not ready_ok and probe_due:
        c.act(RunReadyProbe())
    if not power_ok:
        return R.POWER_STATE_UNKNOWN if p is None or p.power != "On" else R.TELEMETRY_STALE
    if r is not None and not r.passed and (since is None or r.observed_at >= since):
        return R.READY_PROBE_FAILED
    return R.READY_PROBE_PENDING if not ready_ok else R.CONFIRMATION_PENDING


def _on_state(c: _Ctx) -> PowerState:
    work = c.facts.work
    return PowerState.ACTIVE if work is not None and work.active_jobs > 0 else PowerState.ON_IDLE


def _refresh_actions(c: _Ctx, names: tuple[FactName, ...], tid: str | None) -> None:
    rest: list[FactName] = []
    for name in names:
        if name == "demand":
            c.act(RereadDemand(transition_id=tid))
        elif name == "power":
            c.act(PollObservedPower())
        elif name == "ready":
            c.act(RunReadyProbe())
        elif name not in rest:
            rest.append(name)
    if rest:
        c.act(RefreshFacts(facts=tuple(rest)))


def _close_admission(c: _Ctx, tid: str | None) -> None:
    if c.get("admission") is AdmissionState.OPEN:
        c.act(CloseAdmission(transition_id=tid))
        c.set(admission=AdmissionState.CLOSING, admission_since=c.now)


def _admit_if_wanted(c: _Ctx, tid: str | None) -> bool:
    """Open admission if the node should take work; returns whether it did."""
    if not _accepts_work(c.facts):
        return False
    if c.get("admission") is not AdmissionState.OPEN:
        c.act(OpenAdmission(transition_id=tid))
        c.set(admission=AdmissionState.OPEN, admission_since=c.now)
    return True


def _close_transition(
    c: _Ctx, t: Transition, outcome: TransitionOutcome, *reasons: ReasonCode
) -> None:
    if t.kind is not TransitionKind.VERIFY:
        c.act(
            CloseTransition(
                transition_id=t.id, kind=t.kind, outcome=outcome, reasons=tuple(reasons)
            )
        )


def _enter_off(c: _Ctx, *reasons: ReasonCode) -> None:
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
    c.act(ScheduleRecheck(at=c.now, reason="evaluate wake after observed Off"))
    c.decide(Decision.NONE, *reasons, R.POWER_OFF_CONFIRMED)


def _enter_verify(c: _Ctx, decision: Decision, *reasons: ReasonCode) -> None:
    """Guard state UNKNOWN: re-establish observed power and readiness from fresh evidence."""
    seq = c.state.seq
    tid = transition_id(c.state.node, TransitionKind.VERIFY, c.now, seq)
    _close_admission(c, tid)
    t = Transition(
        id=tid,
        kind=TransitionKind.VERIFY,
        started_at=c.now,
        deadline=c.now + c.policy.deadline_ready,
        verify_since=c.now,
    )
    c.set(state=PowerState.UNKNOWN, transition=t, blocked_reasons=(), blocked_transition=None)
    c.act(PollObservedPower(), RunReadyProbe())
    c.decide(decision, *reasons, R.POWER_STATE_UNKNOWN, R.READY_PROBE_PENDING)


def _enter_on(c: _Ctx, on_since: datetime, *reasons: ReasonCode) -> None:
    t = c.transition
    tid = t.id if t is not None else None
    c.set(state=_on_state(c), transition=None, on_since=on_since, blocked_reasons=())
    if _admit_if_wanted(c, tid):
        c.decide(Decision.START, *reasons, R.READY_CONFIRMED)
    else:
        c.decide(Decision.NONE, *reasons, R.READY_CONFIRMED, R.IDLE_BEHAVIOR_HOLD)


def _block(c: _Ctx, *reasons: ReasonCode) -> None:
    t = c.transition
    if t is not None:
        _close_transition(c, t, "Blocked", *reasons)
    _close_admission(c, t.id if t is not None else None)
    codes = tuple(_dedupe(reasons))
    c.set(
        state=PowerState.BLOCKED,
        transition=None,
        blocked_reasons=codes,
        blocked_transition=t.kind if t is not None else None,
    )
    c.decide(Decision.BLOCK, *codes)


def _abort_shutdown(c: _Ctx, decision: Decision, *reasons: ReasonCode) -> None:
    """Abandon a shutdown before its irreversible step; re-verify before reopening."""
    t = c.transition
    assert t is not None
    race = R.DEMAND_PRESENT in reasons
    codes = ((R.RACE_DEMAND_ARRIVED,) if race else ()) + (R.TRANSITION_ABORTED, *reasons)
    c.act(CancelPendingShutdown(transition_id=t.id))
    _close_transition(c, t, "Aborted", *codes)
    if race:
        c.set(race=True)
    _enter_verify(c, decision, *codes)


# -- state handlers -------------------------------------------------------------------------


def _vm_forced_shutdown(c: _Ctx) -> bool:
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
    t = _open_transition(c, TransitionKind.SHUTDOWN, c.now + c.policy.deadline_shutdown)
    c.set(transition=t, race=False, blocked_reasons=())
    _close_admission(c, t.id)
    _closed_since_ever(c)
    _request_shutdown(c, t, evaluation.action, 1, evaluation.reasons, ())
    return True


def _refused(c: _Ctx) -> bool:
    cap = c.facts.capability
    return cap is not None and cap.refusal is not None


def _handle_unknown(c: _Ctx) -> None:
    if _vm_forced_shutdown(c):
        return
    if _refused(c):
        # nothing may be sent to the node: its power can be neither observed nor changed
        _block(c, R.CREDENTIALS_REFUSED, R.POWER_CONTROL_UNAVAILABLE)
        return
    t = c.transition
    if t is None or t.kind is not TransitionKind.VERIFY:
        _enter_verify(c, Decision.DEFER)
        return
    since = t.verify_since
    if _observed_off(c, since):
        _enter_off(c)
        return
    if _verified_on_ready(c, since):
        uptime = c.facts.uptime
        power = c.facts.power
        assert power is not None
        on_since = (
            uptime.on_since if uptime is not None else (c.state.on_since or power.observed_at)
        )
        _enter_on(c, on_since)
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
            c.act(PollObservedPower(), RunReadyProbe())
            c.decide(Decision.DEFER, R.DEADLINE_EXCEEDED, pending)
        else:
            _block(c, R.DEADLINE_EXCEEDED, R.RETRY_BUDGET_EXHAUSTED, pending)
        return
    _verify_wait(c, t)


def _verify_pending(c: _Ctx, t: Transition) -> ReasonCode:
    p = c.facts.power
    since = t.verify_since
    if p is None or p.power != "On" or (since is not None and p.observed_at < since):
        return R.POWER_STATE_UNKNOWN
    r = c.facts.ready
    if r is not None and not r.passed and (since is None or r.observed_at >= since):
        return R.READY_PROBE_FAILED
    return R.READY_PROBE_PENDING


def _verify_wait(c: _Ctx, t: Transition) -> None:
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
    pending = _poll_missing(c, t.verify_since, due)
    c.decide(Decision.DEFER, pending)


def _handle_off(c: _Ctx) -> None:
    ev = c.event
    power = c.facts.power
    off_since = c.state.off_since
    if (
        isinstance(ev, PowerObserved)
        and power is ev.reading
        and power.power in ("On", "PoweringOn")
        and (off_since is None or power.observed_at >= off_since)
    ):
        _enter_verify(c, Decision.DEFER, R.UNEXPECTED_POWER_CHANGE)
        return
    # a cloud VM the cloud still lists, stopped by itself: destroyed by the 'down' rule
    # (not on the Off reading itself, which may be the one saying it left the list)
    if not isinstance(ev, PowerObserved) and _vm_forced_shutdown(c):
        return
    if isinstance(ev, AdmissionClosed):
        c.set(admission=AdmissionState.CLOSED, admission_since=min(ev.at, c.now))
    evaluation = evaluate_wake(c.facts, c.now, c.policy, c.current())
    c.evaluation = evaluation
    if evaluation.decision is Decision.START and evaluation.action is not None:
        _begin_wake(c, evaluation.action, evaluation)
        return
    _refresh_actions(c, evaluation.refresh, None)
    c.decide(evaluation.decision, *evaluation.reasons)
    c.set(recheck_at=evaluation.recheck_at)


def _open_transition(
    c: _Ctx, kind: TransitionKind, deadline: datetime, request: PowerRequest | None = None
) -> Transition:
    """A new transition of `kind`, Manual when a PowerIntent asks for it; emits OpenTransition."""
    manual = c.facts.intent
    if manual is not None and manual.action != kind.value:  # PowerIntent says Shutdown/Wake
        manual = None
    t = Transition(
        id=transition_id(c.state.node, kind, c.now, c.state.seq),
        kind=kind,
        origin="Policy" if manual is None else "Manual",
        intent=None if manual is None else manual.name,
        started_at=c.now,
        deadline=deadline,
        request=request,
        first_requested_at=None if request is None else c.now,
    )
    c.act(
        OpenTransition(
            transition_id=t.id, kind=kind, origin=t.origin, intent=t.intent, deadline=deadline
        )
    )
    return t


def _begin_wake(c: _Ctx, action: ResetAction, evaluation: Evaluation) -> None:
    t = _open_transition(
        c,
        TransitionKind.WAKE,
        c.now + c.policy.deadline_wake,
        PowerRequest(action=action, attempt=1, requested_at=c.now),
    )
    c.set(state=PowerState.WAKING, transition=t, race=False, blocked_reasons=())
    c.act(RequestPower(transition_id=t.id, action=action, attempt=1))
    c.decide(Decision.START, *evaluation.reasons)


def _handle_on(c: _Ctx) -> None:
    ev = c.event
    if _observed_off(c, None):
        _close_admission(c, None)
        _enter_off(c, R.UNEXPECTED_POWER_CHANGE)
        return
    p, r = c.facts.power, c.facts.ready
    if p is None or p.power != "On":
        _enter_verify(c, Decision.DEFER, R.UNEXPECTED_POWER_CHANGE)
        return
    if r is None or not r.passed:
        _enter_verify(c, Decision.DEFER, R.READY_PROBE_FAILED)
        return
    if isinstance(ev, AdmissionClosed) and c.get("admission") is AdmissionState.CLOSING:
        c.set(admission=AdmissionState.CLOSED, admission_since=min(ev.at, c.now))
    c.set(state=_on_state(c))
    evaluation = evaluate_shutdown(c.facts, c.now, c.policy, c.current())
    c.evaluation = evaluation
    if evaluation.decision in (Decision.SHUTDOWN, Decision.DRAIN):
        _begin_shutdown(c, evaluation)
        return
    if not _accepts_work(c.facts):
        _close_admission(c, None)
    elif c.get("admission") is not AdmissionState.OPEN:
        if _verified_on_ready(c, None):
            _admit_if_wanted(c, None)
        else:
            c.act(PollObservedPower(), RunReadyProbe())
    _refresh_actions(c, evaluation.refresh, None)
    c.decide(evaluation.decision, *evaluation.reasons)
    c.set(recheck_at=evaluation.recheck_at)


def _closed_since_ever(c: _Ctx) -> None:
    """Admission that was never opened (a held node) is confirmed closed as of now."""
    if c.get("admission") is AdmissionState.CLOSED and c.get("admission_since") is None:
        c.set(admission_since=c.now)


def _begin_shutdown(c: _Ctx, evaluation: Evaluation) -> None:
    t = _open_transition(c, TransitionKind.SHUTDOWN, c.now + c.policy.deadline_drain)
    c.set(state=PowerState.DRAINING, transition=t, race=False)
    _closed_since_ever(c)
    if c.get("admission") is AdmissionState.CLOSED:
        c.act(RereadDemand(transition_id=t.id), RefreshFacts(facts=("work", "inhibitors")))
    else:
        c.act(CloseAdmission(transition_id=t.id))
        c.set(admission=AdmissionState.CLOSING, admission_since=c.now)
    reasons = (
        evaluation.reasons if evaluation.decision is Decision.DRAIN else (R.DEMAND_NOT_REREAD,)
    )
    c.decide(Decision.DRAIN, *reasons)


def _handle_draining(c: _Ctx) -> None:
    t = c.transition
    assert t is not None
    ev = c.event
    if isinstance(ev, AdmissionClosed) and c.get("admission") is not AdmissionState.CLOSED:
        at = min(max(ev.at, t.started_at), c.now)
        c.set(admission=AdmissionState.CLOSED, admission_since=at)
    if _observed_off(c, t.started_at):
        _close_transition(c, t, "Aborted", R.UNEXPECTED_POWER_CHANGE)
        c.set(last_transition_at=c.now)
        _enter_off(c, R.UNEXPECTED_POWER_CHANGE)
        return
    evaluation = evaluate_shutdown(c.facts, c.now, c.policy, c.current())
    c.evaluation = evaluation
    if c.now >= t.deadline and evaluation.decision is not Decision.SHUTDOWN:
        _abort_shutdown(c, Decision.DEFER, R.DEADLINE_EXCEEDED, *evaluation.reasons)
        return
    decision = evaluation.decision
    if decision is Decision.SHUTDOWN and evaluation.action is not None:
        _request_shutdown(
            c, t, evaluation.action, 1, evaluation.reasons, evaluation.overrides_applied
        )
        return
    if decision in (Decision.NONE, Decision.BLOCK):
        _abort_shutdown(c, decision, *evaluation.reasons)
        return
    if c.get("admission") is AdmissionState.CLOSED or isinstance(ev, (Evaluate, DeadlineReached)):
        _refresh_actions(c, evaluation.refresh, t.id)
    c.decide(decision, *evaluation.reasons)
    c.set(recheck_at=evaluation.recheck_at)


def _request_shutdown(
    c: _Ctx,
    t: Transition,
    action: ResetAction,
    attempt: int,
    reasons: tuple[ReasonCode, ...],
    overrides: tuple[str, ...],
    *,
    force_off: bool = False,
) -> None:
    prior = t.possibly_applied
    request = PowerRequest(action=action, attempt=attempt, requested_at=c.now)
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
        RequestPower(
            transition_id=t.id,
            action=action,
            attempt=attempt,
            override_intent=intent.name if action == "ForceOff" and intent is not None else None,
        )
    )
    c.overrides = overrides
    c.decide(Decision.SHUTDOWN, *reasons)


def _matching_outcome(t: Transition | None, ev: Event) -> bool:
    if not isinstance(ev, _REQUEST_EVENTS):
        return True
    if t is None or t.request is None:
        return False
    req = t.request
    return (
        ev.transition_id == t.id
        and ev.attempt == req.attempt
        and ev.action == req.action
        and req.status is RequestStatus.IN_FLIGHT
    )


def _record_outcome(c: _Ctx, t: Transition) -> Transition:
    ev = c.event
    assert isinstance(ev, _REQUEST_EVENTS) and t.request is not None
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


def _demand_present(c: _Ctx) -> bool:
    d = c.facts.demand
    return d is not None and d.queued > 0


def _handle_shutting_down(c: _Ctx) -> None:
    t = c.transition
    assert t is not None
    ev = c.event
    if isinstance(ev, _REQUEST_EVENTS):
        t = _record_outcome(c, t)
    if _observed_off(c, t.first_requested_at):
        _close_transition(c, t, "Succeeded", R.POWER_OFF_CONFIRMED)
        c.set(last_transition_at=c.now)
        race = (R.RACE_DEMAND_ARRIVED,) if c.get("race") else ()
        _enter_off(c, *race)
        return
    if isinstance(ev, AdmissionClosed):
        c.set(admission=AdmissionState.CLOSED, admission_since=min(ev.at, c.now))
    if _demand_present(c):
        if not t.possibly_applied:
            _abort_shutdown(c, Decision.NONE, R.DEMAND_PRESENT)
            return
        c.set(race=True)
    race_codes = (R.RACE_DEMAND_ARRIVED,) if c.get("race") else ()
    if isinstance(ev, RequestRejected):
        _retry_or_give_up(c, t, R.REQUEST_REJECTED, race_codes)
        return
    if isinstance(ev, RequestErrored):
        c.act(PollObservedPower())
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
        c.act(PollObservedPower())
    c.decide(Decision.DEFER, *race_codes, R.CONFIRMATION_PENDING)


def _resend_shutdown(
    c: _Ctx, t: Transition, lead: tuple[ReasonCode, ...], race_codes: tuple[ReasonCode, ...]
) -> None:
    """Re-evaluate every gate and, only if all pass, send the next attempt."""
    evaluation = evaluate_shutdown(c.facts, c.now, c.policy, c.current())
    c.evaluation = evaluation
    attempt = (t.request.attempt if t.request is not None else 0) + 1
    if evaluation.decision is Decision.SHUTDOWN and evaluation.action is not None:
        # A ForceOff escalation is re-sent only while its override is still permitted.
        force = t.force_off and force_off_permitted(c.facts, c.policy)
        if force:
            _request_shutdown(
                c,
                t,
                "ForceOff",
                attempt,
                (*lead, *evaluation.reasons, R.OVERRIDE_APPLIED),
                (*evaluation.overrides_applied, "forceOff"),
                force_off=True,
            )
        else:
            _request_shutdown(
                c,
                t,
                evaluation.action,
                attempt,
                (*lead, *evaluation.reasons),
                evaluation.overrides_applied,
            )
        return
    if evaluation.decision in (Decision.NONE, Decision.BLOCK) and not t.possibly_applied:
        _abort_shutdown(c, evaluation.decision, *lead, *evaluation.reasons)
        return
    if evaluation.decision in (Decision.NONE, Decision.BLOCK):
        # A request may have taken effect: never send another while a gate fails, and
        # never pretend it did not happen. Wait for observed Off until the deadline.
        c.set(transition=t.model_copy(update={"next_attempt_at": None}))
        c.decide(Decision.DEFER, *race_codes, *lead, R.CONFIRMATION_PENDING, *evaluation.reasons)
        c.act(PollObservedPower())
        return
    # Evidence is stale or missing: ask for it, and try the re-send again shortly after
    # (not only at the next deadline, when the same evidence may be stale again).
    _refresh_actions(c, evaluation.refresh, t.id)
    retry_at = c.now + min(c.policy.initial_backoff, _RESEND_RECHECK)
    c.set(transition=t.model_copy(update={"next_attempt_at": retry_at}))
    c.decide(Decision.DEFER, *race_codes, *lead, *evaluation.reasons)
    c.set(recheck_at=evaluation.recheck_at)


_RESEND_RECHECK = timedelta(seconds=5)
"""How soon a re-send held back only by stale evidence is tried again."""


def _retry_or_give_up(
    c: _Ctx, t: Transition, code: ReasonCode, race_codes: tuple[ReasonCode, ...]
) -> None:
    if t.retries_used < c.policy.retry_budget:
        _schedule_retry(c, t, c.policy.deadline_shutdown)
        c.decide(Decision.DEFER, *race_codes, code, R.BACKOFF)
        return
    _exhausted(c, t, code, race_codes)


def _schedule_retry(c: _Ctx, t: Transition, step_deadline: timedelta) -> None:
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


def _exhausted(
    c: _Ctx, t: Transition, code: ReasonCode, race_codes: tuple[ReasonCode, ...]
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
            _request_shutdown(
                c,
                escalated,
                "ForceOff",
                attempt,
                (code, R.RETRY_BUDGET_EXHAUSTED, R.OVERRIDE_APPLIED, *evaluation.reasons),
                (*evaluation.overrides_applied, "forceOff"),
                force_off=True,
            )
            return
    _block(c, *race_codes, code, R.RETRY_BUDGET_EXHAUSTED)


def _shutdown_deadline(c: _Ctx, t: Transition, race_codes: tuple[ReasonCode, ...]) -> None:
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
        c.act(PollObservedPower())
        _resend_shutdown(c, nt, (R.DEADLINE_EXCEEDED,), race_codes)
        return
    _exhausted(c, t, R.DEADLINE_EXCEEDED, race_codes)


def _handle_waking(c: _Ctx) -> None:
    t = c.transition
    assert t is not None
    ev = c.event
    if isinstance(ev, _REQUEST_EVENTS):
        t = _record_outcome(c, t)
        if isinstance(ev, (RequestRejected, RequestErrored)):
            if isinstance(ev, RequestErrored):
                c.act(PollObservedPower())
            code = R.REQUEST_REJECTED if isinstance(ev, RequestRejected) else R.REQUEST_ERRORED
            if t.retries_used < c.policy.retry_budget:
                _schedule_retry(c, t, c.policy.deadline_wake)
                c.decide(Decision.DEFER, code, R.BACKOFF)
            else:
                _block(c, code, R.RETRY_BUDGET_EXHAUSTED)
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
        if not _verified_on_ready(c, seen):
            c.act(RunReadyProbe())
            c.decide(Decision.DEFER, R.POWER_ON_CONFIRMED, R.READY_PROBE_PENDING)
            return
    if seen is not None:
        if p is not None and p.power == "Off" and p.observed_at > seen:
            t = t.model_copy(update={"power_on_seen_at": None})
            c.set(transition=t)
            seen = None
        elif _verified_on_ready(c, seen):
            _close_transition(c, t, "Succeeded", R.READY_CONFIRMED)
            c.set(last_transition_at=c.now)
            _enter_on(c, seen, R.POWER_ON_CONFIRMED)
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
        pending = _poll_missing(c, seen, due)
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
        c.act(PollObservedPower())
    c.decide(Decision.DEFER, R.CONFIRMATION_PENDING)


def _resend_wake(c: _Ctx, t: Transition, lead: tuple[ReasonCode, ...]) -> None:
    """Re-send the wake request unless the policy or capability now forbids it."""
    evaluation = evaluate_wake(c.facts, c.now, c.policy, c.current())
    c.evaluation = evaluation
    if evaluation.decision is Decision.BLOCK or evaluation.action is None:
        _block(c, *lead, *evaluation.reasons)
        return
    attempt = (t.request.attempt if t.request is not None else 0) + 1
    request = PowerRequest(action=evaluation.action, attempt=attempt, requested_at=c.now)
    nt = t.model_copy(
        update={
            "request": request,
            "next_attempt_at": None,
            "deadline": c.now + c.policy.deadline_wake,
        }
    )
    c.set(transition=nt)
    c.act(RequestPower(transition_id=t.id, action=evaluation.action, attempt=attempt))
    c.decide(Decision.DEFER, *lead, R.CONFIRMATION_PENDING)


def _wake_deadline(c: _Ctx, t: Transition) -> None:
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
            c.act(RunReadyProbe())
            c.decide(Decision.DEFER, R.DEADLINE_EXCEEDED, pending)
        else:
            _block(c, R.DEADLINE_EXCEEDED, R.RETRY_BUDGET_EXHAUSTED, pending)
        return
    if t.retries_used < c.policy.retry_budget:
        nt = t.model_copy(update={"retries_used": t.retries_used + 1})
        c.set(transition=nt)
        c.act(PollObservedPower())
        _resend_wake(c, nt, (R.DEADLINE_EXCEEDED,))
    else:
        _block(c, R.DEADLINE_EXCEEDED, R.RETRY_BUDGET_EXHAUSTED, R.CONFIRMATION_PENDING)


def _handle_blocked(c: _Ctx) -> None:
    ev = c.event
    if _observed_off(c, None) and c.state.blocked_transition is not TransitionKind.WAKE:
        # a shutdown confirmed late is recorded; a wake that failed stays BLOCKED while
        # the node stays Off (waking it again needs a person or a policy change)
        _enter_off(c)
        return
    if _vm_forced_shutdown(c):
        return
    if isinstance(ev, (ManualOverride, PolicyChanged)):
        _enter_verify(c, Decision.DEFER)
        return
    if R.CREDENTIALS_REFUSED in c.state.blocked_reasons and not _refused(c):
        _enter_verify(c, Decision.DEFER)  # an administrator fixed the credentials
        return
    if isinstance(ev, AdmissionClosed):
        c.set(admission=AdmissionState.CLOSED, admission_since=min(ev.at, c.now))
    c.decide(Decision.BLOCK, *c.state.blocked_reasons)


_HANDLERS = {
    PowerState.UNKNOWN: _handle_unknown,
    PowerState.OFF: _handle_off,
    PowerState.ON_IDLE: _handle_on,
    PowerState.ACTIVE: _handle_on,
    PowerState.DRAINING: _handle_draining,
    PowerState.SHUTTING_DOWN: _handle_shutting_down,
    PowerState.WAKING: _handle_waking,
    PowerState.BLOCKED: _handle_blocked,
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
    stale = not _matching_outcome(state.transition, event)
    effective: Event = Evaluate() if stale else event
    c = _Ctx(state=state, facts=merged, event=effective, now=now, policy=policy)
    c.set(recheck_at=None)
    _HANDLERS[state.state](c)
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
        and not any(isinstance(a, _RECORD_ALWAYS) for a in actions)
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
            actions=tuple(describe(a) for a in actions),
            overrides_applied=c.overrides,
        )
    return Step(
        next=nxt,
        actions=actions,
        decision=c.decision,
        reasons=reasons,
        evaluation=c.evaluation,
        facts=merged,
        record=record,
        overrides_applied=c.overrides,
        record_reused=reused,
    )


_RECORD_ALWAYS = (OpenTransition, CloseTransition, RequestPower)
"""Actions whose step always gets a full record."""


def _finish(c: _Ctx) -> NodePowerState:
    new_state: PowerState = c.get("state")
    if new_state is not c.state.state:
        c.set(state_since=c.now)
    t = c.transition
    recheck: datetime | None = c.get("recheck_at")
    if new_state in NON_TERMINAL_STATES and t is not None:
        wake_at = t.deadline if recheck is None else min(recheck, t.deadline)
        if t.next_attempt_at is not None:
            wake_at = min(wake_at, t.next_attempt_at)
        recheck = wake_at
    unique: list[Action] = []
    for a in c.actions:
        if a not in unique:
            unique.append(a)
    c.actions = unique
    if recheck is not None and not any(isinstance(a, ScheduleRecheck) for a in c.actions):
        c.act(ScheduleRecheck(at=max(recheck, c.now), reason=c.decision.value))
    c.set(
        recheck_at=recheck,
        seq=c.state.seq + 1,
        last_decision=c.decision,
        last_reasons=tuple(c.reasons),
    )
    # Fully validated: the model's invariants (deadlines, admission) are checked here.
    return NodePowerState(**{**c.state.__dict__, **c.upd})


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


__all__ = ["Step", "replay", "step", "transition_id"]
