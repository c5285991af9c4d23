"""Per-node SSH connection state and command output: what the prober's collaborators share.

- `NodeLink` — the kept-alive connection of one node and what it was opened with.
- `Output` — one finished command (exit status/signal, text, when it started).
- `ProberStats` — counters for benchmarks and metrics.
- `Guard`, `HostKeyRecorder` — the callbacks callers hand in.
- `hint`, `source`, `parsed`, `text` — how outputs become error hints, fact sources, facts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import asyncssh

import nodewarden.ssh.errors as errors
from nodewarden.ssh.addressing import Endpoint
from nodewarden.ssh.credentials import SshTarget
from nodewarden.ssh.facts import LearnedHostKey
from nodewarden.ssh.parsing import OutputError

LOGGER_NAME = "nodewarden.ssh.prober"
"""The one logger of the SSH adapter (log filters and the secrets test key on it)."""

HostKeyRecorder = Callable[[LearnedHostKey], Awaitable[None]]
"""Called once per learned host key, so the caller can record it (e.g. in a Secret)."""


Guard = Callable[[], object]
"""Called right before a command is sent; raises `nodewarden.fence.NotLeader` to stop it."""


@dataclass(slots=True)
class Output:
    exit_status: int | None
    exit_signal: str | None
    stdout: str
    stderr: str
    started_at: datetime


@dataclass(slots=True)
class NodeLink:
    """The kept-alive connection of one node and what it was opened with."""

    node: str
    sessions: asyncio.Semaphore
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    conn: asyncssh.SSHClientConnection | None = None
    endpoint: Endpoint | None = None
    identity: tuple[str, ...] = ()
    pinned_key: asyncssh.SSHKey | None = None
    unreported_learned: LearnedHostKey | None = None
    connect_attempts_done: int = 0
    last_connect_error: errors.SshError | None = None


@dataclass(slots=True)
class ProberStats:
    """Counters for benchmarks and metrics."""

    connects: int = 0
    connect_failures: int = 0
    commands: int = 0
    command_timeouts: int = 0
    stale_reconnects: int = 0
    host_key_refusals: int = 0
    host_keys_learned: int = 0
    streams_opened: int = 0
    """Watch commands started (each also counts in `commands`)."""
    stream_lines: int = 0
    """Lines read from watch commands (state and heartbeat)."""


def source(target: SshTarget, command: str) -> str:
    return f"ssh {target.address}: {command}"


def parsed(target: SshTarget, parser: Callable[[str], Any], text: str) -> Any:
    try:
        return parser(text)
    except OutputError as exc:
        raise errors.BadOutput(target.node, target.address, str(exc)) from None


def text(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def hint(stderr: str) -> str:
    line = stderr.strip().splitlines()[0] if stderr.strip() else ""
    return line[:160]
