"""Actions: the small typed instructions a step returns for the shell to carry out.

The core never performs I/O; it returns these in order and the shell executes them,
feeding the outcomes back as events (`nodewarden.policy.events`):

    OpenTransition         create/update the PowerIntent for a new transition
    CloseTransition        mark the transition's PowerIntent Succeeded / Aborted / Blocked
    CloseAdmission         stop binding work to the node; answer with AdmissionClosed
    OpenAdmission          allow binding work (only after observed On + passing ready probe)
    RereadDemand           re-read the queue for this node now (not from a cache);
                           answer with DemandReread
    RequestPower           send the power request; answer with RequestAccepted /
                           RequestRejected / RequestErrored for the same transition+attempt
    CancelPendingShutdown  withdraw a shutdown that is not yet irreversible (cancel a
                           scheduled `shutdown`, drop queued retries)
    PollObservedPower      read the trusted power state; answer with PowerObserved
    RunReadyProbe          run the ready probe; answer with ReadyProbeResult
    RefreshFacts           refresh the named readings (stale or missing evidence)
    ScheduleRecheck        send Evaluate / DeadlineReached at `at`
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import AwareDatetime, Field

from nodewarden.api.powerpolicy import ResetAction
from nodewarden.policy.base import CoreModel, trusted
from nodewarden.policy.facts import FactName
from nodewarden.policy.reasons import ReasonCode
from nodewarden.policy.state import TransitionKind

TransitionOutcome = Literal["Succeeded", "Aborted", "Blocked"]


class OpenTransition(CoreModel):
    type: Literal["OpenTransition"] = "OpenTransition"
    transition_id: str
    kind: TransitionKind
    origin: Literal["Policy", "Manual"]
    intent: str | None = None
    deadline: AwareDatetime


class CloseTransition(CoreModel):
    type: Literal["CloseTransition"] = "CloseTransition"
    transition_id: str
    kind: TransitionKind
    outcome: TransitionOutcome
    reasons: tuple[ReasonCode, ...] = ()


class CloseAdmission(CoreModel):
    type: Literal["CloseAdmission"] = "CloseAdmission"
    transition_id: str | None = None


class OpenAdmission(CoreModel):
    type: Literal["OpenAdmission"] = "OpenAdmission"
    transition_id: str | None = None


class RereadDemand(CoreModel):
    type: Literal["RereadDemand"] = "RereadDemand"
    transition_id: str | None = None


class RequestPower(CoreModel):
    type: Literal["RequestPower"] = "RequestPower"
    transition_id: str
    action: ResetAction
    attempt: int = Field(ge=1)
    override_intent: str | None = Field(
        default=None, description="The manual intent whose override permits this (ForceOff)."
    )


class CancelPendingShutdown(CoreModel):
    type: Literal["CancelPendingShutdown"] = "CancelPendingShutdown"
    transition_id: str


class PollObservedPower(CoreModel):
    type: Literal["PollObservedPower"] = "PollObservedPower"


class RunReadyProbe(CoreModel):
    type: Literal["RunReadyProbe"] = "RunReadyProbe"


class RefreshFacts(CoreModel):
    type: Literal["RefreshFacts"] = "RefreshFacts"
    facts: tuple[FactName, ...]


class ScheduleRecheck(CoreModel):
    type: Literal["ScheduleRecheck"] = "ScheduleRecheck"
    at: AwareDatetime
    reason: str = ""


Action = Annotated[
    OpenTransition
    | CloseTransition
    | CloseAdmission
    | OpenAdmission
    | RereadDemand
    | RequestPower
    | CancelPendingShutdown
    | PollObservedPower
    | RunReadyProbe
    | RefreshFacts
    | ScheduleRecheck,
    Field(discriminator="type"),
]


# -- built without validation ------------------------------------------------------------
# The actions a step emits most often (a recheck, a refresh of stale readings), built from
# the machine's own values (the clock, fact names, transition ids) with `trusted`: a
# validated construction costs ~4x more, and a round emits one or two per stepped node.

POLL_OBSERVED_POWER = PollObservedPower()
RUN_READY_PROBE = RunReadyProbe()
"""The actions without fields, shared (frozen models: equal to any other instance)."""


def schedule_recheck(at: datetime, reason: str) -> ScheduleRecheck:
    """`ScheduleRecheck(at=at, reason=reason)`; `at` is timezone-aware (from the clock)."""
    return trusted(ScheduleRecheck, {"type": "ScheduleRecheck", "at": at, "reason": reason})


def reread_demand(transition_id: str | None) -> RereadDemand:
    """`RereadDemand(transition_id=transition_id)`."""
    return trusted(RereadDemand, {"type": "RereadDemand", "transition_id": transition_id})


def refresh_facts(facts: tuple[FactName, ...]) -> RefreshFacts:
    """`RefreshFacts(facts=facts)`."""
    return trusted(RefreshFacts, {"type": "RefreshFacts", "facts": facts})


def open_transition_action(
    transition_id: str,
    kind: TransitionKind,
    origin: Literal["Policy", "Manual"],
    intent: str | None,
    deadline: datetime,
) -> OpenTransition:
    """`OpenTransition(...)` of a transition the machine has just built."""
    return trusted(
        OpenTransition,
        {
            "type": "OpenTransition",
            "transition_id": transition_id,
            "kind": kind,
            "origin": origin,
            "intent": intent,
            "deadline": deadline,
        },
    )


def request_power(
    transition_id: str, action: ResetAction, attempt: int, override_intent: str | None = None
) -> RequestPower:
    """`RequestPower(...)`; `attempt` counts from 1 (the transition's request's)."""
    return trusted(
        RequestPower,
        {
            "type": "RequestPower",
            "transition_id": transition_id,
            "action": action,
            "attempt": attempt,
            "override_intent": override_intent,
        },
    )


ACTION_TYPES: tuple[type[CoreModel], ...] = (
    OpenTransition,
    CloseTransition,
    CloseAdmission,
    OpenAdmission,
    RereadDemand,
    RequestPower,
    CancelPendingShutdown,
    PollObservedPower,
    RunReadyProbe,
    RefreshFacts,
    ScheduleRecheck,
)
"""Every action model. None has a subclass (tests check), so the step tells them apart
by exact type (`type(a) is X`): a failing `isinstance` against a pydantic model goes
through `ABCMeta` and costs ~10x as much, several times a step."""


def describe(action: Action) -> str:
    """One short human-readable line for an action (records, explain output)."""
    kind = type(action)
    if kind is ScheduleRecheck:  # the most frequent first
        assert isinstance(action, ScheduleRecheck)
        return f"ScheduleRecheck({action.at.isoformat()})"
    if kind is RequestPower:
        assert isinstance(action, RequestPower)
        return f"RequestPower({action.action}, attempt {action.attempt})"
    if kind is RefreshFacts:
        assert isinstance(action, RefreshFacts)
        return f"RefreshFacts({','.join(action.facts)})"
    if kind is CloseTransition:
        assert isinstance(action, CloseTransition)
        return f"CloseTransition({action.kind}, {action.outcome})"
    if kind is OpenTransition:
        assert isinstance(action, OpenTransition)
        return f"OpenTransition({action.kind})"
    return action.type
