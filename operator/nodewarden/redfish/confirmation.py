"""Confirming a power change: request a reset, then poll PowerState until the target is seen.

A 2xx (or a completed task) proves only that the BMC accepted the request; the target
state counts as reached only when a PowerState read shows it, before the deadline.

`decide_confirmation_step` is the pure rule (facts + clock in, next step out);
`request_and_confirm` is the thin loop that reads, asks the rule, and acts:
- the state is read *before* any reset, so nothing is sent when the system is already
  at the target or still PoweringOn/PoweringOff (which would earn a 409);
- PoweringOn/PoweringOff count as "in progress", never as confirmation;
- a request that shows no effect after `resend_after` is re-sent (at most
  `max_resends` times): some BMCs report Off before the host is really down and drop
  an On sent in that window;
- a 409 on the reset is counted and the state re-read at the next poll; a 409 shows a
  change is still pending, so it restarts the re-send clock like an accepted request
  (no reset every poll while the BMC works; a re-send racing the end of the change
  could otherwise be accepted as a second request);
- transient errors (timeouts, connection loss, 5xx/429) on reads and resets are
  tolerated until the deadline; at the deadline ConfirmationDeadlineExceeded carries
  the evidence.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Protocol

from nodewarden.redfish.errors import (
    ConfirmationDeadlineExceeded,
    Conflict409,
    RedfishConnectionError,
    RedfishHttpError,
    RedfishTimeout,
    TlsError,
)
from nodewarden.redfish.facts import PowerState, PowerStateObservation, ResetRequestResult

logger = logging.getLogger(__name__)

RESET_TARGETS: dict[str, PowerState] = {
    "On": PowerState.ON,
    "ForceOn": PowerState.ON,
    "GracefulShutdown": PowerState.OFF,
    "ForceOff": PowerState.OFF,
}
"""Reset types whose end state can be confirmed by PowerState alone."""


def utc_now() -> datetime:
    return datetime.now(UTC)


class PowerControl(Protocol):
    """What confirmation needs from a BMC client (RedfishClient satisfies it)."""

    @property
    def source(self) -> str: ...

    async def read_power_state(self) -> PowerStateObservation: ...

    async def request_reset(
        self,
        reset_type: str,
        *,
        check_allowable: bool = True,
        wait_for_task: bool = True,
    ) -> ResetRequestResult: ...


@dataclass(frozen=True, slots=True)
class ConfirmationSettings:
    """Deadline and pacing of one confirmation."""

    deadline: timedelta
    poll_interval: timedelta = timedelta(seconds=2)
    resend_after: timedelta | None = timedelta(seconds=45)
    """Re-send when the state has not moved this long after the last answered request,
    accepted or refused with 409 (None: never). Keep it above the BMC's normal
    transition time: re-sending can restart a BMC's pending change."""
    max_resends: int = 1

    def __post_init__(self) -> None:
        if self.deadline <= timedelta(0):
            raise ValueError("confirmation deadline must be positive")
        if self.poll_interval <= timedelta(0):
            raise ValueError("confirmation poll interval must be positive")
        if self.max_resends < 0:
            raise ValueError("max_resends must not be negative")


class StepKind(StrEnum):
    CONFIRMED = "Confirmed"
    SEND = "Send"
    RESEND = "Resend"
    WAIT = "Wait"
    DEADLINE_EXCEEDED = "DeadlineExceeded"


@dataclass(frozen=True, slots=True)
class ConfirmationStep:
    """What to do next, with a machine-readable reason code."""

    kind: StepKind
    reason: str


def decide_confirmation_step(
    *,
    target: PowerState,
    observed: PowerState | None,
    accepted_requests: int,
    last_answered_at: datetime | None,
    deadline: datetime,
    settings: ConfirmationSettings,
    now: datetime,
) -> ConfirmationStep:
    """The next step of a confirmation, from the latest observation (None: read failed).

    `last_answered_at`: when the last reset was answered, accepted or refused with 409."""
    if observed is not None and observed == target:
        return ConfirmationStep(StepKind.CONFIRMED, "OBSERVED_TARGET_STATE")
    if now >= deadline:
        return ConfirmationStep(StepKind.DEADLINE_EXCEEDED, "DEADLINE_EXCEEDED")
    if observed is None:
        return ConfirmationStep(StepKind.WAIT, "POWER_STATE_UNREADABLE")
    if observed.transitional:
        return ConfirmationStep(StepKind.WAIT, "TRANSITION_IN_PROGRESS")
    if observed == PowerState.UNKNOWN:
        return ConfirmationStep(StepKind.WAIT, "POWER_STATE_UNKNOWN")
    if accepted_requests == 0:
        return ConfirmationStep(StepKind.SEND, "NOT_REQUESTED_YET")
    resends_used = accepted_requests - 1
    if (
        settings.resend_after is not None
        and resends_used < settings.max_resends
        and last_answered_at is not None
        and now - last_answered_at >= settings.resend_after
    ):
        return ConfirmationStep(StepKind.RESEND, "NO_CHANGE_AFTER_REQUEST")
    return ConfirmationStep(StepKind.WAIT, "AWAITING_CHANGE")


