"""Typed facts the Redfish adapter returns, each with its source and the time it was read.

What a BMC *accepted* (`ResetRequestResult`: HTTP status, task outcome) is kept apart
from what it *reports* (`PowerStateObservation`): only an observation can confirm a
power state, and only one whose state equals the target. A reset that was not accepted
(5xx, timeout, connection lost, cut at the confirmation deadline) is a
`FailedResetRequest`: evidence of an attempt, never of acceptance.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Literal

from nodewarden.api.workernode import ObservedPower


class RedfishPowerState(StrEnum):
    """ComputerSystem.PowerState as reported by the BMC (UNKNOWN: absent or unrecognised)."""

    ON = "On"
    OFF = "Off"
    POWERING_ON = "PoweringOn"
    POWERING_OFF = "PoweringOff"
    PAUSED = "Paused"
    UNKNOWN = "Unknown"

    @classmethod
    def parse(cls, value: object) -> RedfishPowerState:
        """Map a raw PowerState property to a member; anything else is UNKNOWN."""
        if isinstance(value, str):
            for member in cls:
                if member.value == value:
                    return member
        return cls.UNKNOWN

    @property
    def transitional(self) -> bool:
        """PoweringOn/PoweringOff: a change is in progress, not a settled state."""
        return self in (RedfishPowerState.POWERING_ON, RedfishPowerState.POWERING_OFF)

    @property
    def observed_power(self) -> ObservedPower:
        """The WorkerNode status value for this state (Paused counts as Unknown)."""
        mapping: dict[RedfishPowerState, ObservedPower] = {
            RedfishPowerState.ON: "On",
            RedfishPowerState.OFF: "Off",
            RedfishPowerState.POWERING_ON: "PoweringOn",
            RedfishPowerState.POWERING_OFF: "PoweringOff",
        }
        return mapping.get(self, "Unknown")


REDFISH_RESET_TYPES: frozenset[str] = frozenset(
    {
        "On",
        "ForceOn",
        "ForceOff",
        "GracefulShutdown",
        "GracefulRestart",
        "ForceRestart",
        "Nmi",
        "PushPowerButton",
        "PowerCycle",
        "FullPowerCycle",
        "Suspend",
        "Pause",
        "Resume",
    }
)
"""ResetType values defined by the Redfish Resource schema."""


@dataclass(frozen=True, slots=True)
class SystemRef:
    """The ComputerSystem a client acts on, found by discovery."""

    system_id: str
    path: str
    reset_target: str | None
    """URI of ComputerSystem.Reset, or None when the system offers no reset action."""
    name: str | None
    uuid: str | None


AllowableSource = Literal["inline", "action_info", "unspecified", "no_reset_action"]


@dataclass(frozen=True, slots=True)
class ResetCapabilities:
    """Reset types the BMC says it accepts for this system.

    `allowable` is None when the BMC offers the action but does not say which types it
    accepts (neither inline AllowableValues nor an ActionInfo resource): unknown, which
    the capability gate must treat as "not proven".
    """

    allowable: frozenset[str] | None
    found_in: AllowableSource
    action_info_path: str | None
    source: str
    observed_at: datetime

    def allows(self, reset_type: str) -> bool | None:
        """True/False when the BMC says so, None when it does not say."""
        if self.found_in == "no_reset_action":
            return False
        if self.allowable is None:
            return None
        return reset_type in self.allowable


@dataclass(frozen=True, slots=True)
class PowerStateObservation:
    """PowerState read from the BMC: evidence of the *actual* state at `observed_at`."""

    system_id: str
    state: RedfishPowerState
    raw: str | None
    source: str
    observed_at: datetime
    system_uuid: str | None = None
    """The system's ComputerSystem.UUID (lower case), read with the PowerState; None when
    the BMC reports none (or not in UUID form)."""


@dataclass(frozen=True, slots=True)
class TaskOutcome:
    """What the task monitor of an asynchronous (202) request said, last time we asked.

    Evidence about the request only: whatever it says, the request stays accepted and
    the power state is judged by PowerState reads (a task may never finish, or finish
    before the host is really off)."""

    monitor: str
    state: str
    """Redfish TaskState ("Running", "Completed", "Exception", …) as last reported (the
    202 answer's, until the monitor is read), "Gone" when the monitor vanished before it
    reported an end, "Unreadable" when reading it failed."""
    finished: bool
    polls: int
    messages: tuple[str, ...] = ()
    not_followed: str | None = None
    """Why the monitor is not (or no longer) read: none given, it points to another
    origin (credentials go only to the configured endpoint), or reading it failed.
    None: it may be read."""

    @property
    def followable(self) -> bool:
        """Still worth reading: unfinished, and on the BMC's own origin."""
        return not self.finished and self.not_followed is None

    @property
    def failed(self) -> bool:
        """The BMC says the task ended badly (its word; PowerState still decides)."""
        return self.finished and self.state in ("Exception", "Killed", "Cancelled")


@dataclass(frozen=True, slots=True)
class ResetRequestResult:
    """The BMC accepted a ComputerSystem.Reset: evidence of the *request*, not of the state."""

    system_id: str
    reset_type: str
    http_status: int
    task: TaskOutcome | None
    source: str
    requested_at: datetime
    answered_at: datetime

    @property
    def accepted(self) -> bool:
        """Always True: a refused request raises a typed error instead of returning."""
        return True


@dataclass(frozen=True, slots=True)
class FailedResetRequest:
    """A ComputerSystem.Reset that was sent but not accepted, or whose answer never came.

    Without an answer (timeout, connection lost, cut at the deadline) the BMC may still
    have received the request and may still act on it.
    """

    reset_type: str
    error: str
    """What went wrong, as the adapter's error says it (no secrets)."""
    http_status: int | None
    """The BMC's HTTP status (5xx, 429), None when no answer came."""
    in_flight_at_deadline: bool
    """The request was still unanswered at the confirmation deadline and was abandoned."""
    source: str
    requested_at: datetime
    failed_at: datetime
