"""Dialing one node: TCP connect, SSH handshake and login, and the host-key trust decision.

`Dialer.open` does steps 2-3 of the connection life cycle (see `nodewarden.ssh.prober`):
TCP connect within ``connect_timeout``; handshake and public-key login within
``login_timeout`` against the trusted keys (known_hosts text, or a key pinned by an earlier
trust-on-first-use); under `InstanceSecretTrust` with no pinned key, the presented key is
held provisionally and the only command run is the instance-secret proof — on success the
key is pinned on the `NodeLink` and reported as `LearnedHostKey`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import socket
from collections.abc import Callable
from datetime import datetime

import asyncssh

import nodewarden.ssh.errors as errors
from nodewarden.ssh.addressing import Endpoint
from nodewarden.ssh.credentials import InstanceSecretTrust, KnownHostKeys, SshTarget, TrustedKeys
from nodewarden.ssh.facts import LearnedHostKey
from nodewarden.ssh.link import LOGGER_NAME, HostKeyRecorder, NodeLink, ProberStats, text
from nodewarden.ssh.settings import ProbeSettings

logger = logging.getLogger(LOGGER_NAME)


class _HostKeyGate(asyncssh.SSHClient):
    """Sees every host key asyncssh could not match against the trusted keys.

    Returns True (provisional trust) only in trust-on-first-use mode, where the caller then
    runs the instance-secret proof before anything else; otherwise the key is refused.
    """

    def __init__(self, provisional: bool) -> None:
        self._provisional = provisional
        self.presented: asyncssh.SSHKey | None = None
        self.accepted_provisionally = False

    def validate_host_public_key(
        self, host: str, addr: str, port: int, key: asyncssh.SSHKey
    ) -> bool:
        self.presented = key
        self.accepted_provisionally = self._provisional
        return self._provisional


class Dialer:
    """Opens one node's SSH connection (the settings are passed per call: callers may swap them)."""

    def __init__(
        self,
        stats: ProberStats,
        clock: Callable[[], datetime],
        on_host_key_learned: HostKeyRecorder | None,
    ) -> None:
        self.stats = stats
        self._clock = clock
        self._on_learned = on_host_key_learned

    def _trusted(self, target: SshTarget, link: NodeLink) -> tuple[TrustedKeys, bool]:
        """The keys to trust for this connection, and whether first-use trust is allowed."""
        trust = target.trust
        if isinstance(trust, KnownHostKeys):
            keys = trust.trusted_for(target.host, target.port)
            if keys.empty:
                raise errors.HostKeyUnknown(
                    target.node,
                    target.address,
                    f"the known_hosts text has no key for {target.address}; no connection "
                    "was made. Add the node's host key to its known_hosts Secret.",
                )
            return keys, False
        if link.pinned_key is not None:
            return TrustedKeys((link.pinned_key,)), False
        return TrustedKeys(()), True

    async def open(
        self, target: SshTarget, endpoint: Endpoint, link: NodeLink, settings: ProbeSettings
    ) -> asyncssh.SSHClientConnection:
        trusted, first_use = self._trusted(target, link)
        sock = await self._tcp_connect(target, endpoint, settings)
        gate = _HostKeyGate(provisional=first_use)
        try:
            conn = await asyncio.wait_for(
                asyncssh.connect(
                    sock=sock,
                    config=None,
                    client_factory=lambda: gate,
                    username=target.user,
                    client_keys=[target.client_key.asyncssh_key],
                    known_hosts=(
                        list(trusted.host_keys),
                        list(trusted.ca_keys),
                        list(trusted.revoked),
                    ),
                    host_key_alias=target.host,
                    x509_trusted_certs=None,
                    agent_path=None,
                    preferred_auth="publickey",
                    password_auth=False,
                    kbdint_auth=False,
                    gss_auth=False,
                    gss_kex=False,
                    connect_timeout=None,
                    encryption_algs=list(settings.encryption_algs),
                    keepalive_interval=settings.keepalive_interval,
                    keepalive_count_max=settings.keepalive_count_max,
                ),
                timeout=settings.login_timeout,
            )
        except TimeoutError:
            _close_socket(sock)
            raise errors.LoginTimeout(
                target.node,
                target.address,
                f"TCP connected to {endpoint} but the SSH handshake and login did not finish "
                f"within {settings.login_timeout:g}s (sshd hung or overloaded)",
            ) from None
        except asyncssh.HostKeyNotVerifiable:
            _close_socket(sock)
            self.stats.host_key_refusals += 1
            presented = _describe(gate.presented)
            logger.warning(
                "SSH host key mismatch; connection refused, no command run",
                extra={
                    "ssh_node": target.node,
                    "ssh_endpoint": str(endpoint),
                    "presented": presented,
                },
            )
            raise errors.HostKeyMismatch(
                target.node, target.address, presented, trusted.fingerprints
            ) from None
        except asyncssh.PermissionDenied:
            _close_socket(sock)
            raise errors.AuthFailed(
                target.node,
                target.address,
                f"the node refused our client key {target.client_key.fingerprint} "
                f"for user {target.user}",
            ) from None
        except asyncssh.KeyExchangeFailed as exc:
            _close_socket(sock)
            if "host key" in str(exc).lower() and not trusted.empty:
                self.stats.host_key_refusals += 1
                raise errors.HostKeyMismatch(
                    target.node,
                    target.address,
                    None,
                    trusted.fingerprints,
                    reason="host key mismatch: the server offers no host key of the trusted "
                    f"algorithm(s) [{', '.join(trusted.fingerprints)}]; connection refused, "
                    "no command was run",
                ) from None
            raise errors.ConnectionFailed(
                target.node, target.address, f"SSH key exchange failed: {exc.reason}"
            ) from None
        except (asyncssh.Error, OSError) as exc:
            _close_socket(sock)
            raise errors.ConnectionFailed(
                target.node, target.address, f"SSH handshake failed: {type(exc).__name__}"
            ) from None
        if gate.accepted_provisionally:
            await self._prove_instance_secret(target, endpoint, link, conn, gate, settings)
        logger.info(
            "SSH connected",
            extra={"ssh_node": target.node, "ssh_endpoint": str(endpoint)},
        )
        return conn

    async def _tcp_connect(
        self, target: SshTarget, endpoint: Endpoint, settings: ProbeSettings
    ) -> socket.socket:
        loop = asyncio.get_running_loop()
        try:
            infos = await asyncio.wait_for(
                loop.getaddrinfo(endpoint.host, endpoint.port, type=socket.SOCK_STREAM),
                timeout=settings.connect_timeout,
            )
        except (OSError, TimeoutError) as exc:
            raise errors.Unreachable(
                target.node, target.address, f"cannot resolve {endpoint.host}: {exc}"
            ) from None
        family, type_, proto, _, address = infos[0]
        sock = socket.socket(family, type_, proto)
        sock.setblocking(False)
        try:
            await asyncio.wait_for(
                loop.sock_connect(sock, address), timeout=settings.connect_timeout
            )
        except TimeoutError:
            sock.close()
            raise errors.ConnectTimeout(
                target.node,
                target.address,
                f"no TCP connection to {endpoint} within {settings.connect_timeout:g}s",
            ) from None
        except OSError as exc:
            sock.close()
            raise errors.Unreachable(
                target.node,
                target.address,
                f"cannot connect to {endpoint}: {exc.strerror or type(exc).__name__}",
            ) from None
        return sock

    async def _prove_instance_secret(
        self,
        target: SshTarget,
        endpoint: Endpoint,
        link: NodeLink,
        conn: asyncssh.SSHClientConnection,
        gate: _HostKeyGate,
        settings: ProbeSettings,
    ) -> None:
        trust = target.trust
        assert isinstance(trust, InstanceSecretTrust)
        key = gate.presented
        assert key is not None
        fingerprint = key.get_fingerprint()
        proven = False
        reason = "it did not answer"
        try:
            process = await conn.create_process(
                trust.proof_command, encoding="utf-8", errors="replace"
            )
            completed = await process.wait(timeout=settings.command_timeout)
            answer = text(completed.stdout).strip()
            expected = trust.instance_secret.get_secret_value()
            proven = completed.exit_status == 0 and hmac.compare_digest(
                answer.encode(), expected.encode()
            )
            del answer
            if completed.exit_status != 0:
                reason = f"the proof command exited {completed.exit_status}"
            elif not proven:
                reason = "its answer did not match the instance secret"
        except asyncssh.TimeoutError:
            reason = f"the proof command did not answer within {settings.command_timeout:g}s"
        except (asyncssh.Error, OSError):
            reason = "the connection failed during the proof"
        if not proven:
            conn.abort()
            self.stats.host_key_refusals += 1
            logger.warning(
                "host key not trusted: instance secret not proven",
                extra={"ssh_node": target.node, "presented": fingerprint},
            )
            raise errors.InstanceSecretNotProven(
                target.node,
                target.address,
                f"the node did not prove its per-instance secret ({reason}); its host key "
                f"{key.get_algorithm()} {fingerprint} was not trusted and no other command "
                "was run",
            )
        link.pinned_key = key
        learned = LearnedHostKey(
            node=target.node,
            host=target.host,
            port=target.port,
            algorithm=key.get_algorithm(),
            fingerprint=fingerprint,
            public_key=key.export_public_key("openssh").decode().strip(),
            learned_at=self._clock(),
        )
        link.unreported_learned = learned
        self.stats.host_keys_learned += 1
        logger.info(
            "host key learned after instance-secret proof",
            extra={"ssh_node": target.node, "ssh_endpoint": str(endpoint), "key": fingerprint},
        )
        if self._on_learned is not None:
            try:
                await self._on_learned(learned)
            except Exception:
                # Trusted in memory anyway; the caller sees it again in the next report.
                logger.exception(
                    "recording the learned host key failed", extra={"ssh_node": target.node}
                )


def _describe(key: asyncssh.SSHKey | None) -> str | None:
    if key is None:
        return None
    return f"{key.get_algorithm()} {key.get_fingerprint()}"


def _close_socket(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.close()
