"""Per-instance secrets derived from the operator's SSH key, so they survive a restart.

A new instance's init script carries a secret the node must later prove before its SSH
host key is trusted on first use. Deriving it as HMAC(master, node name) -- master taken
from the operator's SSH private key -- means a restarted operator can recompute it for
instances it created before the restart, without storing secrets anywhere. The cloud tag
holds only the secret's sha256.
"""

from __future__ import annotations

import hashlib
import hmac

from pydantic import SecretBytes, SecretStr

from nodewarden.ssh.credentials import SshClientKey

_CONTEXT = b"nodewarden instance secret v1"


def master_secret(client_key: SshClientKey) -> SecretBytes:
    """A 32-byte master secret derived from the operator's SSH private key.

    From the key's PKCS#8 DER form, which is the same at every export: the OpenSSH form
    carries a random check number, so a secret derived from it differed at every start
    and a restarted operator could never recompute the secrets of its instances."""
    private = client_key.asyncssh_key.export_private_key("pkcs8-der")
    return SecretBytes(hmac.new(private, _CONTEXT, hashlib.sha256).digest())


def instance_secret(master: SecretBytes, node_name: str) -> SecretStr:
    """The secret for one node: 64 lowercase hex digits."""
    digest = hmac.new(master.get_secret_value(), node_name.encode(), hashlib.sha256)
    return SecretStr(digest.hexdigest())
