"""HTTP plumbing of the Redfish adapter on aiohttp: TLS context, timeouts, replies, errors.

One `RedfishTransport` talks to one BMC origin. It verifies the BMC's certificate
(against the configured CA bundle or the system store), applies connect/request
timeouts, follows redirects only within the same origin, and turns aiohttp failures
into the adapter's typed errors. A reply body is read whole, however many TCP writes or
chunks it comes in, up to MAX_BODY_BYTES (larger: RedfishProtocolError); the request
timeout covers the body too, so a body that stalls half-way is a RedfishTimeout.
Replies come back as `HttpReply` for every status; mapping statuses to errors is
`error_for_status`'s job. Header values are never logged, and any BMC text quoted in an
error is scrubbed of the secrets the caller names.
"""

from __future__ import annotations

import functools
import json
import logging
import ssl
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, Protocol
from urllib.parse import urljoin, urlsplit

import aiohttp
from pydantic import SecretStr

from nodewarden.redfish.config import RedfishEndpointConfig
from nodewarden.redfish.errors import (
    AuthFailed,
    Conflict409,
    NotFound,
    RedfishConnectionError,
    RedfishError,
    RedfishHttpError,
    RedfishProtocolError,
    RedfishTimeout,
    TlsError,
    TlsProblem,
)

logger = logging.getLogger(__name__)

MAX_REDIRECTS = 3
MAX_BODY_BYTES = 4 * 1024 * 1024
_REDACTED = "<redacted>"

# OpenSSL X509 verify codes that mean "the issuing CA is not in the trust store".
_UNKNOWN_CA_CODES = frozenset({2, 18, 19, 20, 21, 27})
_EXPIRED_CODES = frozenset({9, 10})
_HOSTNAME_MISMATCH_CODES = frozenset({62, 64})


def redact(text: str, secrets: Iterable[str]) -> str:
    """`text` with every non-empty secret value replaced by a marker."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, _REDACTED)
    return text


IDLE_CONNECTION_SECONDS = 2.0
"""How long an idle connection to a BMC stays open: long enough for the requests of one
operation (login, read, action), shorter than the power poll interval. Each open TLS
connection holds asyncio's 256 KiB read buffer; with aiohttp's default (15 s, about the
poll interval) every BMC kept one or two open and still reconnected for most polls."""


@functools.lru_cache(maxsize=64)
def build_ssl_context(ca_bundle_pem: str | None) -> ssl.SSLContext:
    """A verifying client context: the given PEM CAs, or the system trust store.

    One context per distinct bundle, shared by every client that trusts it (building one
    costs tens of milliseconds -- the system store, some 40 ms -- and blocks the event
    loop: a thousand nodes behind one CA Secret must not build a thousand). Shared
    contexts are never modified after this returns.

    Raises ValueError when the PEM holds no usable certificate.
    """
    if ca_bundle_pem is None:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    else:
        # Trust exactly the given bundle: a BMC CA from a Secret, not the public web PKI.
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_verify_locations(cadata=ca_bundle_pem)
        except (ssl.SSLError, ValueError) as exc:
            raise ValueError(f"CA bundle is not usable PEM: {exc.__class__.__name__}") from None
    context.check_hostname = True
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def parse_retry_after(value: str | None, now: datetime) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or HTTP-date)."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - now).total_seconds())


@dataclass(frozen=True, slots=True)
class HttpReply:
    """One answer from the BMC, reduced to what the adapter uses (no raw headers)."""

    method: str
    path: str
    status: int
    body: Any
    location: str | None
    retry_after: float | None
    auth_token: SecretStr | None = field(repr=False)
    text_excerpt: str = field(repr=False)
    body_error: RedfishError | None = field(default=None, repr=False)
    """Only with `request(..., keep_broken_body=True)`: why the body did not arrive
    whole (timeout, connection lost, too large); status and headers are real, body None."""

    def json_object(self, endpoint: str) -> dict[str, Any]:
        """The body as a JSON object, or RedfishProtocolError."""
        if not isinstance(self.body, dict):
            raise RedfishProtocolError(
                endpoint, f"{self.method} {self.path} returned no JSON object (HTTP {self.status})"
            )
        return self.body


def error_details(reply: HttpReply) -> tuple[str, list[str]]:
    """The BMC's error message and MessageIds from a Redfish error body, if any."""
    body = reply.body
    message = ""
    ids: list[str] = []
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        error = body["error"]
        message = str(error.get("message") or "")
        infos = error.get("@Message.ExtendedInfo")
        if isinstance(infos, list):
            texts: list[str] = []
            for info in infos:
                if isinstance(info, dict):
                    if isinstance(info.get("MessageId"), str):
                        ids.append(info["MessageId"])
                    if isinstance(info.get("Message"), str):
                        texts.append(info["Message"])
            if texts:
                message = "; ".join([message, *texts]) if message else "; ".join(texts)
    elif not isinstance(body, dict | list) and reply.text_excerpt:
        message = reply.text_excerpt
    return message[:500], ids


