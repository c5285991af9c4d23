"""Who this process is to the API server: the user name its credentials authenticate as.

The name is what the admission policy compares a PowerIntent's `spec.requestedBy` with
(docs/security.md, "The requester"), so the operator writes it into the intents it makes.
It is read from the credentials themselves, without a request: a ServiceAccount token's
subject (``system:serviceaccount:<namespace>:<name>``, the user name the API server gives
it), else the common name of the client certificate. A token of another kind (OIDC, a
static token) carries no name the operator can trust: set `requesters.operator_username`.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.x509.oid import NameOID

SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"


def username_of(configuration: Any) -> str | None:
    """The user name `configuration` (a kubernetes_asyncio Configuration) logs in as."""
    for value in (getattr(configuration, "api_key", None) or {}).values():
        if isinstance(value, str):
            subject = _service_account_subject(value.removeprefix("Bearer ").strip())
            if subject is not None:
                return subject
    cert_file = getattr(configuration, "cert_file", None)
    if cert_file:
        return _certificate_name(Path(cert_file))
    return None


def _service_account_subject(token: str) -> str | None:
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        payload = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except ValueError:
        return None
    subject = payload.get("sub") if isinstance(payload, dict) else None
    if isinstance(subject, str) and subject.startswith(SERVICE_ACCOUNT_PREFIX):
        return subject
    return None


def _certificate_name(path: Path) -> str | None:
    try:
        cert = x509.load_pem_x509_certificate(path.read_bytes())
    except (OSError, ValueError):
        return None
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if not names:
        return None
    value = names[0].value
    return value if isinstance(value, str) else value.decode()
