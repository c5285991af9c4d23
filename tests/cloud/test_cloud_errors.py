"""Classification of libcloud exceptions into typed cloud errors (pure).

The exceptions are built the way libcloud builds them: `exception_from_message` for HTTP
errors (what `Response.__init__` raises, with EC2's "Code: message" text from
`EC2Response.parse_error`), `InvalidCredsError`, `MalformedResponseError`, socket errors.
The same classification is exercised end to end against the stub cloud and moto in
test_cloud_stub.py and test_cloud_ec2_moto.py.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from libcloud.common.exceptions import exception_from_message
from libcloud.common.types import InvalidCredsError, MalformedResponseError

from nodewarden.cloud.errors import (
    CapacityUnavailable,
    CloudAuthError,
    CloudErrorKind,
    InstanceNotFound,
    PermanentCloudError,
    QuotaExceeded,
    QuotaGroupExceeded,
    RateLimited,
    Redactor,
    TransientCloudError,
    classify,
)

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def http(code: int, message: str, headers: dict[str, str] | None = None) -> Exception:
    error: Exception = exception_from_message(  # type: ignore[no-untyped-call]
        code=code, message=message, headers=headers
    )
    return error


@pytest.mark.parametrize(
    ("exc", "cls", "code"),
    [
        (
            http(400, "InstanceLimitExceeded: Your quota allows for 0 more running instance(s)."),
            QuotaExceeded,
            "InstanceLimitExceeded",
        ),
        (
            http(500, "InsufficientInstanceCapacity: We currently do not have sufficient capacity"),
            CapacityUnavailable,
            "InsufficientInstanceCapacity",
        ),
        (
            http(400, "Unsupported: The requested configuration is currently not supported."),
            CapacityUnavailable,
            "Unsupported",
        ),
        (
            http(400, "VcpuLimitExceeded: You have requested more vCPU capacity than allowed"),
            QuotaGroupExceeded,
            "VcpuLimitExceeded",
        ),
        (
            http(503, "RequestLimitExceeded: Request limit exceeded."),
            RateLimited,
            "RequestLimitExceeded",
        ),
        (http(400, "Throttling: Rate exceeded"), RateLimited, "Throttling"),
        (http(500, "InternalError: An internal error has occurred"), TransientCloudError, None),
        (http(502, "<html>Bad Gateway</html>"), TransientCloudError, None),
        (
            http(400, "InvalidInstanceID.NotFound: The instance ID 'i-1' does not exist"),
            InstanceNotFound,
            "InvalidInstanceID.NotFound",
        ),
        (http(400, "InvalidAMIID.Malformed: Invalid id"), PermanentCloudError, None),
        (InvalidCredsError("AuthFailure: not able to validate"), CloudAuthError, "AuthFailure"),
        (http(401, "Unauthorized"), CloudAuthError, None),
        (MalformedResponseError("Failed to parse XML", body="<html>"), TransientCloudError, None),
        (ConnectionResetError(104, "Connection reset by peer"), TransientCloudError, None),
        (TimeoutError("timed out"), TransientCloudError, None),
        (TypeError("unexpected keyword"), PermanentCloudError, None),
    ],
)
def test_classification(exc: Exception, cls: type, code: str | None) -> None:
    err = classify(exc, operation="create", now=NOW, instance_type="m5.large")
    assert type(err) is cls
    if code is not None:
        assert err.provider_code == code
    assert err.operation == "create"
    assert err.observed_at == NOW
    assert err.instance_type == "m5.large"
    assert err.kind.value in str(err)


def test_provider_code_wins_over_http_status() -> None:
    # EC2 answers InsufficientInstanceCapacity with 500, which alone would be transient.
    err = classify(http(500, "InsufficientInstanceCapacity: none left"), operation="c", now=NOW)
    assert err.kind is CloudErrorKind.CAPACITY
    assert err.http_status == 500


def test_rate_limit_429_with_retry_after_seconds() -> None:
    err = classify(http(429, "Too Many Requests", {"retry-after": "7"}), operation="l", now=NOW)
    assert isinstance(err, RateLimited)
    assert err.retry_at == NOW + timedelta(seconds=7)


def test_rate_limit_503_with_retry_after_http_date() -> None:
    # libcloud turns an HTTP-date Retry-After into seconds relative to the wall clock.
    when = datetime.now(tz=UTC) + timedelta(seconds=120)
    header = when.strftime("%a, %d %b %Y %H:%M:%S GMT")
    err = classify(http(503, "Slow Down", {"retry-after": header}), operation="l", now=NOW)
    assert isinstance(err, RateLimited)
    assert err.retry_at is not None
    assert timedelta(seconds=100) <= err.retry_at - NOW <= timedelta(seconds=121)


def test_rate_limit_without_retry_after_has_no_retry_time() -> None:
    err = classify(http(503, "RequestLimitExceeded: slow down"), operation="l", now=NOW)
    assert isinstance(err, RateLimited)
    assert err.retry_at is None


def test_secrets_are_redacted_from_messages() -> None:
    exc = InvalidCredsError("AuthFailure: key AKIAEXAMPLEKEY123 with secret s3cr3t-value rejected")
    err = classify(
        exc,
        operation="list",
        now=NOW,
        redact=Redactor(["AKIAEXAMPLEKEY123", "s3cr3t-value"]),
    )
    assert "AKIAEXAMPLEKEY123" not in str(err) and "s3cr3t-value" not in str(err)
    assert "AKIAEXAMPLEKEY123" not in repr(err)
    assert "***" in str(err)
