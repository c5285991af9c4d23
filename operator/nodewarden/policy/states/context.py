"""The scratch space of one state-machine step (`StepContext`) and the readings it
checks (fresh, observed Off, verified On + ready), the transition ids and the refresh
actions. Used by every state handler (`nodewarden.policy.states`).
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass, field
from datetime import UTC, datetime, tzinfo
from typing import Any

from nodewarden.policy.actions import (
    POLL_OBSERVED_POWER,
    RUN_READY_PROBE,
    Action,
    refresh_facts,
    reread_demand,
)
from nodewarden.policy.base import trusted
from nodewarden.policy.evaluation import Evaluation
from nodewarden.policy.events import (
    Event,
    PowerObserved,
)
from nodewarden.policy.facts import FactName, NodeFacts
from nodewarden.policy.reasons import Decision, R, ReasonCode
from nodewarden.policy.state import (
    NodePowerState,
    PowerState,
    Transition,
    TransitionKind,
)
from nodewarden.policy.view import PolicyView


@dataclass(slots=True)
class StepContext:
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
        upd = self.upd
        if upd:
            held = self.state.__dict__
            for name, value in upd.items():
                if held[name] is not value:
                    return trusted(NodePowerState, {**held, **upd})
        return self.state  # nothing changed yet (e.g. the state set to the one it is in)

    def set(self, **values: Any) -> None:
        self.upd.update(values)

    def decide(self, decision: Decision, *reasons: ReasonCode) -> None:
        self.decision = decision
        self.reasons = dedupe(reasons)

    def act(self, *actions: Action) -> None:
        self.actions.extend(actions)


def dedupe(codes: Any) -> list[ReasonCode]:
    out: list[ReasonCode] = []
    for c in codes:
        if c not in out:
            out.append(c)
    return out


def transition_id(node: str, kind: TransitionKind, now: datetime, seq: int) -> str:
    """Deterministic, DNS-label-safe transition id: kind-date-time-hash."""
    iso, stamp = _time_parts(now, now.tzinfo, now.fold)
    digest = hashlib.sha256(f"{node}|{kind.value}|{iso}|{seq}".encode()).hexdigest()
    return f"{kind.value.lower()}-{stamp}-{digest[:8]}"


@functools.lru_cache(maxsize=16)
def _time_parts(now: datetime, tz: tzinfo | None, fold: int) -> tuple[str, str]:
    """`now.isoformat()` and its UTC date-time stamp, memoised: the transitions a round
    opens share its clock reading, and strftime costs about as much as the hash. Keyed by
    the zone and fold too: equal instants written in other zones have other isoformats."""
    return now.isoformat(), f"{now.astimezone(UTC):%Y%m%d-%H%M%S}"


def fresh(c: StepContext, at: datetime) -> bool:
    return c.now - at <= c.policy.telemetry_max_age


def accepts_work(facts: NodeFacts) -> bool:
    """Whether the node should take new work once verified (desired, not observed)."""
    intent = facts.intent
    if intent is not None and intent.action in ("Shutdown", "Drain"):
        return False
    if facts.consolidation is not None:
        return False
    desired = facts.desired
    if desired is None:
        return True
    return desired.power != "Off" and desired.idle_behavior == "run"


def observed_off(c: StepContext, since: datetime | None) -> bool:
    """The event is a PowerObserved Off reading, now the node's latest power reading."""
    ev = c.event
    # by exact type (no event model has a subclass): a failing isinstance costs ~10x
    if type(ev) is not PowerObserved or ev.reading.power != "Off":
        return False
    if c.facts.power is not ev.reading:
        return False
    return since is None or ev.reading.observed_at >= since


def verified_on_ready(c: StepContext, since: datetime | None) -> bool:
    """Observed On and a passing ready probe, both fresh and observed at/after `since`."""
    p, r = c.facts.power, c.facts.ready
    if p is None or r is None or p.power != "On" or not r.passed:
        return False
    if not (fresh(c, p.observed_at) and fresh(c, r.observed_at)):
        return False
    return since is None or (p.observed_at >= since and r.observed_at >= since)


def poll_missing(c: StepContext, since: datetime | None, probe_due: bool) -> ReasonCode:
    """Ask for whichever of power / readiness is not yet fresh evidence after `since`;
    returns the reason code of what is still pending."""
    p, r = c.facts.power, c.facts.ready
    power_ok = (
        p is not None
        and p.power == "On"
        and fresh(c, p.observed_at)
        and (since is None or p.observed_at >= since)
    )
    ready_ok = (
        r is not None
        and r.passed
        and fresh(c, r.observed_at)
        and (since is None or r.observed_at >= since)
    )
    if not power_ok:
        c.act(POLL_OBSERVED_POWER)
    if not ready_ok and probe_due:
        c.act(RUN_READY_PROBE)
    if not power_ok:
        return R.POWER_STATE_UNKNOWN if p is None or p.power != "On" else R.TELEMETRY_STALE
    if r is not None and not r.passed and (since is None or r.observed_at >= since):
        return R.READY_PROBE_FAILED
    return R.READY_PROBE_PENDING if not ready_ok else R.CONFIRMATION_PENDING


def on_state(c: StepContext) -> PowerState:
    work = c.facts.work
    return PowerState.ACTIVE if work is not None and work.active_jobs > 0 else PowerState.ON_IDLE


def refresh_actions(c: StepContext, names: tuple[FactName, ...], tid: str | None) -> None:
    rest: list[FactName] = []
    for name in names:
        if name == "demand":
            c.act(reread_demand(tid))
        elif name == "power":
            c.act(POLL_OBSERVED_POWER)
        elif name == "ready":
            c.act(RUN_READY_PROBE)
        elif name not in rest:
            rest.append(name)
    if rest:
        c.act(refresh_facts(tuple(rest)))
