"""Typed errors of the SSH adapter.

Every error names the node and the endpoint, says what happened in operator language, and
never carries command output that could hold a secret, key material or an instance
secret. ``probe_result`` maps an error onto WorkerNode ``status.lastProbe.result``.
"""

from __future__ import annotations

from typing import ClassVar, Literal

ProbeResult = Literal["Failed", "Unreachable", "HostKeyMismatch"]


class SshError(Exception):
    """Base of all SSH adapter errors."""

    probe_result: ClassVar[ProbeResult] = "Failed"
    connection_level: ClassVar[bool] = False
    """True when the connection is unusable afterwards (the prober drops it)."""

    def __init__(self, node: str, endpoint: str, message: str) -> None:
        super().__init__(f"node {node} ({endpoint}): {message}")
        self.node = node
        self.endpoint = endpoint
        self.detail = message


class InvalidArgument(SshError, ValueError):
    """A caller-supplied value (uuid, interface, signal) is not allowed on a command line."""


class InvalidClientKey(ValueError):
    """The SSH private key could not be loaded (the key text is never echoed)."""


class HostNotAllowed(SshError):
    """The address resolver refused this host: it is not configured (e.g. not loopback in tests)."""

    probe_result = "Unreachable"


class Unreachable(SshError):
    """TCP connection refused, no route, or the name does not resolve."""

    probe_result = "Unreachable"
    connection_level = True


class ConnectTimeout(SshError):
    """The TCP connection was not established within the connect timeout."""

    probe_result = "Unreachable"
    connection_level = True


class LoginTimeout(ConnectTimeout):
    """TCP connected, but the SSH handshake and login did not finish in time (hung sshd)."""


class ConnectionFailed(SshError):
    """The SSH handshake failed or the connection dropped while connecting."""

    probe_result = "Unreachable"
    connection_level = True


class HostKeyError(SshError):
    """The node's host key is not trusted; nothing was run on it."""

    probe_result = "HostKeyMismatch"
    connection_level = True


class HostKeyMismatch(HostKeyError):
    """The node presented a host key that is not among the trusted keys."""

    def __init__(
        self,
        node: str,
        endpoint: str,
        presented: str | None,
        trusted: tuple[str, ...],
        reason: str | None = None,
    ) -> None:
        shown = presented or "a key of an untrusted algorithm"
        expected = ", ".join(trusted) if trusted else "none"
        message = reason or (
            f"host key mismatch: the server presented {shown}, which is not among the "
            f"trusted key(s) [{expected}]; connection refused, no command was run. If the "
            "node was legitimately reinstalled, update its known_hosts Secret."
        )
        super().__init__(node, endpoint, message)
        self.presented = presented
        self.trusted = trusted


class HostKeyUnknown(HostKeyError):
    """The known_hosts text has no entry for this host (a configuration error)."""


class InstanceSecretNotProven(HostKeyError):
    """Trust on first use refused: the node did not prove its per-instance secret."""


class AuthFailed(SshError):
    """The node refused our client key."""

    connection_level = True


class SessionRefused(SshError):
    """The connection is fine but the node refused another session (channel) on it."""


class CommandTimeout(SshError):
    """A command did not finish within the command timeout; the connection is dropped."""

    connection_level = True


class ConnectionLost(SshError):
    """The connection dropped while a command was running."""

    probe_result = "Unreachable"
    connection_level = True


class CommandFailed(SshError):
    """A command that must succeed exited non-zero (stderr is not included)."""

    def __init__(
        self, node: str, endpoint: str, purpose: str, exit_status: int | None, hint: str = ""
    ) -> None:
        status = "no exit status" if exit_status is None else f"exit status {exit_status}"
        suffix = f": {hint}" if hint else ""
        super().__init__(node, endpoint, f"{purpose} command failed with {status}{suffix}")
        self.purpose = purpose
        self.exit_status = exit_status


class NotSent(SshError):
    """The command was not sent: this replica's leadership is not valid (`nodewarden.fence`)."""


class FenceRejected(CommandFailed):
    """The runner refused the command: it has seen a newer fencing token of this
    dispatcher (exit status `RUNNER_FENCED`), so a newer leader has acted on the node."""


class BadOutput(SshError):
    """A command answered, but not in the form the node contract requires."""


class InhibitorsUnknown(SshError):
    """Neither busctl nor systemd-inhibit listed the inhibitors: they are unknown, not none."""


class WakeOnLanUnknown(SshError):
    """ethtool could not read the Wake-on-LAN settings (usually missing CAP_NET_ADMIN)."""
