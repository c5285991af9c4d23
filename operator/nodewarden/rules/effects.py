"""What a step's actions mean for the shell: one typed effect per concept.

`policy.machine.step` returns actions in order; the live power round
(`power/round.py`) and the simulator (`simulate/steps.py`) both carry them out.
`effects(actions, now, decision)` owns what each action means, so the shells keep
only the mechanics (how a probe is asked for, API latency, timers):

    RereadDemand, RefreshFacts("demand")           -> Observe(DEMAND)
    PollObservedPower                              -> Observe(POWER)
    RunReadyProbe                                  -> Observe(READY_PROBE)
    RefreshFacts(work, inhibitors, uptime, ready,
                 identity)                         -> Observe(PROBE)
    RefreshFacts("capability")                     -> Observe(CAPABILITY)
    RefreshFacts("vm")                             -> Observe(VM_LIST)
    ScheduleRecheck(at)                            -> Recheck(at never sooner than
                                                      now + MIN_RECHECK, asked, hold_write)
    a DEFER with no ScheduleRecheck                -> ReEvaluate (the periodic one)
    CloseAdmission / OpenAdmission                 -> StopAdmission / AllowAdmission
    RequestPower                                   -> SendPowerRequest
    OpenTransition / CloseTransition /
    CancelPendingShutdown                          -> TransitionOpened / TransitionClosed /
                                                      ShutdownCancelled

The effects keep the actions' order. Each Observe kind appears once (where it is first
asked for); the rechecks become one `Recheck`, the earliest, where the first was asked;
`ReEvaluate` comes last. RefreshFacts names no Observe brings ("desired" and "fleet"
come with the spec and the round; "power" is PollObservedPower's) mean nothing here.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TypeAlias

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
)
from nodewarden.policy.facts import FactName
from nodewarden.policy.reasons import Decision
from nodewarden.policy.state import TransitionKind

MIN_RECHECK = timedelta(seconds=0.25)
"""A recheck is never sooner than this from now: one due "now" while the evidence it waits
for is still on its way would otherwise step the node in a loop."""


class Observation(enum.Enum):
    """What fresh evidence an `Observe` asks for."""

    POWER = "power"
    """The trusted power state (a BMC poll, a cloud read)."""
    PROBE = "probe"
    """The node's SSH probe readings (work, inhibitors, uptime, ready, identity)."""
    READY_PROBE = "ready-probe"
    """The ready probe."""
    CAPABILITY = "capability"
    """The BMC's capability discovery."""
    VM_LIST = "vm-list"
    """The cloud's VM list."""
    DEMAND = "demand"
    """A live re-read of the queue for this node."""


REFRESHED_BY: dict[FactName, Observation] = {
    "work": Observation.PROBE,
    "inhibitors": Observation.PROBE,
    "uptime": Observation.PROBE,
    "ready": Observation.PROBE,
    "identity": Observation.PROBE,
    "capability": Observation.CAPABILITY,
    "vm": Observation.VM_LIST,
    "demand": Observation.DEMAND,
}
"""The observation that refreshes each RefreshFacts name (the others have none)."""


@dataclass(frozen=True, slots=True)
class Observe:
    """Bring fresh evidence; its answer steps the node again."""

    what: Observation


@dataclass(frozen=True, slots=True)
class Recheck:
    """Step the node again at `at`."""

    at: datetime
    """When: the machine's time, never sooner than now + `MIN_RECHECK`."""
    asked: datetime
    """The time the machine asked for."""
    hold_write: bool
    """The machine asked for a time already passed: its next step follows at once, so
    this step's status write can wait for that one's."""


@dataclass(frozen=True, slots=True)
class ReEvaluate:
    """The periodic re-evaluation: the node deferred and asked for no recheck."""


@dataclass(frozen=True, slots=True)
class StopAdmission:
    """Stop binding work to the node (answered by AdmissionClosed)."""

    transition_id: str | None


@dataclass(frozen=True, slots=True)
class AllowAdmission:
    """Binding work to the node is allowed again."""

    transition_id: str | None


@dataclass(frozen=True, slots=True)
class SendPowerRequest:
    """Send the power request (answered by RequestAccepted / Rejected / Errored)."""

    request: RequestPower


@dataclass(frozen=True, slots=True)
class TransitionOpened:
    """A transition began (its PowerIntent is created or updated)."""

    transition: OpenTransition

    @property
    def kind(self) -> TransitionKind:
        return self.transition.kind


@dataclass(frozen=True, slots=True)
class TransitionClosed:
    """A transition ended (its PowerIntent is Succeeded, Aborted or Blocked)."""

    transition: CloseTransition

    @property
    def kind(self) -> TransitionKind:
        return self.transition.kind

    @property
    def outcome(self) -> str:
        return self.transition.outcome


@dataclass(frozen=True, slots=True)
class ShutdownCancelled:
    """A shutdown not yet irreversible was withdrawn."""

    transition_id: str


Effect: TypeAlias = (
    Observe
    | Recheck
    | ReEvaluate
    | StopAdmission
    | AllowAdmission
    | SendPowerRequest
    | TransitionOpened
    | TransitionClosed
    | ShutdownCancelled
)


def observations(action: Action) -> tuple[Observation, ...]:
    """The evidence one action asks for, in the order named, each once."""
    match action:
        case RereadDemand():
            return (Observation.DEMAND,)
        case PollObservedPower():
            return (Observation.POWER,)
        case RunReadyProbe():
            return (Observation.READY_PROBE,)
        case RefreshFacts(facts=names):
            found = (REFRESHED_BY[n] for n in names if n in REFRESHED_BY)
            return tuple(dict.fromkeys(found))
    return ()


def effects(actions: Iterable[Action], now: datetime, decision: Decision) -> tuple[Effect, ...]:
    """The effects of a step's `actions` taken at `now` (see the module docstring)."""
    out: list[Effect] = []
    seen: set[Observation] = set()
    recheck: int | None = None  # where the Recheck sits in `out`
    for action in actions:
        match action:
            case ScheduleRecheck(at=asked):
                if recheck is None:
                    recheck = len(out)
                    out.append(_recheck(asked, now))
                else:
                    earlier = out[recheck]
                    assert isinstance(earlier, Recheck)
                    out[recheck] = _recheck(min(earlier.asked, asked), now)
            case CloseAdmission(transition_id=tid):
                out.append(StopAdmission(transition_id=tid))
            case OpenAdmission(transition_id=tid):
                out.append(AllowAdmission(transition_id=tid))
            case RequestPower():
                out.append(SendPowerRequest(request=action))
            case OpenTransition():
                out.append(TransitionOpened(transition=action))
            case CloseTransition():
                out.append(TransitionClosed(transition=action))
            case CancelPendingShutdown(transition_id=tid):
                out.append(ShutdownCancelled(transition_id=tid))
            case _:
                for what in observations(action):
                    if what not in seen:
                        seen.add(what)
                        out.append(Observe(what=what))
    if decision is Decision.DEFER and recheck is None:
        out.append(ReEvaluate())
    return tuple(out)


def _recheck(asked: datetime, now: datetime) -> Recheck:
    return Recheck(at=max(asked, now + MIN_RECHECK), asked=asked, hold_write=asked <= now)
