"""Credentials: which Secrets a WorkerNode may name, and where their values may be sent.

- `admission`   -- pure: endpoint allow-lists (host patterns, CIDRs, ports; no DNS).
- `settings`    -- `CredentialsConfig`: the operator configuration's `credentials` section.
- `designation` -- pure: the Secret label that designates a Secret for a use; the
  operator's own (reserved) Secrets; refusal messages that are no oracle.
- `resolver`    -- `CredentialResolver`: WorkerNode + use -> credentials + admitted
  endpoint, or a `Refusal`. The only way any adapter (Redfish, SSH, Wake-on-LAN)
  obtains a credential. Threat model: docs/security.md.
"""

from nodewarden.credentials.admission import AdmissionList, Endpoint, EndpointRule, InvalidRule
from nodewarden.credentials.designation import LABEL, Purpose, SecretRef, secret_refs
from nodewarden.credentials.resolver import (
    BmcCredentials,
    CredentialResolver,
    Refusal,
    SshCredentials,
    WolCredentials,
)

__all__ = [
    "LABEL",
    "AdmissionList",
    "BmcCredentials",
    "CredentialResolver",
    "Endpoint",
    "EndpointRule",
    "InvalidRule",
    "Purpose",
    "Refusal",
    "SecretRef",
    "SshCredentials",
    "WolCredentials",
    "secret_refs",
]
