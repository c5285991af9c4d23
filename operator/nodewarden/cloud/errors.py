"""Typed cloud errors and the classification of libcloud exceptions into them.

Every failure of a cloud call leaves the cloud adapter as one `CloudError` subclass; its
`kind` says how callers and `nodewarden.cloud.backoff.CloudBackoff` react:

| kind          | examples (provider code / HTTP)                              | back-off              |
|---------------|--------------------------------------------------------------|-----------------------|
| `quota`       | EC2 InstanceLimitExceeded, GCE QUOTA_EXCEEDED                | all creates blocked 1 m |
| `capacity`    | EC2 InsufficientInstanceCapacity / InsufficientHostCapacity / Unsupported, GCE ZONE_RESOURCE_POOL_EXHAUSTED | creates of that provider type blocked 1 m |
| `quota-group` | EC2 VcpuLimitExceeded                                        | creates of that quota group blocked 1 m |
| `rate-limit`  | EC2 RequestLimitExceeded / Throttling, HTTP 429, HTTP 503 (+ Retry-After) | every call waits: delay x1.5 + 1 s, clamped 1 s..1 m, and at least until Retry-After |
| `transient`   | HTTP 500/502/504, InternalError, connection errors, timeouts | none; the next sync retries (bounded by the ops/s cap) |
| `auth`        | InvalidCredsError, AuthFailure, HTTP 401/403                 | all creates blocked 1 m (fix the Secret) |
| `not-found`   | InvalidInstanceID.NotFound, HTTP 404                         | none; `destroy` treats it as done |
| `permanent`   | any other 4xx (bad image, bad parameter), unknown exceptions | creates of that type blocked 1 m |

Error messages are passed through a `Redactor` so that credentials never appear in
them, and the original exception is chained only as `__cause__` after the same
redaction of its text (`str(err)` never carries a secret).
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterable
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from libcloud.common.exceptions import BaseHTTPError, RateLimitReachedError
from libcloud.common.types import (
    InvalidCredsError,
    LibcloudError,
    MalformedResponseError,
    ProviderError,
)


class CloudErrorKind(StrEnum):
    QUOTA = "quota"
    CAPACITY = "capacity"
    QUOTA_GROUP = "quota-group"
    RATE_LIMIT = "rate-limit"
    TRANSIENT = "transient"
    AUTH = "auth"
    NOT_FOUND = "not-found"
    PERMANENT = "permanent"


class CloudError(Exception):
    """A failed cloud operation, classified. `str()` is safe to log (credentials redacted)."""

    kind: CloudErrorKind = CloudErrorKind.PERMANENT

    def __init__(
        self,
        message: str,
        *,
        operation: str,
        observed_at: datetime,
        provider_code: str | None = None,
        http_status: int | None = None,
        instance_type: str | None = None,
        quota_group: str | None = None,
        retry_at: datetime | None = None,
        locally_throttled: bool = False,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.operation = operation
        self.observed_at = observed_at
        self.provider_code = provider_code
        self.http_status = http_status
        self.instance_type = instance_type
        self.quota_group = quota_group
        self.retry_at = retry_at
        self.locally_throttled = locally_throttled

    def __str__(self) -> str:
        code = f" [{self.provider_code}]" if self.provider_code else ""
        return f"cloud {self.operation} failed ({self.kind.value}){code}: {self.message}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self!s})"

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled with its fields (a worker process's list error crosses to the operator;
        the message is already redacted)."""
        return (_restore_error, (type(self), dict(self.__dict__)))


def _restore_error(cls: type[CloudError], fields: dict[str, Any]) -> CloudError:
    error = cls.__new__(cls)
    Exception.__init__(error, fields.get("message", ""))
    error.__dict__.update(fields)
    return error


class QuotaExceeded(CloudError):
    """The account may not run more instances; creates of every type wait."""

    kind = CloudErrorKind.QUOTA


class CapacityUnavailable(CloudError):
    """The provider has no capacity for one instance type right now."""

    kind = CloudErrorKind.CAPACITY


class QuotaGroupExceeded(CloudError):
    """A quota shared by a group of types (e.g. EC2 vCPU quota per family) is used up."""

    kind = CloudErrorKind.QUOTA_GROUP


