"""Helpers shared by the side-node tests (imported as a plain module: tests/sidenode is on sys.path)."""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncssh

from calibration import scaled
from nodewarden.ssh import (
    KnownHostKeys,
    ProbeSettings,
    SshClientKey,
    SshError,
    SshProber,
    SshTarget,
)
from nodewarden_doubles.sidenode import PoweredSideNode, SideNodeSettings
from nodewarden_doubles.stubworker import StubWorkerConfig

CONTAINER = "zzzzz-dz642-000000000000001"


@dataclass(frozen=True)
class LoopbackTls:
    """A throwaway CA and a 127.0.0.1 server certificate (the `tls` fixture)."""

    context: ssl.SSLContext
    ca_pem: str
    directory: Path

    @property
    def cert_file(self) -> Path:
        return self.directory / "server.pem"

    @property
    def key_file(self) -> Path:
        return self.directory / "server.key"


def fast_settings(**overrides: Any) -> ProbeSettings:
    values: dict[str, Any] = {"connect_timeout": 3.0, "login_timeout": 3.0, "command_timeout": 3.0}
    values.update(overrides)
    return ProbeSettings(**values)


def settings_for(
    client_key: SshClientKey,
    name: str = "side-a",
    *,
    worker: dict[str, Any] | None = None,
    **node: Any,
) -> SideNodeSettings:
    """Side-node settings with short delays, accepting ``client_key``."""
    node.setdefault("boot_delay", 0.3)
    node.setdefault("ready_delay", 0.3)
    node.setdefault("shutdown_delay", 0.05)
    config = StubWorkerConfig(authorized_keys=(client_key.public_key,), name=name, **(worker or {}))
    return SideNodeSettings(worker=config, **node)


def target_for(
    node: PoweredSideNode, client_key: SshClientKey, known_hosts: str | None = None
) -> SshTarget:
    """What the operator would hold: the node's fixed address and a known_hosts text."""
    assert node.port is not None
    return SshTarget(
        node=node.name,
        host="127.0.0.1",
        port=node.port,
        client_key=client_key,
        trust=KnownHostKeys(known_hosts or node.known_hosts_line()),
    )


async def probe_state(prober: SshProber, target: SshTarget) -> str:
    """'Ready' / 'Booting' from the real prober, or the error class name when it fails."""
    try:
        report = await prober.probe(target)
    except SshError as exc:
        return type(exc).__name__
    return report.ready.state


async def eventually(
    predicate: Callable[[], bool], deadline_s: float = 10.0, interval: float = 0.02, what: str = ""
) -> float:
    """Poll ``predicate`` until it holds (returns the seconds it took) or fail at the deadline
    (scaled by the calibration figure)."""
    deadline_s = scaled(deadline_s)
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > deadline_s:
            raise AssertionError(f"not reached within {deadline_s} s: {what or predicate}")
        await asyncio.sleep(interval)
    return time.monotonic() - start


async def probe_until(
    prober: SshProber, target: SshTarget, wanted: str, deadline_s: float = 10.0
) -> tuple[list[str], float]:
    """Probe until the result is ``wanted``; returns the distinct results in order and the time."""
    transitions, took = await probe_transitions(prober, target, wanted, deadline_s)
    return [state for state, _ in transitions], took


async def probe_transitions(
    prober: SshProber, target: SshTarget, wanted: str, deadline_s: float = 10.0
) -> tuple[list[tuple[str, float]], float]:
    """Probe until ``wanted``; each distinct result with the seconds after the start it was
    first seen (a result seen at t was not there at the previous probe)."""
    start = time.monotonic()
    seen: list[tuple[str, float]] = []
    while True:
        state = await probe_state(prober, target)
        now = time.monotonic() - start
        if not seen or seen[-1][0] != state:
            seen.append((state, now))
        if state == wanted:
            return seen, now
        if now > deadline_s:
            raise AssertionError(
                f"{target.node}: wanted {wanted}, saw {seen} within {deadline_s} s"
            )
        await asyncio.sleep(0.02)


async def ssh_run(port: int, known_hosts_line: str, key: SshClientKey, command: str) -> str:
    """Run one command over a plain asyncssh connection; its stdout (exit status must be 0)."""
    async with asyncssh.connect(
        "127.0.0.1",
        port,
        username="root",
        client_keys=[key.asyncssh_key],
        known_hosts=asyncssh.import_known_hosts(known_hosts_line + "\n"),
        config=None,
        agent_path=None,
    ) as conn:
        result = await conn.run(command, check=True)
    return str(result.stdout)


async def uptime(node: PoweredSideNode, client_key: SshClientKey) -> float:
    """First field of ``cat /proc/uptime`` (the prober has no uptime call yet)."""
    assert node.port is not None
    out = await ssh_run(node.port, node.known_hosts_line(), client_key, "cat /proc/uptime")
    return float(out.split()[0])
