"""Events fed to the power state machine, and how observations in them update the facts.

The shell turns everything that happens into one of these and calls
`machine.step(state, facts, event, now, policy)`:

    Evaluate            re-evaluate the gates (periodic timer, recheck time, facts changed)
    DeadlineReached     a deadline or recheck time the machine scheduled has come
    AdmissionClosed     the dispatcher confirmed it binds no more work to the node
    DemandReread        the queue was re-read (answer to RereadDemand); carries the reading
    NewDemand           demand for the node appeared or changed; carries the reading
    RequestAccepted     the controller accepted a power request (proves acceptance only)
    RequestRejected     the controller refused it (it was not applied)
    RequestErrored      no clear answer (timeout, 5xx): it may or may not have been applied
    PowerObserved       a trusted source reported the node's power; carries the reading
    ReadyProbeResult    the ready probe ran; carries the reading
    PolicyChanged       the PowerPolicy changed (the new view is the `policy` argument)
    ManualOverride      a manual PowerIntent appeared, changed or was withdrawn (None)

Events that carry a reading are merged into `NodeFacts` by `apply_event` (a reading
older than the one already held is ignored), so decisions always read one snapshot.
Request outcomes name the transition id and attempt they answer; outcomes for any other
transition or attempt are ignored (and recorded as STALE_EVENT_IGNORED).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AwareDatetime, Field, TypeAdapter

from nodewarden.api.powerpolicy import ResetAction
from nodewarden.policy.base import CoreModel, replaced
from nodewarden.policy.facts import (
    DemandReading,
    ManualIntent,
    NodeFacts,
    PowerReading,
    Reading,
    ReadyReading,
)


class Evaluate(CoreModel):
    """Re-evaluate the gates with the current facts ("gates evaluated")."""

    type: Literal["Evaluate"] = "Evaluate"


class DeadlineReached(CoreModel):
    """A scheduled deadline or recheck time has come."""

    type: Literal["DeadlineReached"] = "DeadlineReached"
    transition_id: str | None = None


class AdmissionClosed(CoreModel):
    """The dispatcher confirmed admission is closed (no new work will be bound)."""

    type: Literal["AdmissionClosed"] = "AdmissionClosed"
    at: AwareDatetime
    source: str = Field(default="dispatcher", min_length=1)


class DemandReread(CoreModel):
    """The queue was re-read for this node (answer to the RereadDemand action)."""

    type: Literal["DemandReread"] = "DemandReread"
    reading: DemandReading


class NewDemand(CoreModel):
    """Demand for this node appeared or changed (queue watch)."""

    type: Literal["NewDemand"] = "NewDemand"
    reading: DemandReading


class _RequestOutcome(CoreModel):
    transition_id: str = Field(min_length=1)
    attempt: int = Field(ge=1)
    action: ResetAction
    at: AwareDatetime
    source: str = Field(min_length=1, description="Which controller answered.")
    detail: str = Field(default="", max_length=1024)


class RequestAccepted(_RequestOutcome):
    """The controller accepted the request. Proves acceptance, not the power state."""

    type: Literal["RequestAccepted"] = "RequestAccepted"


class RequestRejected(_RequestOutcome):
    """The controller refused the request; it was not applied."""

    type: Literal["RequestRejected"] = "RequestRejected"


class RequestErrored(_RequestOutcome):
    """The request failed without a clear answer; it may have been applied."""

    type: Literal["RequestErrored"] = "RequestErrored"


class PowerObserved(CoreModel):
    """A trusted source reported the node's power state."""

    type: Literal["PowerObserved"] = "PowerObserved"
    reading: PowerReading


class ReadyProbeResult(CoreModel):
    """The ready probe ran."""

    type: Literal["ReadyProbeResult"] = "ReadyProbeResult"
    reading: ReadyReading


class PolicyChanged(CoreModel):
    """The PowerPolicy governing the node changed."""

    type: Literal["PolicyChanged"] = "PolicyChanged"


class ManualOverride(CoreModel):
    """A manual PowerIntent for the node appeared or changed; None = withdrawn/finished."""

    type: Literal["ManualOverride"] = "ManualOverride"
    intent: ManualIntent | None = None


Event = Annotated[
    Evaluate
    | DeadlineReached
    | AdmissionClosed
    | DemandReread
    | NewDemand
    | RequestAccepted
    | RequestRejected
    | RequestErrored
    | PowerObserved
    | ReadyProbeResult
    | PolicyChanged
    | ManualOverride,
    Field(discriminator="type"),
]
RequestOutcome = RequestAccepted | RequestRejected | RequestErrored

EVENT_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)


def _newer(current: Reading | None, incoming: Reading) -> bool:
    return current is None or incoming.observed_at >= current.observed_at


def apply_event(facts: NodeFacts, event: Event) -> NodeFacts:
    """The facts with the observation carried by `event` merged in (newest reading wins)."""
    if type(event) is Evaluate:  # the most frequent event, without a reading: no checks
        return facts
    if isinstance(event, (DemandReread, NewDemand)):
        if _newer(facts.demand, event.reading):
            return replaced(facts, {"demand": event.reading})
    elif isinstance(event, PowerObserved):
        if _newer(facts.power, event.reading):
            return replaced(facts, {"power": event.reading})
    elif isinstance(event, ReadyProbeResult):
        if _newer(facts.ready, event.reading):
            return replaced(facts, {"ready": event.reading})
    elif isinstance(event, ManualOverride):
        return replaced(facts, {"intent": event.intent})
    return facts
