"""The init script (cloud user data) given to new instances: SSH key + per-instance secret.

The script installs the operator's SSH public key for the login user and writes the
per-instance secret to `INSTANCE_SECRET_PATH` (mode 0600). The SSH prober asks the node
for that file before it trusts a host key learned on first use (see `nodewarden.ssh`);
the cloud tags carry only the secret's sha256 (`TagKeys.secret_digest`).

The rendered script is a `SecretStr` (it contains the secret) and is never logged.
`parse_init_script` reads the two values back; the stub cloud uses it to configure the
fake worker behind each VM exactly as a real node would be configured.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass

from pydantic import SecretStr

INSTANCE_SECRET_PATH = "/var/run/nodewarden-instance-secret"

_KEY_LINE = re.compile(
    r"^(ssh-[a-z0-9-]+|ecdsa-sha2-[a-z0-9-]+|sk-[a-z0-9@.-]+) [A-Za-z0-9+/=]+( [^\n'\"\\`$]*)?$"
)
_USER = re.compile(r"^[a-z_][a-z0-9_.-]*$")
_SECRET = re.compile(r"^[0-9a-f]{32,128}$")
_KEY_BLOCK = re.compile(r"<<'NODEWARDEN_SSH_KEY'\n(?P<key>[^\n]+)\nNODEWARDEN_SSH_KEY\n")
_SECRET_LINE = re.compile(
    r"printf '%s\\n' '(?P<secret>[0-9a-f]+)' > " + re.escape(INSTANCE_SECRET_PATH)
)
_USER_LINE = re.compile(r"^NODEWARDEN_USER='(?P<user>[^']+)'$", re.MULTILINE)


def new_instance_secret() -> SecretStr:
    """A fresh random per-instance secret (128 bits, hex)."""
    return SecretStr(secrets.token_hex(16))


def secret_digest(secret: SecretStr) -> str:
    """sha256 hex digest of a per-instance secret: safe to store in tags."""
    return hashlib.sha256(secret.get_secret_value().encode()).hexdigest()


def render_init_script(
    ssh_public_key: str, instance_secret: SecretStr, *, user: str = "root"
) -> SecretStr:
    """The POSIX shell init script for a new instance (cloud-init runs it as root)."""
    key = ssh_public_key.strip()
    if not _KEY_LINE.match(key):
        raise ValueError("ssh_public_key must be one OpenSSH public key line")
    if not _USER.match(user):
        raise ValueError(f"invalid login user {user!r}")
    secret = instance_secret.get_secret_value()
    if not _SECRET.match(secret):
        raise ValueError("instance secret must be 32-128 lowercase hex digits")
    script = (
        "#!/bin/sh\n"
        "# nodewarden: authorise the operator's SSH key and record the instance secret.\n"
        "set -eu\n"
        "umask 077\n"
        f"NODEWARDEN_USER='{user}'\n"
        'home=$(getent passwd "$NODEWARDEN_USER" | cut -d: -f6)\n'
        'mkdir -p "$home/.ssh"\n'
        "cat >> \"$home/.ssh/authorized_keys\" <<'NODEWARDEN_SSH_KEY'\n"
        f"{key}\n"
        "NODEWARDEN_SSH_KEY\n"
        'chown -R "$NODEWARDEN_USER" "$home/.ssh"\n'
        f"printf '%s\\n' '{secret}' > {INSTANCE_SECRET_PATH}\n"
    )
    return SecretStr(script)


@dataclass(frozen=True)
class InitScriptContents:
    """What `render_init_script` put into a script."""

    ssh_public_key: str
    instance_secret: SecretStr
    user: str


def parse_init_script(user_data: str) -> InitScriptContents | None:
    """Read back the key, secret and user of a script made by `render_init_script`."""
    key = _KEY_BLOCK.search(user_data)
    secret = _SECRET_LINE.search(user_data)
    user = _USER_LINE.search(user_data)
    if key is None or secret is None or user is None:
        return None
    return InitScriptContents(
        ssh_public_key=key.group("key"),
        instance_secret=SecretStr(secret.group("secret")),
        user=user.group("user"),
    )
