"""Confirming a power change: request a reset, then poll PowerState until the target is seen.

A 2xx (or a completed task) proves only that the BMC accepted the request; the target
state counts as reached only when a PowerState read shows it, before the deadline.

`decide_confirmation_step` is the pure rule (facts + clock in, next step out);
`request_and_confirm` is the thin loop that reads, asks the rule, and acts:
- the state it produces decides, never the BMC's word on its request: a request
  returns once the BMC answered (a 202's task monitor is not waited for), so a task
  that never finishes, fails, or lives on another origin neither delays the PowerState
  reads nor turns an accepted request into a failed one. An unfinished task on the
  BMC's own origin is read in the background, at most once per poll, as evidence
  (`PowerTransitionResult.requests[i].task`);
- the state is read *before* any reset, so nothing is sent when the system is already
  at the target or still PoweringOn/PoweringOff (which would earn a 409);
- PoweringOn/PoweringOff count as "in progress", never as confirmation;
- a request that shows no effect after `resend_after` is re-sent: at most
  1 + `max_resends` resets are sent in all. Some BMCs report Off before the host is
  really down and drop an On sent in that window;
- a reset that failed (5xx/429, timeout, connection lost) counts against that budget
  like an accepted one, and the next attempt waits `resend_after` as well: a BMC that
  answers every reset with 500 gets 1 + `max_resends` of them, not one per poll;
- a 409 on the reset is counted and the state re-read at the next poll; a 409 shows a
  change is still pending, so it restarts the re-send clock like an accepted request
  (no reset every poll while the BMC works; a re-send racing the end of the change
  could otherwise be accepted as a second request); it does not use the budget;
- transient errors on reads are tolerated until the deadline;
- the deadline bounds the requests too: a reset still unanswered at the deadline is
  abandoned (recorded as in flight: the BMC may still act on it) and a read gets at
  most the time left, or `final_read_timeout` near the deadline. So the result comes
  at most `final_read_timeout` after the deadline, never a whole request timeout
  later; ConfirmationDeadlineExceeded carries the evidence.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Protocol

from nodewarden.clock import utc_now
from nodewarden.redfish.errors import (
    ConfirmationDeadlineExceeded,
    Conflict409,
    RedfishConnectionError,
    RedfishError,
    RedfishHttpError,
    RedfishTimeout,
    TlsError,
)
from nodewarden.redfish.facts import (
    FailedResetRequest,
    PowerStateObservation,
    RedfishPowerState,
    ResetRequestResult,
    TaskOutcome,
)

logger = logging.getLogger(__name__)

RESET_TARGETS: dict[str, RedfishPowerState] = {
    "On": RedfishPowerState.ON,
    "ForceOn": RedfishPowerState.ON,
    "GracefulShutdown": RedfishPowerState.OFF,
    "ForceOff": RedfishPowerState.OFF,
}
"""Reset types whose end state can be confirmed by PowerState alone."""


class PowerControl(Protocol):
    """What confirmation needs from a BMC client (RedfishClient satisfies it)."""

    @property
    def source(self) -> str: ...

    async def read_power_state(self) -> PowerStateObservation: ...

    async def request_reset(
        self, reset_type: str, *, check_allowable: bool = True
    ) -> ResetRequestResult: ...

    async def read_task(self, task: TaskOutcome) -> TaskOutcome: ...


@dataclass(frozen=True, slots=True)
class ConfirmationSettings:
    """Deadline and pacing of one confirmation."""

    deadline: timedelta
    poll_interval: timedelta = timedelta(seconds=2)
    resend_after: timedelta | None = timedelta(seconds=45)
    """Re-send when the state has not moved this long after the last reset attempt
    ended (accepted, failed, or refused with 409; None: never). Keep it above the BMC's
    normal transition time: re-sending can restart a BMC's pending change."""
    max_resends: int = 1
    """Resets sent after the first, accepted or failed alike."""
    final_read_timeout: timedelta = timedelta(seconds=5)
    """How long a PowerState read may take when less than this is left before the
    deadline (the state at the deadline is evidence); bounds how late a result comes."""

    def __post_init__(self) -> None:
        if self.deadline <= timedelta(0):
            raise ValueError("confirmation deadline must be positive")
        if self.poll_interval <= timedelta(0):
            raise ValueError("confirmation poll interval must be positive")
        if self.final_read_timeout <= timedelta(0):
            raise ValueError("confirmation final read timeout must be positive")
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
    target: RedfishPowerState,
    observed: RedfishPowerState | None,
    accepted_requests: int,
    failed_requests: int,
    last_answered_at: datetime | None,
    deadline: datetime,
    settings: ConfirmationSettings,
    now: datetime,
) -> ConfirmationStep:
    """The next step of a confirmation, from the latest observation (None: read failed).

    `accepted_requests` / `failed_requests`: resets the BMC accepted / that failed
    (5xx/429, timeout, connection lost); both use the budget of 1 + `max_resends`
    attempts. A 409 is neither. `last_answered_at`: when the last reset attempt ended,
    whatever its outcome (409 included)."""
    if observed is not None and observed == target:
        return ConfirmationStep(StepKind.CONFIRMED, "OBSERVED_TARGET_STATE")
    if now >= deadline:
        return ConfirmationStep(StepKind.DEADLINE_EXCEEDED, "DEADLINE_EXCEEDED")
    if observed is None:
        return ConfirmationStep(StepKind.WAIT, "POWER_STATE_UNREADABLE")
    if observed.transitional:
        return ConfirmationStep(StepKind.WAIT, "TRANSITION_IN_PROGRESS")
    if observed == RedfishPowerState.UNKNOWN:
        return ConfirmationStep(StepKind.WAIT, "POWER_STATE_UNKNOWN")
    attempts = accepted_requests + failed_requests
    if attempts == 0:
        return ConfirmationStep(StepKind.SEND, "NOT_REQUESTED_YET")
    if settings.resend_after is None:
        return ConfirmationStep(StepKind.WAIT, "AWAITING_CHANGE")
    if attempts > settings.max_resends:
        return ConfirmationStep(StepKind.WAIT, "RESEND_BUDGET_USED")
    if last_answered_at is not None and now - last_answered_at >= settings.resend_after:
        if accepted_requests == 0:
            return ConfirmationStep(StepKind.RESEND, "REQUEST_FAILED")
        return ConfirmationStep(StepKind.RESEND, "NO_CHANGE_AFTER_REQUEST")
    return ConfirmationStep(StepKind.WAIT, "AWAITING_CHANGE")


