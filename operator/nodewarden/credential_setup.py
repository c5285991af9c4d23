"""Building the credential resolver at start-up: the operator's own SSH key, the allow-lists.

The operator's SSH private key (`dispatch.ssh_private_key_secret`) is read here, once:
an administrator named it in the operator configuration, so it is designated by that,
and it is reserved (no WorkerNode can name it). Cloud credentials and the status-API
token are read where they are used, from the configuration, and are reserved too.
"""

from __future__ import annotations

from nodewarden.config import ConfigError, OperatorConfig
from nodewarden.credentials.resolver import CredentialResolver
from nodewarden.kube.client import Kube, KubeError
from nodewarden.ssh.credentials import SshClientKey
from nodewarden.ssh.errors import InvalidClientKey


async def build_resolver(config: OperatorConfig, kube: Kube, namespace: str) -> CredentialResolver:
    """The resolver for `namespace`; ConfigError names a missing or unreadable key Secret."""
    operator_key: SshClientKey | None = None
    ref = config.dispatch.ssh_private_key_secret
    if ref is not None:
        try:
            raw = await kube.read_secret(namespace, ref.name, ref.key)
        except KubeError as exc:
            raise ConfigError(
                f"dispatch.ssh_private_key_secret: {exc}; create the Secret or fix the reference"
            ) from exc
        try:
            operator_key = SshClientKey(raw)
        except InvalidClientKey as exc:
            raise ConfigError(f"dispatch.ssh_private_key_secret: {exc}") from exc
    return CredentialResolver(
        kube,
        namespace,
        config.credentials,
        reserved=config.reserved_secrets,
        operator_key=operator_key,
    )