@dataclass(frozen=True, slots=True)
class PowerTransitionResult:
    """A confirmed power change: request evidence and state evidence, kept apart."""

    reset_type: str
    target: PowerState
    source: str
    requests: tuple[ResetRequestResult, ...]
    """Accepted reset requests (empty when the system already was at the target)."""
    confirmation: PowerStateObservation
    """The observation that showed the target state."""
    states_seen: tuple[PowerState, ...]
    """Distinct states observed, in order (e.g. Off, PoweringOn, On)."""
    conflicts: int
    started_at: datetime

    @property
    def already_at_target(self) -> bool:
        return not self.requests


async def request_and_confirm(
    control: PowerControl,
    reset_type: str,
    settings: ConfirmationSettings,
    *,
    check_allowable: bool = True,
    clock: Callable[[], datetime] = utc_now,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> PowerTransitionResult:
    """Reset (only if needed) and poll PowerState until the target state is observed.

    Raises ConfirmationDeadlineExceeded at the deadline, ValueError for reset types
    whose outcome PowerState cannot show, and the client's typed errors for refusals
    that waiting cannot fix (AuthFailed, TlsError, ActionNotSupported, TaskFailed…).
    """
    target = RESET_TARGETS.get(reset_type)
    if target is None:
        raise ValueError(
            f"cannot confirm reset type {reset_type!r} by PowerState; "
            f"confirmable: {', '.join(sorted(RESET_TARGETS))}"
        )
    endpoint = control.source.removeprefix("redfish:")
    started_at = clock()
    deadline = started_at + settings.deadline
    requests: list[ResetRequestResult] = []
    states_seen: list[PowerState] = []
    conflicts = 0
    last_answered_at: datetime | None = None
    last_observation: PowerStateObservation | None = None
    last_error: str | None = None
    while True:
        current: PowerState | None
        try:
            last_observation = await control.read_power_state()
            current = last_observation.state
            if not states_seen or states_seen[-1] != current:
                states_seen.append(current)
        except (RedfishTimeout, RedfishConnectionError, RedfishHttpError) as exc:
            if isinstance(exc, TlsError) or (
                isinstance(exc, RedfishHttpError) and not exc.transient
            ):
                raise
            current = None
            last_error = exc.detail
            logger.info(
                "redfish power state read failed during confirmation: %s",
                exc.detail,
                extra={"redfish_endpoint": endpoint},
            )
        now = clock()
        step = decide_confirmation_step(
            target=target,
            observed=current,
            accepted_requests=len(requests),
            last_answered_at=last_answered_at,
            deadline=deadline,
            settings=settings,
            now=now,
        )
        if step.kind is StepKind.CONFIRMED:
            assert last_observation is not None
            logger.info(
                "redfish %s confirmed by PowerState %s",
                reset_type,
                target.value,
                extra={"redfish_endpoint": endpoint, "requests": len(requests)},
            )
            return PowerTransitionResult(
                reset_type=reset_type,
                target=target,
                source=control.source,
                requests=tuple(requests),
                confirmation=last_observation,
                states_seen=tuple(states_seen),
                conflicts=conflicts,
                started_at=started_at,
            )
        if step.kind is StepKind.DEADLINE_EXCEEDED:
            seen = last_observation.state.value if last_observation else "nothing"
            raise ConfirmationDeadlineExceeded(
                endpoint,
                f"{target.value} not observed within {settings.deadline.total_seconds():g}s "
                f"after {len(requests)} accepted {reset_type} request(s); last observed {seen}",
                target=target,
                deadline=deadline,
                last_observation=last_observation,
                requests=requests,
                last_error=last_error,
            )
        if step.kind in (StepKind.SEND, StepKind.RESEND):
            try:
                result = await control.request_reset(
                    reset_type, check_allowable=check_allowable and not requests
                )
                requests.append(result)
                last_answered_at = result.answered_at
            except Conflict409 as exc:
                conflicts += 1
                last_answered_at = clock()
                last_error = exc.detail
                logger.info(
                    "redfish %s refused with 409; re-reading state",
                    reset_type,
                    extra={"redfish_endpoint": endpoint, "conflicts": conflicts},
                )
            except (RedfishTimeout, RedfishConnectionError, RedfishHttpError) as exc:
                if isinstance(exc, TlsError) or (
                    isinstance(exc, RedfishHttpError) and not exc.transient
                ):
                    raise
                # Not accepted, or unknown whether the BMC got it: the next read tells,
                # and a re-send is allowed.
                last_error = exc.detail
                logger.info(
                    "redfish %s request failed in transit: %s",
                    reset_type,
                    exc.detail,
                    extra={"redfish_endpoint": endpoint},
                )
        remaining = (deadline - clock()).total_seconds()
        await sleep(max(0.0, min(settings.poll_interval.total_seconds(), remaining)))
