"""The stub cloud's HTTP wire protocol, shared by its server and its libcloud client (pure).

Owns: the API paths, request signing (HMAC-SHA256 over a canonical request, so the
secret never travels), the error body shape and the JSON form of a VM. Nothing here
does I/O.

API (JSON bodies; every call signed, see `authorization_header`):

| method | path                                  | body / query                          | answer |
|--------|---------------------------------------|---------------------------------------|--------|
| GET    | /v1/instances                         | query: `tag:KEY=V` (repeatable), `tag-key=K` (repeatable) | `{"instances": [vm...]}` |
| POST   | /v1/instances                         | `{name, size, image, user_data, tags, spot}` | 201 `{"instance": vm}` |
| POST   | /v1/instances/{id}/tags               | `{"tags": {K: V}}`                    | `{}` |
| DELETE | /v1/instances/{id}/tags               | query: `key=K` (repeatable)           | `{}` |
| DELETE | /v1/instances/{id}                    |                                       | `{}` |
| GET    | /v1/instance-types                    |                                       | `{"instance_types": [...]}` |
| GET    | /v1/endpoints                         |                                       | `{"endpoints": {address: port}}` |

Errors: the HTTP status of the in-process stub's error (400, 401, 429, 500, 503) with
`{"error": {"code": "InstanceLimitExceeded" | null, "message": "..."}}` and, for rate
limits, a `Retry-After` header. The client turns that back into the libcloud exception
the in-process stub raises (`"Code: message"` text), so classification is identical.

Authorization header::

    NWSTUB1-HMAC-SHA256 Credential=<key>, Timestamp=<unix seconds>, Signature=<hex>

Signature = HMAC-SHA256(secret, "NWSTUB1\\n<key>\\n<METHOD>\\n<path>\\n<canonical query>\\n
<timestamp>\\n<sha256 hex of body>"); a timestamp more than `MAX_CLOCK_SKEW` seconds
away from the server's clock is refused.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import quote, urlsplit

from nodewarden.ssh.addressing import is_loopback
from nodewarden_doubles.stubcloud.cloud import StubVMView

SCHEME = "NWSTUB1-HMAC-SHA256"
MAX_CLOCK_SKEW = 300.0

INSTANCES = "/v1/instances"
INSTANCE_TYPES = "/v1/instance-types"
ENDPOINTS = "/v1/endpoints"

AUTH_FAILURE_CODE = "AuthFailure"
AUTH_FAILURE_MESSAGE = "AWS was not able to validate the provided access credentials"

_CODE_AND_MESSAGE = re.compile(r"^([A-Za-z][A-Za-z0-9_.]*): (.*)$", re.DOTALL)
_HEADER = re.compile(
    rf"^{SCHEME} Credential=(?P<key>[^,\s]*), Timestamp=(?P<ts>[0-9]+), "
    r"Signature=(?P<sig>[0-9a-f]{64})$"
)


def instance_path(instance_id: str) -> str:
    return f"{INSTANCES}/{quote(instance_id, safe='')}"


def tags_path(instance_id: str) -> str:
    return f"{instance_path(instance_id)}/tags"


# ---- URLs ---------------------------------------------------------------------------------


def is_stub_url(value: object) -> bool:
    """Whether a driver `cloud` parameter names a remote stub (a URL) rather than a name."""
    return isinstance(value, str) and "://" in value


def loopback_base_url(url: str) -> tuple[str, int]:
    """(host, port) of a stub cloud URL; ValueError unless it is http://<loopback>:<port>."""
    parts = urlsplit(url)
    if parts.scheme != "http":
        raise ValueError(f"stub cloud URL must use http://, got {parts.scheme or 'none'}://")
    host = parts.hostname or ""
    if not is_loopback(host):
        raise ValueError(f"stub cloud URL must point at a loopback address, not {host!r}")
    if parts.port is None:
        raise ValueError("stub cloud URL must name a port")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        raise ValueError("stub cloud URL must be http://HOST:PORT with nothing else")
    return host, parts.port


# ---- signing ------------------------------------------------------------------------------


def canonical_query(pairs: Iterable[tuple[str, str]]) -> str:
    """Sorted, RFC 3986-encoded `k=v&...` of decoded query pairs."""

    def enc(text: str) -> str:
        return quote(text, safe="-_.~")

    return "&".join(f"{enc(k)}={enc(v)}" for k, v in sorted(pairs))


