"""The operator's user name, read from its credentials (the requestedBy of its intents)."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from nodewarden.kube.identity import username_of


def _jwt(claims: dict[str, str]) -> str:
    def part(data: dict[str, str]) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")

    return f"{part({'alg': 'RS256'})}.{part(claims)}.c2lnbmF0dXJl"


def test_a_service_account_token_names_the_service_account() -> None:
    token = _jwt({"sub": "system:serviceaccount:nodewarden:nodewarden", "iss": "k8s"})
    cfg = SimpleNamespace(api_key={"BearerToken": f"Bearer {token}"}, cert_file=None)
    assert username_of(cfg) == "system:serviceaccount:nodewarden:nodewarden"


def test_another_token_names_nobody_and_a_client_certificate_its_common_name(
    tmp_path: Path,
) -> None:
    oidc = _jwt({"sub": "alice", "iss": "https://idp.example"})
    assert username_of(SimpleNamespace(api_key={"authorization": oidc}, cert_file=None)) is None
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:masters"),
            x509.NameAttribute(NameOID.COMMON_NAME, "nodewarden-operator"),
        ]
    )
    now = datetime.now(tz=UTC)
    cert = x509.CertificateBuilder(
        name, name, key.public_key(), x509.random_serial_number(), now, now + timedelta(days=1)
    ).sign(key, hashes.SHA256())
    path = tmp_path / "client.crt"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    assert username_of(SimpleNamespace(api_key={}, cert_file=str(path))) == "nodewarden-operator"
