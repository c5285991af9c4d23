"""Per-instance secrets derived from the operator's SSH key, so they survive a restart.

A new instance's init script carries a secret the node must later prove before its SSH
host key is trusted on first use. Deriving it as HMAC(master, node name + nonce) -- master
taken from the operator's SSH private key, the nonce random per instance and kept in the
instance's tag ``<prefix>secret-nonce`` -- means a restarted operator can recompute it for
instances it created before the restart without storing secrets anywhere, and a node
re-created under the same name (a declared VM) gets a secret of its own. The cloud tags
hold only the nonce (not secret without the master) and the secret's sha256.

Instances created before the nonce existed (no nonce tag) were given HMAC(master, node
name); they are still proven with that derivation, so an upgrade neither loses nor
destroys them.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

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


def new_nonce() -> str:
    """A fresh per-instance nonce: 32 lowercase hex digits (a tag value anywhere)."""
    return secrets.token_hex(16)


def instance_secret(master: SecretBytes, node_name: str, nonce: str | None = None) -> SecretStr:
    """The secret for one instance: 64 lowercase hex digits. `nonce` None: the derivation
    of instances created before nonces (node name only)."""
    message = node_name if nonce is None else f"{node_name}\0{nonce}"
    digest = hmac.new(master.get_secret_value(), message.encode(), hashlib.sha256)
    return SecretStr(digest.hexdigest())