def query_pairs(params: Mapping[str, object]) -> list[tuple[str, str]]:
    """libcloud-style params (value or list of values) as (key, value) pairs."""
    out: list[tuple[str, str]] = []
    for key, value in params.items():
        if isinstance(value, list | tuple):
            out.extend((str(key), str(v)) for v in value)
        else:
            out.append((str(key), str(value)))
    return out


def signature(
    secret: str,
    key: str,
    method: str,
    path: str,
    query: Iterable[tuple[str, str]],
    timestamp: int,
    body: bytes,
) -> str:
    string_to_sign = "\n".join(
        [
            "NWSTUB1",
            key,
            method.upper(),
            path,
            canonical_query(query),
            str(timestamp),
            hashlib.sha256(body).hexdigest(),
        ]
    )
    return hmac.new(secret.encode(), string_to_sign.encode(), hashlib.sha256).hexdigest()


def authorization_header(
    key: str,
    secret: str | None,
    method: str,
    path: str,
    query: Iterable[tuple[str, str]],
    timestamp: int,
    body: bytes,
) -> str:
    sig = signature(secret or "", key, method, path, query, timestamp, body)
    return f"{SCHEME} Credential={key}, Timestamp={timestamp}, Signature={sig}"


@dataclass(frozen=True)
class SignedRequest:
    """What the server read from an Authorization header (no judgement yet)."""

    key: str
    timestamp: int
    signature: str


def parse_authorization(header: str | None) -> SignedRequest | None:
    if not header:
        return None
    match = _HEADER.match(header.strip())
    if match is None:
        return None
    return SignedRequest(match["key"], int(match["ts"]), match["sig"])


def verify(
    signed: SignedRequest | None,
    credentials: tuple[str, str | None],
    *,
    method: str,
    path: str,
    query: Iterable[tuple[str, str]],
    body: bytes,
    now: float,
) -> bool:
    """Whether a request was signed with `credentials` within the allowed clock skew."""
    if signed is None:
        return False
    want_key, want_secret = credentials
    key_ok = hmac.compare_digest(signed.key.encode(), want_key.encode())
    expected = signature(want_secret or "", want_key, method, path, query, signed.timestamp, body)
    sig_ok = hmac.compare_digest(signed.signature.encode(), expected.encode())
    fresh = abs(now - signed.timestamp) <= MAX_CLOCK_SKEW
    return key_ok and sig_ok and fresh


# ---- errors -------------------------------------------------------------------------------


def error_body(message: str) -> dict[str, Any]:
    """`{"error": {"code", "message"}}` from libcloud-style "Code: message" text."""
    match = _CODE_AND_MESSAGE.match(message)
    if match is not None:
        return {"error": {"code": match[1], "message": match[2]}}
    return {"error": {"code": None, "message": message}}


def error_text(body: object) -> str | None:
    """The libcloud-style "Code: message" text of an error body, None if not one."""
    if not isinstance(body, dict):
        return None
    error = body.get("error")
    if not isinstance(error, dict):
        return None
    message = str(error.get("message") or "")
    code = error.get("code")
    return f"{code}: {message}" if isinstance(code, str) and code else message


# ---- VMs ----------------------------------------------------------------------------------


def vm_to_json(vm: StubVMView) -> dict[str, Any]:
    """A VM as the API reports it (no port, no faults: those are admin-only)."""
    return {
        "id": vm.id,
        "name": vm.name,
        "size": vm.size,
        "image": vm.image,
        "tags": dict(vm.tags),
        "private_ip": vm.private_ip,
        "created_at": vm.created_at.isoformat(),
        "state": vm.state,
        "price": vm.price,
    }


def vm_from_json(data: Mapping[str, Any]) -> StubVMView:
    """The client side of `vm_to_json` (admin-only fields left empty)."""
    price = data.get("price")
    return StubVMView(
        id=str(data["id"]),
        name=str(data["name"]),
        size=str(data["size"]),
        image=str(data["image"]),
        tags={str(k): str(v) for k, v in dict(data.get("tags") or {}).items()},
        private_ip=str(data["private_ip"]),
        created_at=datetime.fromisoformat(str(data["created_at"])),
        state=str(data["state"]),
        price=float(price) if price is not None else None,
        port=None,
        broken=False,
        hung=False,
    )