class RateLimited(CloudError):
    """The provider (or our own throttle) asks us to slow down; `retry_at` = earliest retry."""

    kind = CloudErrorKind.RATE_LIMIT


class TransientCloudError(CloudError):
    """A failure that is expected to go away (5xx, connection reset, timeout)."""

    kind = CloudErrorKind.TRANSIENT


class PermanentCloudError(CloudError):
    """A failure that repeats until something is changed (bad parameter, bad image, bug)."""

    kind = CloudErrorKind.PERMANENT


class CloudAuthError(PermanentCloudError):
    """The credentials were refused."""

    kind = CloudErrorKind.AUTH


class InstanceNotFound(PermanentCloudError):
    """The instance does not exist (any more)."""

    kind = CloudErrorKind.NOT_FOUND


class CreateBlocked(CloudError):
    """A create was refused locally because of an earlier quota/capacity/rate-limit error.

    Its `kind` is the kind of the error that caused the block; `retry_at` says when the
    block ends. No cloud call was made.
    """

    def __init__(
        self,
        message: str,
        *,
        cause_kind: CloudErrorKind,
        operation: str,
        observed_at: datetime,
        instance_type: str | None = None,
        quota_group: str | None = None,
        retry_at: datetime | None = None,
    ) -> None:
        super().__init__(
            message,
            operation=operation,
            observed_at=observed_at,
            instance_type=instance_type,
            quota_group=quota_group,
            retry_at=retry_at,
            locally_throttled=True,
        )
        self.kind = cause_kind


# Provider error codes, as they appear in libcloud's error messages ("Code: message").
QUOTA_CODES = frozenset(
    {
        "InstanceLimitExceeded",
        "MaxSpotInstanceCountExceeded",
        "QUOTA_EXCEEDED",
        "QuotaExceeded",
        "OperationNotAllowed",  # Azure: "... exceeding approved ... quota"
    }
)
CAPACITY_CODES = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InsufficientHostCapacity",
        "InsufficientReservedInstanceCapacity",
        "Unsupported",  # EC2: the type is not offered in this zone
        "ZONE_RESOURCE_POOL_EXHAUSTED",
        "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
        "SkuNotAvailable",
        "AllocationFailed",
    }
)
QUOTA_GROUP_CODES = frozenset({"VcpuLimitExceeded"})
RATE_LIMIT_CODES = frozenset(
    {
        "RequestLimitExceeded",
        "Throttling",
        "ThrottlingException",
        "TooManyRequests",
        "RATE_LIMIT_EXCEEDED",
        "rateLimitExceeded",
    }
)
TRANSIENT_CODES = frozenset(
    {"InternalError", "InternalFailure", "ServiceUnavailable", "Unavailable", "RequestTimeout"}
)
NOT_FOUND_CODES = frozenset({"InvalidInstanceID.NotFound", "NotFound", "ResourceNotFound"})
AUTH_CODES = frozenset(
    {
        "AuthFailure",
        "InvalidClientTokenId",
        "SignatureDoesNotMatch",
        "UnauthorizedOperation",
        "OptInRequired",
    }
)

_MAX_MESSAGE = 1000
_CODE_AT_LINE_START = re.compile(r"(?m)^\s*([A-Za-z][A-Za-z0-9_.]*)\s*:")
_CODE_ANYWHERE = re.compile(r"\b([A-Za-z][A-Za-z0-9_.]{3,})\b")


