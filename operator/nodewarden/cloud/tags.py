"""The tag keys nodewarden writes on cloud instances (all under one configurable prefix)."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_TAG_PREFIX = "nodewarden-"


@dataclass(frozen=True)
class TagKeys:
    """Tag key names for one prefix. Several dispatchers share a cloud by their id value."""

    prefix: str = DEFAULT_TAG_PREFIX

    @property
    def dispatcher(self) -> str:
        """Id of the dispatcher that owns the instance (the list filter)."""
        return self.prefix + "dispatcher"

    @property
    def instance_type(self) -> str:
        """Catalogue name of the instance type it was created as."""
        return self.prefix + "instance-type"

    @property
    def node(self) -> str:
        """Name of the WorkerNode that represents it."""
        return self.prefix + "node"

    @property
    def idle_behavior(self) -> str:
        """run / hold / drain, so a restarted dispatcher keeps the behaviour."""
        return self.prefix + "idle-behavior"

    @property
    def secret_digest(self) -> str:
        """sha256 of the per-instance secret (never the secret itself)."""
        return self.prefix + "secret-sha256"

    @property
    def secret_nonce(self) -> str:
        """The per-instance nonce the secret is derived with (absent on instances created
        before nonces: they use the old derivation, see `dispatch.identity`)."""
        return self.prefix + "secret-nonce"

    @property
    def last_probe(self) -> str:
        """RFC 3339 time of the last successful probe (takeover of stale dispatchers)."""
        return self.prefix + "last-probe"

    def owns(self, key: str) -> bool:
        """Whether `key` is one of ours (replaced by `set_tags`)."""
        return key.startswith(self.prefix)
