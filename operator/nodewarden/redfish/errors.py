"""Typed errors of the Redfish adapter: one class per failure a caller must tell apart.

Every message names the BMC endpoint and what to do about the failure; none carries a
password, an X-Auth-Token or an Authorization header (texts quoted from the BMC are
redacted before they get here). Exceptions from aiohttp are never chained as causes,
because their request info can hold headers.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from nodewarden.redfish.facts import (
        FailedResetRequest,
        PowerStateObservation,
        RedfishPowerState,
        ResetRequestResult,
    )


class RedfishError(Exception):
    """Base class: anything that went wrong talking to one BMC."""

    def __init__(self, endpoint: str, message: str) -> None:
        super().__init__(f"{message} [redfish:{endpoint}]")
        self.endpoint = endpoint
        self.detail = message


class RedfishConnectionError(RedfishError):
    """The BMC could not be reached (refused, reset, DNS, unreachable)."""


TlsProblem = Literal["unknown_ca", "hostname_mismatch", "expired", "handshake", "other"]


class TlsError(RedfishConnectionError):
    """The BMC's certificate was not accepted (verification stays on; fix the CA bundle)."""

    def __init__(self, endpoint: str, message: str, problem: TlsProblem) -> None:
        super().__init__(endpoint, message)
        self.problem: TlsProblem = problem


class RedfishTimeout(RedfishError, TimeoutError):
    """A request to the BMC did not complete within its timeout."""

    def __init__(self, endpoint: str, message: str, timeout_seconds: float) -> None:
        super().__init__(endpoint, message)
        self.timeout_seconds = timeout_seconds


class RedfishHttpError(RedfishError):
    """The BMC answered with an HTTP error status not covered by a narrower class."""

    def __init__(
        self,
        endpoint: str,
        message: str,
        status: int,
        message_ids: Sequence[str] = (),
        retry_after: float | None = None,
    ) -> None:
        super().__init__(endpoint, message)
        self.status = status
        self.message_ids = tuple(message_ids)
        self.retry_after = retry_after

    @property
    def transient(self) -> bool:
        """True for statuses worth retrying later (5xx, 429)."""
        return self.status >= 500 or self.status == 429


class AuthFailed(RedfishHttpError):
    """The BMC rejected the credentials (401/403), also after one fresh login."""


class NotFound(RedfishHttpError):
    """The resource (service root, system, action, task) does not exist (404)."""


class Conflict409(RedfishHttpError):
    """The BMC refused a request that conflicts with its current state (409)."""


class ActionNotSupported(RedfishHttpError):
    """The reset type is not offered by this system (allowable values, 400/405/501).

    `status` is the BMC's HTTP status, or 0 when the client refused before sending
    because the BMC's own allowable values exclude the type.
    """

    def __init__(
        self,
        endpoint: str,
        message: str,
        status: int,
        reset_type: str,
        allowable: Sequence[str] | None = None,
        message_ids: Sequence[str] = (),
    ) -> None:
        super().__init__(endpoint, message, status, message_ids)
        self.reset_type = reset_type
        self.allowable = tuple(allowable) if allowable is not None else None


class RedfishProtocolError(RedfishError):
    """The BMC's answer does not follow the Redfish schema well enough to use it."""


class SystemDiscoveryError(RedfishError):
    """No unique ComputerSystem: none, or several and no system id configured."""

    def __init__(self, endpoint: str, message: str, members: Sequence[str]) -> None:
        super().__init__(endpoint, message)
        self.members = tuple(members)


class ConfirmationDeadlineExceeded(RedfishError, TimeoutError):
    """The requested power state was not observed before the deadline.

    Carries the evidence: what was requested and accepted, what was sent and failed (a
    request abandoned in flight at the deadline is marked so: the BMC may still act on
    it), and the last observation. Acceptance of a request never counts as confirmation.
    """

    def __init__(
        self,
        endpoint: str,
        message: str,
        *,
        target: RedfishPowerState,
        deadline: datetime,
        last_observation: PowerStateObservation | None,
        requests: Sequence[ResetRequestResult],
        failed_requests: Sequence[FailedResetRequest] = (),
        last_error: str | None = None,
    ) -> None:
        super().__init__(endpoint, message)
        self.target = target
        self.deadline = deadline
        self.last_observation = last_observation
        self.requests = tuple(requests)
        self.failed_requests = tuple(failed_requests)
        self.last_error = last_error