class Redactor:
    """Replaces known secret values in text with '***'."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        # Longest first so a secret containing another is replaced whole.
        self._secrets = sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, "***")
        return text


def provider_codes(exc: BaseException) -> list[str]:
    """Provider error codes found on a libcloud exception (attribute or message text)."""
    codes: list[str] = []
    for attr in ("code", "error_code", "value"):
        value = getattr(exc, attr, None)
        if isinstance(value, str) and value and " " not in value and len(value) < 80:
            codes.append(value)
    text = _exception_text(exc)
    codes.extend(_CODE_AT_LINE_START.findall(text))
    known = QUOTA_CODES | CAPACITY_CODES | QUOTA_GROUP_CODES | RATE_LIMIT_CODES
    known = known | TRANSIENT_CODES | NOT_FOUND_CODES | AUTH_CODES
    codes.extend(c for c in _CODE_ANYWHERE.findall(text) if c in known)
    return list(dict.fromkeys(codes))


def _exception_text(exc: BaseException) -> str:
    if isinstance(exc, BaseHTTPError):
        return str(exc.message)
    if isinstance(exc, LibcloudError):
        return str(exc.value)
    return str(exc)


def _http_status(exc: BaseException) -> int | None:
    if isinstance(exc, BaseHTTPError) and isinstance(exc.code, int):
        return exc.code
    if isinstance(exc, ProviderError) and isinstance(exc.http_code, int):
        return exc.http_code
    return None


def _retry_after_seconds(exc: BaseException) -> float | None:
    if isinstance(exc, RateLimitReachedError) and exc.retry_after:
        return float(exc.retry_after)
    headers = getattr(exc, "headers", None)
    if isinstance(headers, dict):
        value = headers.get("retry-after") or headers.get("Retry-After")
        if value is not None:
            try:
                return max(0.0, float(value))
            except ValueError:
                return None
    return None


def classify(
    exc: BaseException,
    *,
    operation: str,
    now: datetime,
    instance_type: str | None = None,
    quota_group: str | None = None,
    redact: Redactor | None = None,
) -> CloudError:
    """Map an exception raised by a libcloud driver call to a typed `CloudError`.

    Provider codes win over HTTP status codes (EC2 answers RequestLimitExceeded with 503
    and InsufficientInstanceCapacity with 500). Exceptions that are not from libcloud,
    the network or the OS are programming errors and classified as permanent.
    """
    if isinstance(exc, CloudError):
        return exc
    scrub = redact or Redactor()
    codes = provider_codes(exc)
    status = _http_status(exc)
    message = scrub(_exception_text(exc).strip().replace("\n", "; ")) or type(exc).__name__
    if len(message) > _MAX_MESSAGE:
        message = message[:_MAX_MESSAGE] + " ..."
    common: dict[str, object] = {
        "operation": operation,
        "observed_at": now,
        "http_status": status,
        "instance_type": instance_type,
        "quota_group": quota_group,
    }

    def make(cls: type[CloudError], code: str | None, **extra: object) -> CloudError:
        return cls(message, provider_code=code, **common, **extra)  # type: ignore[arg-type]

    def first(candidates: frozenset[str]) -> str | None:
        return next((c for c in codes if c in candidates), None)

    if code := first(QUOTA_GROUP_CODES):
        return make(QuotaGroupExceeded, code)
    if code := first(QUOTA_CODES):
        return make(QuotaExceeded, code)
    if code := first(CAPACITY_CODES):
        return make(CapacityUnavailable, code)
    retry_after = _retry_after_seconds(exc)
    retry_at = now + timedelta(seconds=retry_after) if retry_after else None
    if (
        (code := first(RATE_LIMIT_CODES))
        or status in (429, 503)
        or isinstance(exc, RateLimitReachedError)
    ):
        return make(RateLimited, code, retry_at=retry_at)
    if (code := first(AUTH_CODES)) or isinstance(exc, InvalidCredsError) or status in (401, 403):
        return make(CloudAuthError, code)
    if (code := first(NOT_FOUND_CODES)) or status == 404:
        return make(InstanceNotFound, code)
    if (code := first(TRANSIENT_CODES)) or (status is not None and status >= 500):
        return make(TransientCloudError, code)
    if isinstance(exc, (MalformedResponseError, TimeoutError, ConnectionError, socket.error)):
        return make(TransientCloudError, None)
    if _is_requests_network_error(exc):
        return make(TransientCloudError, None)
    return make(PermanentCloudError, codes[0] if codes and status else None)


def _is_requests_network_error(exc: BaseException) -> bool:
    # libcloud uses requests; its connection/timeouts errors are transient.
    try:
        import requests
    except ImportError:  # pragma: no cover - requests is a libcloud dependency
        return False
    return isinstance(exc, (requests.ConnectionError, requests.Timeout))