@dataclass(frozen=True, slots=True)
class PowerTransitionResult:
    """A confirmed power change: request evidence and state evidence, kept apart."""

    reset_type: str
    target: RedfishPowerState
    source: str
    requests: tuple[ResetRequestResult, ...]
    """Accepted reset requests (empty when the system already was at the target)."""
    confirmation: PowerStateObservation
    """The observation that showed the target state."""
    states_seen: tuple[RedfishPowerState, ...]
    """Distinct states observed, in order (e.g. Off, PoweringOn, On)."""
    conflicts: int
    started_at: datetime
    failed_requests: tuple[FailedResetRequest, ...] = ()
    """Resets sent that were not accepted (they count against `max_resends`)."""

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
    that waiting cannot fix (AuthFailed, TlsError, ActionNotSupported…). What a task
    monitor says never raises: it is evidence in `requests[i].task`.
    """
    target = RESET_TARGETS.get(reset_type)
    if target is None:
        raise ValueError(
            f"cannot confirm reset type {reset_type!r} by PowerState; "
            f"confirmable: {', '.join(sorted(RESET_TARGETS))}"
        )
    tasks = _TaskEvidence(control)
    try:
        return await _confirm(
            control, reset_type, target, settings, check_allowable, tasks, clock, sleep
        )
    finally:
        await tasks.stop()


async def _confirm(
    control: PowerControl,
    reset_type: str,
    target: RedfishPowerState,
    settings: ConfirmationSettings,
    check_allowable: bool,
    tasks: _TaskEvidence,
    clock: Callable[[], datetime],
    sleep: Callable[[float], Awaitable[None]],
) -> PowerTransitionResult:
    """The loop of `request_and_confirm` (see there and the module docstring)."""
    endpoint = control.source.removeprefix("redfish:")
    started_at = clock()
    deadline = started_at + settings.deadline
    requests: list[ResetRequestResult] = []
    failed: list[FailedResetRequest] = []
    states_seen: list[RedfishPowerState] = []
    conflicts = 0
    last_answered_at: datetime | None = None
    last_observation: PowerStateObservation | None = None
    last_error: str | None = None
    while True:
        tasks.poll(requests)
        current: RedfishPowerState | None = None
        time_left = (deadline - clock()).total_seconds()
        try:
            async with asyncio.timeout(max(time_left, settings.final_read_timeout.total_seconds())):
                last_observation = await control.read_power_state()
            current = last_observation.state
            if not states_seen or states_seen[-1] != current:
                states_seen.append(current)
        except (RedfishTimeout, RedfishConnectionError, RedfishHttpError) as exc:
            _raise_unless_transient(exc)
            last_error = exc.detail
            logger.info(
                "redfish power state read failed during confirmation: %s",
                exc.detail,
                extra={"redfish_endpoint": endpoint},
            )
        except TimeoutError:  # our own bound, not the client's timeout
            last_error = "reading PowerState did not finish by the confirmation deadline"
        now = clock()
        step = decide_confirmation_step(
            target=target,
            observed=current,
            accepted_requests=len(requests),
            failed_requests=len(failed),
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
                failed_requests=tuple(failed),
            )
        if step.kind is StepKind.DEADLINE_EXCEEDED:
            seen = last_observation.state.value if last_observation else "nothing"
            in_flight = (
                f"; a {reset_type} request was still in flight at the confirmation deadline "
                "(the BMC may still act on it)"
                if any(f.in_flight_at_deadline for f in failed)
                else ""
            )
            raise ConfirmationDeadlineExceeded(
                endpoint,
                f"{target.value} not observed within {settings.deadline.total_seconds():g}s "
                f"after {len(requests)} accepted and {len(failed)} failed {reset_type} "
                f"request(s){in_flight}; last observed {seen}",
                target=target,
                deadline=deadline,
                last_observation=last_observation,
                requests=requests,
                failed_requests=failed,
                last_error=last_error,
            )
        if step.kind in (StepKind.SEND, StepKind.RESEND):
            requested_at = clock()
            failure: FailedResetRequest | None = None
            try:
                async with asyncio.timeout((deadline - requested_at).total_seconds()):
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
                _raise_unless_transient(exc)
                # Not accepted, or unknown whether the BMC got it: the next read tells.
                failure = FailedResetRequest(
                    reset_type=reset_type,
                    error=exc.detail,
                    http_status=exc.status if isinstance(exc, RedfishHttpError) else None,
                    in_flight_at_deadline=False,
                    source=control.source,
                    requested_at=requested_at,
                    failed_at=clock(),
                )
            except TimeoutError:  # our own bound: the deadline came first
                failure = FailedResetRequest(
                    reset_type=reset_type,
                    error=f"reset {reset_type} unfinished at the confirmation deadline; abandoned",
                    http_status=None,
                    in_flight_at_deadline=True,
                    source=control.source,
                    requested_at=requested_at,
                    failed_at=clock(),
                )
            if failure is not None:  # uses one attempt of the budget
                failed.append(failure)
                last_answered_at = failure.failed_at
                last_error = failure.error
                logger.info(
                    "redfish %s request failed: %s",
                    reset_type,
                    failure.error,
                    extra={"redfish_endpoint": endpoint, "failed_requests": len(failed)},
                )
        remaining = (deadline - clock()).total_seconds()
        await sleep(max(0.0, min(settings.poll_interval.total_seconds(), remaining)))


class _TaskEvidence:
    """Reads the task monitor of the latest accepted request in the background, at most
    one read in flight, and folds what it says into that request's evidence. Never
    awaited by the confirmation loop: a slow or silent monitor delays nothing."""

    def __init__(self, control: PowerControl) -> None:
        self.control = control
        self._reading: asyncio.Task[TaskOutcome] | None = None
        self._index = -1

    def poll(self, requests: list[ResetRequestResult]) -> None:
        """Fold a finished read into `requests`; start the next read if one is due."""
        reading = self._reading
        if reading is not None:
            if not reading.done():
                return
            self._reading = None
            request = requests[self._index]
            assert request.task is not None
            try:
                outcome = reading.result()
            except RedfishError as exc:
                outcome = replace(
                    request.task, state="Unreadable", not_followed=f"reading it failed: {exc}"
                )
            requests[self._index] = replace(request, task=outcome)
        if not requests:
            return
        task = requests[-1].task
        if task is not None and task.followable:
            self._index = len(requests) - 1
            self._reading = asyncio.ensure_future(self.control.read_task(task))

    async def stop(self) -> None:
        if self._reading is not None and not self._reading.done():
            self._reading.cancel()
        if self._reading is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reading


def _raise_unless_transient(
    exc: RedfishTimeout | RedfishConnectionError | RedfishHttpError,
) -> None:
    """Re-raise what waiting cannot fix (TLS, non-transient HTTP errors)."""
    if isinstance(exc, TlsError) or (isinstance(exc, RedfishHttpError) and not exc.transient):
        raise exc
