"""NodePowerState: the persisted state of one node's power state machine.

A frozen pydantic model the shell stores as JSON (camelCase) in the WorkerNode status
(`NodePowerState.model_dump(mode="json", by_alias=True)`) and reloads with
`NodePowerState.model_validate(...)`. It holds only what the machine itself decided or
confirmed: the state, admission, the transition in progress (id, kind, deadline,
request, retries, back-off) and the times cooldown / min-on / min-off are measured from.
Observations live in `NodeFacts`, never here.

States: OFF, WAKING, ON_IDLE, ACTIVE, DRAINING, SHUTTING_DOWN and the guard states
UNKNOWN (power/readiness being verified) and BLOCKED (needs a person).
WAKING, DRAINING, SHUTTING_DOWN and UNKNOWN are non-terminal: they always carry a
transition with a deadline (a validator enforces it; the one exception is the initial
UNKNOWN state before the first step, `NodePowerState.initial(node)`).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Literal

from pydantic import AwareDatetime, Field, model_validator

from nodewarden.api.powerpolicy import ResetAction
from nodewarden.api.workernode import Admission, NodeState
from nodewarden.policy.base import CoreModel, trusted
from nodewarden.policy.reasons import Decision, ReasonCode


class PowerState(StrEnum):
    OFF = "OFF"
    WAKING = "WAKING"
    ON_IDLE = "ON_IDLE"
    ACTIVE = "ACTIVE"
    DRAINING = "DRAINING"
    SHUTTING_DOWN = "SHUTTING_DOWN"
    UNKNOWN = "UNKNOWN"
    BLOCKED = "BLOCKED"


NON_TERMINAL_STATES: frozenset[PowerState] = frozenset(
    {PowerState.WAKING, PowerState.DRAINING, PowerState.SHUTTING_DOWN, PowerState.UNKNOWN}
)
ON_STATES: frozenset[PowerState] = frozenset({PowerState.ON_IDLE, PowerState.ACTIVE})


class AdmissionState(StrEnum):
    """Whether the dispatcher may bind new work to the node.

    CLOSING: the machine asked the shell to close admission and waits for its
    confirmation (AdmissionClosed). Only OPEN lets work be bound.
    """

    OPEN = "Open"
    CLOSING = "Closing"
    CLOSED = "Closed"


class TransitionKind(StrEnum):
    SHUTDOWN = "Shutdown"
    WAKE = "Wake"
    VERIFY = "Verify"
    """Re-establish observed power and readiness before admission may (re)open."""


class RequestStatus(StrEnum):
    IN_FLIGHT = "InFlight"
    ACCEPTED = "Accepted"
    REJECTED = "Rejected"
    ERRORED = "Errored"


class PowerRequest(CoreModel):
    """The latest power request of a transition and what became of it (request evidence)."""

    action: ResetAction
    attempt: int = Field(ge=1)
    requested_at: AwareDatetime
    status: RequestStatus = RequestStatus.IN_FLIGHT
    result_at: AwareDatetime | None = None
    source: str | None = Field(default=None, description="Who reported the result.")
    detail: str = Field(default="", max_length=1024)


class Transition(CoreModel):
    """A power transition in progress."""

    id: str = Field(min_length=1, max_length=253)
    kind: TransitionKind
    origin: Literal["Policy", "Manual"] = "Policy"
    intent: str | None = Field(default=None, description="Manual PowerIntent name, if any.")
    started_at: AwareDatetime
    deadline: AwareDatetime
    request: PowerRequest | None = None
    first_requested_at: AwareDatetime | None = Field(
        default=None, description="When the first power request of this transition was made."
    )
    prior_possibly_applied: bool = Field(
        default=False,
        description="An earlier request of this transition may have taken effect.",
    )
    retries_used: int = Field(default=0, ge=0)
    next_attempt_at: AwareDatetime | None = None
    verify_since: AwareDatetime | None = Field(
        default=None, description="Evidence must be observed at or after this time."
    )
    power_on_seen_at: AwareDatetime | None = None
    probe_failures: int = Field(default=0, ge=0)
    force_off: bool = False

    @property
    def possibly_applied(self) -> bool:
        """A request was sent whose effect is possible (in flight, accepted or errored):
        from then on a shutdown is irreversible and is never reported as cancelled."""
        if self.prior_possibly_applied:
            return True
        return self.request is not None and self.request.status is not RequestStatus.REJECTED


class NodePowerState(CoreModel):
    """The machine's persisted state for one node."""

    node: str = Field(min_length=1, max_length=253)
    state: PowerState = PowerState.UNKNOWN
    state_since: AwareDatetime | None = None
    admission: AdmissionState = AdmissionState.CLOSED
    admission_since: AwareDatetime | None = None
    transition: Transition | None = None
    blocked_reasons: tuple[ReasonCode, ...] = ()
    blocked_transition: TransitionKind | None = Field(
        default=None, description="The kind of transition that ended BLOCKED, if any."
    )
    last_transition_at: AwareDatetime | None = Field(
        default=None, description="When the last power transition finished (cooldown)."
    )
    on_since: AwareDatetime | None = None
    off_since: AwareDatetime | None = None
    race: bool = False
    recheck_at: AwareDatetime | None = None
    last_decision: Decision | None = None
    last_reasons: tuple[ReasonCode, ...] = ()
    seq: int = Field(default=0, ge=0, description="Number of steps taken.")
    consolidation: str | None = Field(
        default=None,
        max_length=253,
        description="The consolidation Drain intent keeping admission closed (set and "
        "cleared by the power controller's `power.consolidating`, never by the machine): "
        "a restart keeps the node closed from this before it has read the intent.",
    )

    @model_validator(mode="after")
    def _non_terminal_has_deadline(self) -> NodePowerState:
        check_invariants(self.state, self.transition, self.seq, self.admission)
        return self

    @classmethod
    def initial(cls, node: str) -> NodePowerState:
        """The state of a node the machine has never seen: UNKNOWN, admission closed."""
        return cls(node=node)

    @property
    def deadline(self) -> datetime | None:
        return self.transition.deadline if self.transition is not None else None