def error_for_status(endpoint: str, reply: HttpReply, what: str) -> RedfishHttpError:
    """The typed error for a non-2xx reply; `what` says what the request was for."""
    bmc_message, ids = error_details(reply)
    said = f": {bmc_message}" if bmc_message else ""
    status = reply.status
    if status == 401:
        return AuthFailed(
            endpoint,
            f"{what}: the BMC rejected the credentials (HTTP 401){said}; "
            "check the BMC user name and password Secret",
            status,
            ids,
        )
    if status == 403:
        return AuthFailed(
            endpoint,
            f"{what}: the BMC user lacks the privilege for this (HTTP 403){said}",
            status,
            ids,
        )
    if status == 404:
        return NotFound(endpoint, f"{what}: {reply.path} not found (HTTP 404){said}", status, ids)
    if status == 409:
        return Conflict409(
            endpoint,
            f"{what}: the BMC refused a conflicting request (HTTP 409){said}; "
            "re-read the power state before retrying",
            status,
            ids,
        )
    return RedfishHttpError(
        endpoint,
        f"{what}: HTTP {status} from {reply.method} {reply.path}{said}",
        status,
        ids,
        reply.retry_after,
    )


class BmcTransport(Protocol):
    """What the client and its auth need from the wire to one BMC origin: the seam a
    hollow BMC (`nodewarden_doubles.hollow`) answers from an in-process model, with the
    client, its auth and everything above them unchanged. `RedfishTransport` is the real one."""

    endpoint: str

    def url(self, path: str) -> str: ...

    def same_origin(self, url: str) -> bool: ...

    async def request(
        self,
        method: str,
        path: str,
        *,
        headers: Mapping[str, str] | None = None,
        json_body: Mapping[str, Any] | None = None,
        time_limit: float | None = None,
        keep_broken_body: bool = False,
    ) -> HttpReply: ...

    async def close(self) -> None: ...


BmcTransportFactory = Callable[[RedfishEndpointConfig, str | None], BmcTransport]
"""(a BMC client's config, the User-Agent) -> the wire its requests go over."""


