"""The kept-alive SSH connection of every node and running one command on it.

`Connections` keeps one `NodeLink` per node (keyed by `SshTarget.node`): it resolves the
node's address through the `AddressResolver` (refusals raise `HostNotAllowed`), has the
`Dialer` open a connection when there is none (or the endpoint or identity changed), and
runs commands on channels of it (at most ``max_sessions_per_connection`` at once) within
``command_timeout``. A timeout or a drop discards the connection; the next call reconnects.
A kept-alive connection found dead when opening a channel is replaced once, transparently
(the command had not started).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from datetime import datetime
from typing import Protocol

import asyncssh

import nodewarden.ssh.errors as errors
from nodewarden.fence import NotLeader
from nodewarden.ssh.addressing import AddressResolver, Endpoint, ResolutionRefused
from nodewarden.ssh.credentials import KnownHostKeys, SshTarget
from nodewarden.ssh.facts import LearnedHostKey
from nodewarden.ssh.handshake import Dialer
from nodewarden.ssh.link import (
    LOGGER_NAME,
    Guard,
    HostKeyRecorder,
    NodeLink,
    Output,
    ProberStats,
    text,
)
from nodewarden.ssh.settings import ProbeSettings

logger = logging.getLogger(LOGGER_NAME)


class DialerPort(Protocol):
    """Opens one node's connection: `handshake.Dialer` (TCP, SSH handshake, host-key
    trust, instance-secret proof), or a hollow fleet's in-process nodes
    (`nodewarden_doubles.hollow`), under the same `Connections` and everything above."""

    async def open(
        self, target: SshTarget, endpoint: Endpoint, link: NodeLink, settings: ProbeSettings
    ) -> asyncssh.SSHClientConnection: ...


class Connections:
    """One kept-alive connection per node; `exec` runs a command on it."""

    def __init__(
        self,
        settings: ProbeSettings,
        resolver: AddressResolver,
        clock: Callable[[], datetime],
        on_host_key_learned: HostKeyRecorder | None,
        dialer: DialerPort | None = None,
    ) -> None:
        self.settings = settings
        self.resolver = resolver
        self._clock = clock
        self._links: dict[str, NodeLink] = {}
        self.stats = ProberStats()
        self._dialer: DialerPort = dialer or Dialer(self.stats, clock, on_host_key_learned)

    def connected(self, node: str) -> bool:
        link = self._links.get(node)
        return link is not None and link.conn is not None and not link.conn.is_closed()

    def pinned_host_key(self, node: str) -> str | None:
        """The OpenSSH public key trusted on first use for ``node``, if any."""
        link = self._links.get(node)
        if link is None or link.pinned_key is None:
            return None
        return link.pinned_key.export_public_key("openssh").decode().strip()

    async def disconnect(self, node: str) -> None:
        """Close the node's connection (it reconnects on the next call). Keeps pinned keys."""
        link = self._links.get(node)
        if link is not None and link.conn is not None:
            conn = link.conn
            self._drop(link, conn)
            await _wait_closed(conn)

    async def forget(self, node: str) -> None:
        """Close the connection and forget everything, including a host key learned on first use."""
        await self.disconnect(node)
        self._links.pop(node, None)

    async def aclose(self) -> None:
        conns = [link.conn for link in self._links.values() if link.conn is not None]
        for link in self._links.values():
            if link.conn is not None:
                self._drop(link, link.conn)
        await asyncio.gather(*(_wait_closed(c) for c in conns))

    # ------------------------------------------------------------ internals

    def take_learned(self, node: str) -> LearnedHostKey | None:
        """The host key learned on first use since the last call, once."""
        link = self._links.get(node)
        learned = None
        if link is not None:
            learned, link.unreported_learned = link.unreported_learned, None
        return learned

    def drop_connection(self, node: str) -> None:
        """Abort the node's connection without waiting (e.g. after power-off)."""
        link = self._links.get(node)
        if link is not None and link.conn is not None:
            self._drop(link, link.conn)

    # ------------------------------------------------------------ internals

    def _link(self, node: str) -> NodeLink:
        link = self._links.get(node)
        if link is None:
            link = NodeLink(
                node=node,
                sessions=asyncio.Semaphore(self.settings.max_sessions_per_connection),
            )
            self._links[node] = link
        return link

    def _drop(self, link: NodeLink, conn: asyncssh.SSHClientConnection) -> None:
        if link.conn is conn:
            link.conn = None
        conn.abort()

    async def exec(
        self,
        target: SshTarget,
        purpose: str,
        command: str,
        *,
        input: str | None = None,
        allow_drop: bool = False,
        guard: Guard | None = None,
    ) -> Output:
        """Run one command on the node's connection (connecting first if needed).
        `guard()` runs once the channel may open, right before the command is sent: the
        last moment to refuse it (NotLeader → NotSent, nothing sent)."""
        link = self._link(target.node)
        for attempt in (1, 2):
            conn, fresh = await self._connection(target, link)
            async with link.sessions:
                started_at = self._clock()
                t0 = time.perf_counter()
                process: asyncssh.SSHClientProcess[str] | None = None
                completed: asyncssh.SSHCompletedProcess | None = None
                stale = False
                try:
                    # One deadline for opening the channel and running the command: a frozen
                    # peer may never even confirm the channel.
                    async with asyncio.timeout(self.settings.command_timeout):
                        if guard is not None:
                            try:
                                guard()
                            except NotLeader as exc:
                                raise errors.NotSent(
                                    target.node, target.address, str(exc)
                                ) from None
                        try:
                            process = await conn.create_process(
                                command, input=input, encoding="utf-8", errors="replace"
                            )
                        except asyncssh.ChannelOpenError as exc:
                            if not conn.is_closed():
                                # A live connection refused one more session (e.g. sshd
                                # MaxSessions): keep it for the commands in flight.
                                raise errors.SessionRefused(
                                    target.node,
                                    target.address,
                                    f"the node refused a new session for {purpose}: {exc.reason}",
                                ) from None
                            stale = True
                        except (asyncssh.DisconnectError, OSError):
                            stale = True
                        if process is not None:
                            self.stats.commands += 1
                            completed = await process.wait()
                except TimeoutError:
                    if process is not None:
                        process.close()
                    self._drop(link, conn)
                    self.stats.command_timeouts += 1
                    logger.warning(
                        "SSH command timed out; connection dropped",
                        extra={
                            "ssh_node": target.node,
                            "ssh_purpose": purpose,
                            "timeout_s": self.settings.command_timeout,
                        },
                    )
                    raise errors.CommandTimeout(
                        target.node,
                        target.address,
                        f"{purpose} command did not finish within "
                        f"{self.settings.command_timeout:g}s; the connection was dropped",
                    ) from None
                except (asyncssh.DisconnectError, OSError):
                    self._drop(link, conn)
                    if allow_drop:
                        return Output(None, None, "", "", started_at)
                    raise errors.ConnectionLost(
                        target.node, target.address, f"connection lost during {purpose}"
                    ) from None
            if stale or completed is None:
                # The kept-alive connection was dead; the command never started.
                self._drop(link, conn)
                if fresh or attempt == 2:
                    raise errors.ConnectionLost(
                        target.node, target.address, f"could not open a channel for {purpose}"
                    )
                self.stats.stale_reconnects += 1
                logger.info(
                    "kept-alive SSH connection was dead; reconnecting",
                    extra={"ssh_node": target.node, "ssh_purpose": purpose},
                )
                continue
            exit_status = completed.exit_status
            if exit_status is None and completed.exit_signal is None:
                # The channel closed without an exit status: the connection went away.
                self._drop(link, conn)
                if not allow_drop:
                    raise errors.ConnectionLost(
                        target.node, target.address, f"connection lost during {purpose}"
                    )
            logger.debug(
                "ssh command finished",
                extra={
                    "ssh_node": target.node,
                    "ssh_purpose": purpose,
                    "exit_status": exit_status,
                    "duration_ms": round((time.perf_counter() - t0) * 1000, 1),
                },
            )
            signal = completed.exit_signal[0] if completed.exit_signal else None
            return Output(
                exit_status=exit_status,
                exit_signal=signal,
                stdout=text(completed.stdout),
                stderr=text(completed.stderr),
                started_at=started_at,
            )
        raise AssertionError("unreachable")  # pragma: no cover

    async def open_stream(
        self, target: SshTarget, purpose: str, command: str
    ) -> asyncssh.SSHClientProcess[str]:
        """Start a long-lived command on the node's connection (connecting first if needed)
        and hand its process to the caller, who reads it and closes it. It holds no session
        slot of `exec` (sshd's MaxSessions 10 = 8 slots + this channel + one spare). A
        kept-alive connection found dead is replaced once, as for `exec`."""
        link = self._link(target.node)
        for attempt in (1, 2):
            conn, fresh = await self._connection(target, link)
            try:
                async with asyncio.timeout(self.settings.command_timeout):
                    process = await conn.create_process(command, encoding="utf-8", errors="replace")
            except TimeoutError:
                self._drop(link, conn)
                raise errors.CommandTimeout(
                    target.node, target.address, f"the node did not open a channel for {purpose}"
                ) from None
            except asyncssh.ChannelOpenError as exc:
                if not conn.is_closed():
                    raise errors.SessionRefused(
                        target.node,
                        target.address,
                        f"the node refused a new session for {purpose}: {exc.reason}",
                    ) from None
            except (asyncssh.DisconnectError, OSError):
                pass
            else:
                self.stats.commands += 1
                self.stats.streams_opened += 1
                return process
            self._drop(link, conn)
            if fresh or attempt == 2:
                raise errors.ConnectionLost(
                    target.node, target.address, f"could not open a channel for {purpose}"
                )
            self.stats.stale_reconnects += 1
        raise AssertionError("unreachable")  # pragma: no cover

    async def _connection(
        self, target: SshTarget, link: NodeLink
    ) -> tuple[asyncssh.SSHClientConnection, bool]:
        """The node's live connection, opening one if needed; True when freshly opened."""
        try:
            endpoint = self.resolver.resolve(target.host, target.port)
        except ResolutionRefused as exc:
            raise errors.HostNotAllowed(target.node, target.address, str(exc)) from None
        identity = (
            target.user,
            target.client_key.fingerprint,
            _trust_identity(target),
        )
        attempts_seen = link.connect_attempts_done
        async with link.lock:
            conn = link.conn
            if conn is not None and (
                conn.is_closed() or link.endpoint != endpoint or link.identity != identity
            ):
                self._drop(link, conn)
                conn = None
            if conn is not None:
                return conn, False
            if link.connect_attempts_done != attempts_seen and link.last_connect_error is not None:
                # Someone else tried while we waited and failed: share that outcome instead
                # of queueing another full connect timeout behind it.
                raise link.last_connect_error
            link.last_connect_error = None
            try:
                conn = await self._dialer.open(target, endpoint, link, self.settings)
            except errors.SshError as exc:
                link.last_connect_error = exc
                self.stats.connect_failures += 1
                raise
            finally:
                link.connect_attempts_done += 1
            link.conn, link.endpoint, link.identity = conn, endpoint, identity
            self.stats.connects += 1
            return conn, True


def _trust_identity(target: SshTarget) -> str:
    trust = target.trust
    if isinstance(trust, KnownHostKeys):
        return "known:" + str(hash(trust.known_hosts))
    return "first-use:" + trust.proof_command


async def _wait_closed(conn: asyncssh.SSHClientConnection) -> None:
    with contextlib.suppress(TimeoutError, asyncssh.Error, OSError):
        await asyncio.wait_for(conn.wait_closed(), timeout=5)