# -- built without validation ------------------------------------------------------------
# What the machine builds when a transition opens or sends a request, from its own ids,
# the clock and the policy's actions: `trusted` (a validated construction costs ~4x; a
# round that opens transitions builds these per node). tests/policy compare them with
# validated ones.


def new_request(action: ResetAction, attempt: int, requested_at: datetime) -> PowerRequest:
    """`PowerRequest(action=..., attempt=..., requested_at=...)`: in flight, no result yet."""
    return trusted(
        PowerRequest,
        {
            "action": action,
            "attempt": attempt,
            "requested_at": requested_at,
            "status": RequestStatus.IN_FLIGHT,
            "result_at": None,
            "source": None,
            "detail": "",
        },
    )


def new_transition(
    *,
    id: str,
    kind: TransitionKind,
    started_at: datetime,
    deadline: datetime,
    origin: Literal["Policy", "Manual"] = "Policy",
    intent: str | None = None,
    request: PowerRequest | None = None,
    first_requested_at: datetime | None = None,
    verify_since: datetime | None = None,
) -> Transition:
    """`Transition(...)` of a transition opened now (no retries, no back-off yet)."""
    return trusted(
        Transition,
        {
            "id": id,
            "kind": kind,
            "origin": origin,
            "intent": intent,
            "started_at": started_at,
            "deadline": deadline,
            "request": request,
            "first_requested_at": first_requested_at,
            "prior_possibly_applied": False,
            "retries_used": 0,
            "next_attempt_at": None,
            "verify_since": verify_since,
            "power_on_seen_at": None,
            "probe_failures": 0,
            "force_off": False,
        },
    )


def check_invariants(
    state: PowerState, transition: Transition | None, seq: int, admission: AdmissionState
) -> None:
    """The invariants of a `NodePowerState` (its validator, and the state machine, which
    builds the next state without re-validating the rest, call this): raises ValueError."""
    if state in NON_TERMINAL_STATES and transition is None and seq > 0:
        raise ValueError(f"state {state} needs a transition with a deadline")
    if admission is AdmissionState.OPEN and state not in ON_STATES:
        raise ValueError(f"admission cannot be Open in state {state}")


FUTURE_FIELDS: frozenset[str] = frozenset({"deadline", "next_attempt_at", "recheck_at"})
"""Times a state names ahead of its writing; every other time in it (since, started,
requested, seen) was in the past of the clock that wrote it."""


def _times(value: Any, name: str = "") -> list[tuple[str, datetime]]:
    if isinstance(value, datetime):
        return [(name, value)]
    if isinstance(value, dict):
        return [t for k, v in value.items() for t in _times(v, k)]
    return []


def _shift(value: Any, by: timedelta) -> Any:
    if isinstance(value, datetime):
        return value - by
    if isinstance(value, dict):
        return {k: _shift(v, by) for k, v in value.items()}
    return value


def rebased(state: NodePowerState, now: datetime) -> tuple[NodePowerState, timedelta]:
    """`state` as read back from status, on this replica's clock: a time it holds that
    should be past (`FUTURE_FIELDS` aside) but lies after `now` was written by a clock
    ahead of ours by at least that much (another replica, before a takeover), so every
    time in it -- deadlines and back-offs too -- moves back by the largest such lead.
    Returns the state and the shift (zero: unchanged). A clock that was behind cannot be
    told from a long wait; its times are kept."""
    dumped = state.model_dump()
    past = [at for name, at in _times(dumped) if name not in FUTURE_FIELDS]
    lead = max((at - now for at in past), default=timedelta(0))
    if lead <= timedelta(0):
        return state, timedelta(0)
    return NodePowerState.model_validate(_shift(dumped, lead)), lead


_API_STATE: dict[PowerState, NodeState] = {
    PowerState.OFF: "Off",
    PowerState.WAKING: "Waking",
    PowerState.ON_IDLE: "Idle",
    PowerState.ACTIVE: "Active",
    PowerState.DRAINING: "Draining",
    PowerState.SHUTTING_DOWN: "ShuttingDown",
    PowerState.UNKNOWN: "Unknown",
    PowerState.BLOCKED: "Blocked",
}


def api_state(state: PowerState) -> NodeState:
    """The WorkerNode status.state value for a machine state."""
    return _API_STATE[state]


def api_admission(admission: AdmissionState, gpu_only: bool = False) -> Admission:
    """The WorkerNode status.admission value: only Open binds work (Closing is Closed);
    Open narrowed to GPU work (`policy.gpuidle`) is GPUOnly."""
    if admission is not AdmissionState.OPEN:
        return "Closed"
    return "GPUOnly" if gpu_only else "Open"