class RedfishTransport:
    """HTTPS requests to one BMC origin with verification, timeouts and typed errors."""

    def __init__(
        self,
        endpoint: str,
        *,
        ca_bundle_pem: str | None,
        connect_timeout: float,
        request_timeout: float,
        secrets: Callable[[], Iterable[str]],
        session: aiohttp.ClientSession | None = None,
        clock: Callable[[], datetime],
        user_agent: str | None = None,
    ) -> None:
        self.endpoint = endpoint
        self._user_agent = user_agent
        """Sent with every request (the replica's identity, for the BMC's audit log)."""
        self._secrets = secrets
        self._clock = clock
        try:
            self._ssl = build_ssl_context(ca_bundle_pem)
        except ValueError as exc:
            raise TlsError(endpoint, str(exc), "other") from None
        self._timeout = aiohttp.ClientTimeout(
            total=request_timeout, sock_connect=connect_timeout, connect=connect_timeout
        )
        self._request_timeout = request_timeout
        self._connect_timeout = connect_timeout
        self._session = session
        self._owns_session = session is None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    ssl=self._ssl, limit_per_host=4, keepalive_timeout=IDLE_CONNECTION_SECONDS
                ),
                timeout=self._timeout,
            )
            self._owns_session = True
        return self._session

    async def close(self) -> None:
        if self._owns_session and self._session is not None and not self._session.closed:
            await self._session.close()

    def url(self, path: str) -> str:
        """Absolute URL of a path or @odata.id on this origin."""
        return urljoin(self.endpoint + "/", path)

    def same_origin(self, url: str) -> bool:
        """Whether `url` is on the configured endpoint (the only place credentials go)."""
        mine, theirs = urlsplit(self.endpoint), urlsplit(url)
        return (mine.scheme, mine.hostname, mine.port or 443) == (
            theirs.scheme,
            theirs.hostname,
            theirs.port or 443,
        )

    async def request(
        self,
        method: str,
        path: str,
        *,
        headers: Mapping[str, str] | None = None,
        json_body: Mapping[str, Any] | None = None,
        time_limit: float | None = None,
        keep_broken_body: bool = False,
    ) -> HttpReply:
        """Send one request; every HTTP status comes back as a reply, failures as errors.

        `time_limit` replaces the request timeout for this request. A body that does not
        arrive whole raises, unless `keep_broken_body`: then the reply (status, headers)
        comes back with `body_error` set, for callers that must act on the headers (a
        session login whose session exists although its body broke off).
        """
        url = self.url(path)
        if not self.same_origin(url):
            raise RedfishProtocolError(
                self.endpoint,
                f"{method} {urlsplit(url).path}: link points to another origin; not followed "
                "(credentials are only sent to the configured endpoint)",
            )
        for _hop in range(MAX_REDIRECTS + 1):
            reply = await self._once(method, url, headers, json_body, time_limit)
            if reply.body_error is not None and not keep_broken_body:
                raise reply.body_error
            if reply.status in (301, 302, 303, 307, 308) and reply.location and method == "GET":
                target = urljoin(url, reply.location)
                if not self.same_origin(target):
                    raise RedfishProtocolError(
                        self.endpoint,
                        f"GET {path} redirects to another origin; not followed "
                        "(credentials are only sent to the configured endpoint)",
                    )
                url = target
                continue
            return reply
        raise RedfishProtocolError(self.endpoint, f"GET {path}: too many redirects")

    async def _once(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str] | None,
        json_body: Mapping[str, Any] | None,
        time_limit: float | None,
    ) -> HttpReply:
        path = urlsplit(url).path
        limit = self._request_timeout if time_limit is None else time_limit
        send_headers = {"Accept": "application/json", "OData-Version": "4.0"}
        if self._user_agent:
            send_headers["User-Agent"] = self._user_agent
        if headers:
            send_headers.update(headers)
        data: bytes | None = None
        if json_body is not None:
            data = json.dumps(json_body).encode()
            send_headers["Content-Type"] = "application/json"
        body_error: RedfishError | None = None
        try:
            async with self._client().request(
                method,
                url,
                headers=send_headers,
                data=data,
                allow_redirects=False,
                ssl=self._ssl,
                timeout=aiohttp.ClientTimeout(
                    total=limit, sock_connect=self._connect_timeout, connect=self._connect_timeout
                ),
            ) as response:
                status = response.status
                location = response.headers.get("Location")
                retry_after = parse_retry_after(response.headers.get("Retry-After"), self._clock())
                token = response.headers.get("X-Auth-Token")
                content_type = response.headers.get("Content-Type", "")
                try:
                    raw = await _read_whole(response.content, method, path, self.endpoint)
                except (TimeoutError, aiohttp.ClientError, OSError, RedfishProtocolError) as exc:
                    body_error = (
                        exc
                        if isinstance(exc, RedfishProtocolError)
                        else self._failure(exc, method, path, limit, in_body=True)
                    )
                    raw = b""
                    response.close()  # drop the connection: the rest may still arrive
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise self._failure(exc, method, path, limit) from None

        body: Any = None
        text = ""
        if raw:
            text = raw.decode("utf-8", errors="replace")
            if "json" in content_type or text.lstrip().startswith(("{", "[")):
                try:
                    body = json.loads(text)
                except ValueError:
                    body = None
        secrets = list(self._secrets())
        if token:
            secrets.append(token)
        excerpt = redact(text[:300], secrets)
        if isinstance(body, dict | list):
            body = _redact_json(body, secrets)
        logger.debug(
            "redfish %s %s -> %s",
            method,
            path,
            status,
            extra={"redfish_endpoint": self.endpoint, "http_status": status},
        )
        return HttpReply(
            method=method,
            path=path,
            status=status,
            body=body,
            location=location,
            retry_after=retry_after,
            auth_token=SecretStr(token) if token else None,
            text_excerpt=excerpt,
            body_error=body_error,
        )

    def _failure(
        self, exc: BaseException, method: str, path: str, limit: float, *, in_body: bool = False
    ) -> RedfishError:
        """The typed error for an aiohttp/OS failure, before or while reading the body."""
        if isinstance(exc, aiohttp.ClientConnectorCertificateError):
            return self._tls_error(exc.certificate_error)
        if isinstance(exc, aiohttp.ClientSSLError):
            return TlsError(
                self.endpoint,
                f"TLS handshake with the BMC failed ({exc.__class__.__name__})",
                "handshake",
            )
        if isinstance(exc, TimeoutError):
            part = " (reply body stalled)" if in_body else ""
            return RedfishTimeout(
                self.endpoint, f"{method} {path} timed out after {limit:g}s{part}", limit
            )
        if isinstance(exc, aiohttp.ClientConnectorError):
            return RedfishConnectionError(
                self.endpoint,
                f"cannot connect to the BMC ({exc.os_error.__class__.__name__}: "
                f"{exc.os_error.strerror or 'connection failed'})",
            )
        what = "the reply body broke off" if in_body else "failed"
        return RedfishConnectionError(
            self.endpoint, f"{method} {path}: {what} ({exc.__class__.__name__})"
        )

    def _tls_error(self, cert_error: Exception) -> TlsError:
        code = getattr(cert_error, "verify_code", None)
        reason = getattr(cert_error, "verify_message", None) or str(cert_error)
        problem: TlsProblem
        if code in _UNKNOWN_CA_CODES:
            problem = "unknown_ca"
            message = (
                f"TLS certificate of the BMC is signed by an unknown CA ({reason}); "
                "put the CA that signed it in the BMC's CA bundle Secret"
            )
        elif code in _HOSTNAME_MISMATCH_CODES:
            problem = "hostname_mismatch"
            message = f"TLS certificate of the BMC does not match its address ({reason})"
        elif code in _EXPIRED_CODES:
            problem = "expired"
            message = f"TLS certificate of the BMC is expired or not yet valid ({reason})"
        else:
            problem = "other"
            message = f"TLS certificate of the BMC was rejected ({reason})"
        return TlsError(self.endpoint, message, problem)


async def _read_whole(
    content: aiohttp.StreamReader, method: str, path: str, endpoint: str
) -> bytes:
    """The whole body, however many writes or chunks it arrives in, up to MAX_BODY_BYTES.

    `StreamReader.read(n)` returns what has arrived so far, so one call can hold only
    the first TCP segment or chunk of a body.
    """
    cap = MAX_BODY_BYTES
    parts: list[bytes] = []
    size = 0
    while chunk := await content.read(cap + 1 - size):
        parts.append(chunk)
        size += len(chunk)
        if size > cap:
            raise RedfishProtocolError(
                endpoint, f"{method} {path}: reply body larger than {cap} bytes; not read"
            )
    return b"".join(parts)


def _redact_json(value: Any, secrets: list[str]) -> Any:
    if isinstance(value, str):
        return redact(value, secrets)
    if isinstance(value, list):
        return [_redact_json(item, secrets) for item in value]
    if isinstance(value, dict):
        return {key: _redact_json(item, secrets) for key, item in value.items()}
    return value


__all__ = [
    "HttpReply",
    "RedfishTransport",
    "build_ssl_context",
    "error_for_status",
    "parse_retry_after",
    "redact",
]
