"""Faults: host-key refusal, trust on first use, auth, hangs, timeouts and recovery."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator

import pytest
from pydantic import SecretStr
from ssh_helpers import StubFactory, eventually, fast_settings, target_for

from nodewarden.ssh import (
    AuthFailed,
    CommandTimeout,
    ConnectionLost,
    ConnectTimeout,
    Endpoint,
    HostKeyMismatch,
    HostKeyUnknown,
    InstanceSecretNotProven,
    InstanceSecretTrust,
    KnownHostKeys,
    LearnedHostKey,
    LoginTimeout,
    MappedResolver,
    ProbeThrottle,
    SshClientKey,
    SshProber,
    SshTarget,
    Unreachable,
)
from nodewarden.ssh.protocol import DEFAULT_INSTANCE_SECRET_COMMAND
from nodewarden_doubles.stubworker import StubFaults

SECRET = "per-instance-9f2c41d7e0b34a8c"


async def test_host_key_mismatch_is_refused_before_any_command(
    stub: StubFactory, prober: SshProber, client_key: SshClientKey
) -> None:
    worker = await stub(faults=StubFaults(wrong_host_key=True))
    target = target_for(worker, client_key)  # trusts the genuine key
    with pytest.raises(HostKeyMismatch) as info:
        await prober.probe(target)
    error = info.value
    assert "host key mismatch" in str(error)
    assert "no command was run" in str(error)
    assert worker.host_key_fingerprint in str(error)  # the expected key is named
    assert error.presented is not None and worker.host_key_fingerprint not in error.presented
    assert error.probe_result == "HostKeyMismatch"
    assert list(worker.commands) == []
    assert worker.auth_attempts == 0  # we did not even offer our key
    assert not prober.connected(target.node)


async def test_a_node_whose_key_changes_is_refused_on_reconnect(
    stub: StubFactory, prober: SshProber, client_key: SshClientKey
) -> None:
    worker = await stub()
    target = target_for(worker, client_key)
    await prober.probe(target)
    seen = len(worker.commands)
    worker.faults.wrong_host_key = True
    await prober.disconnect(target.node)
    with pytest.raises(HostKeyMismatch):
        await prober.probe(target)
    assert len(worker.commands) == seen


async def test_known_hosts_without_an_entry_for_the_node_makes_no_connection(
    stub: StubFactory, prober: SshProber, client_key: SshClientKey
) -> None:
    worker = await stub()
    other = KnownHostKeys.for_key("127.0.0.1", 1, worker.host_public_key)  # wrong port
    with pytest.raises(HostKeyUnknown):
        await prober.probe(target_for(worker, client_key, trust=other))
    assert worker.connections_accepted == 0


async def test_refused_client_key_is_auth_failed(
    stub: StubFactory, prober: SshProber, client_key: SshClientKey
) -> None:
    worker = await stub(faults=StubFaults(refuse_auth=True))
    with pytest.raises(AuthFailed) as info:
        await prober.probe(target_for(worker, client_key))
    assert client_key.fingerprint in str(info.value)
    assert worker.auth_attempts >= 1
    assert list(worker.commands) == []

    stranger = SshClientKey.generate()
    worker.faults.refuse_auth = False
    with pytest.raises(AuthFailed):
        await prober.probe(target_for(worker, stranger, node="other"))


async def test_hung_command_times_out_and_the_connection_recovers(
    stub: StubFactory, client_key: SshClientKey
) -> None:
    worker = await stub()
    prober = SshProber(fast_settings(command_timeout=0.5), throttle=ProbeThrottle(0))
    try:
        target = target_for(worker, client_key)
        await prober.probe(target)
        worker.faults.hang_commands = True
        start = time.monotonic()
        with pytest.raises(CommandTimeout) as info:
            await prober.probe(target)
        assert time.monotonic() - start < 10  # generous: the timeout fired, nothing waited forever
        assert "did not finish within 0.5s" in str(info.value)
        assert not prober.connected(target.node)  # dropped, not reused
        assert prober.stats.command_timeouts == 1

        worker.faults.hang_commands = False
        report = await prober.probe(target)
        assert report.ready.ready
        assert worker.connections_accepted == 2
    finally:
        await prober.aclose()


async def test_hung_sshd_hits_the_login_timeout_and_recovers(
    stub: StubFactory, client_key: SshClientKey
) -> None:
    worker = await stub(faults=StubFaults(hang_connect=True))
    prober = SshProber(fast_settings(login_timeout=0.5), throttle=ProbeThrottle(0))
    try:
        target = target_for(worker, client_key)
        with pytest.raises(LoginTimeout) as info:
            await prober.probe(target)
        assert isinstance(info.value, ConnectTimeout)
        assert info.value.probe_result == "Unreachable"
        worker.faults.hang_connect = False
        assert (await prober.probe(target)).ready.ready
    finally:
        await prober.aclose()


async def test_concurrent_callers_share_one_failed_connect(
    stub: StubFactory, client_key: SshClientKey
) -> None:
    worker = await stub(faults=StubFaults(hang_connect=True))
    prober = SshProber(fast_settings(login_timeout=0.5), throttle=ProbeThrottle(0))
    try:
        target = target_for(worker, client_key)
        results = await asyncio.gather(
            *(prober.check_ready(target) for _ in range(5)), return_exceptions=True
        )
        assert all(isinstance(r, LoginTimeout) for r in results)
        assert worker.connections_accepted == 1  # not five serial login timeouts
    finally:
        await prober.aclose()


async def test_node_that_freezes_mid_connection_times_out_then_recovers(
    stub: StubFactory, client_key: SshClientKey
) -> None:
    worker = await stub()
    prober = SshProber(
        fast_settings(command_timeout=0.5, login_timeout=0.5), throttle=ProbeThrottle(0)
    )
    try:
        target = target_for(worker, client_key)
        await prober.probe(target)
        worker.faults.freeze = True  # TCP stays up, nothing is read or answered
        with pytest.raises(CommandTimeout):
            await prober.check_ready(target)
        assert not prober.connected(target.node)
        with pytest.raises(LoginTimeout):
            await prober.check_ready(target)
        worker.faults.freeze = False
        assert (await prober.check_ready(target)).ready
    finally:
        await prober.aclose()


async def test_keepalive_notices_a_frozen_node_without_any_command(
    stub: StubFactory, client_key: SshClientKey
) -> None:
    worker = await stub()
    prober = SshProber(
        fast_settings(keepalive_interval=0.2, keepalive_count_max=2), throttle=ProbeThrottle(0)
    )
    try:
        target = target_for(worker, client_key)
        await prober.probe(target)
        worker.faults.freeze = True
        await eventually(lambda: not prober.connected(target.node))
        worker.faults.freeze = False
        assert (await prober.check_ready(target)).ready
    finally:
        await prober.aclose()


async def test_slow_commands_succeed_within_the_timeout_and_fail_beyond_it(
    stub: StubFactory, client_key: SshClientKey
) -> None:
    worker = await stub(faults=StubFaults(command_delay=0.2))
    prober = SshProber(fast_settings(command_timeout=5), throttle=ProbeThrottle(0))
    try:
        target = target_for(worker, client_key)
        assert (await prober.check_ready(target)).ready
        worker.faults.command_delay = 30
        prober.settings = fast_settings(command_timeout=0.3)
        with pytest.raises(CommandTimeout):
            await prober.check_ready(target)
    finally:
        await prober.aclose()


async def test_closed_port_is_unreachable(
    stub: StubFactory, prober: SshProber, client_key: SshClientKey
) -> None:
    worker = await stub()
    target = target_for(worker, client_key)
    await worker.stop()
    with pytest.raises(Unreachable) as info:
        await prober.probe(target)
    assert info.value.probe_result == "Unreachable"


@pytest.fixture
def saturated_listener() -> Iterator[int]:
    """A real listener whose accept queue is full: further SYNs are dropped by the kernel."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    filler = socket.create_connection(("127.0.0.1", port), timeout=2)
    try:
        yield port
    finally:
        filler.close()
        listener.close()


async def test_tcp_connect_timeout(saturated_listener: int, client_key: SshClientKey) -> None:
    prober = SshProber(fast_settings(connect_timeout=0.3), throttle=ProbeThrottle(0))
    known = KnownHostKeys.for_key("127.0.0.1", saturated_listener, client_key.public_key)
    target = SshTarget("busy", "127.0.0.1", client_key, known, port=saturated_listener)
    with pytest.raises(ConnectTimeout) as info:
        await prober.check_ready(target)
    assert not isinstance(info.value, LoginTimeout)
    await prober.aclose()


# ------------------------------------------------------------ trust on first use


def tofu_target(worker_port: int, client_key: SshClientKey, secret: str = SECRET) -> SshTarget:
    return SshTarget(
        node="vm-1",
        host="10.250.0.1",
        client_key=client_key,
        trust=InstanceSecretTrust(SecretStr(secret)),
    )


def tofu_prober(port: int, **kw: object) -> SshProber:
    resolver = MappedResolver()
    resolver.map("10.250.0.1", Endpoint("127.0.0.1", port))
    return SshProber(fast_settings(), resolver=resolver, throttle=ProbeThrottle(0), **kw)  # type: ignore[arg-type]


async def test_first_use_trust_only_after_the_secret_is_proven(
    stub: StubFactory, client_key: SshClientKey
) -> None:
    worker = await stub(instance_secret=SecretStr(SECRET))
    assert worker.port is not None
    recorded: list[LearnedHostKey] = []

    async def record(learned: LearnedHostKey) -> None:
        recorded.append(learned)

    prober = tofu_prober(worker.port, on_host_key_learned=record)
    try:
        target = tofu_target(worker.port, client_key)
        report = await prober.probe(target)
        assert worker.commands[0] == DEFAULT_INSTANCE_SECRET_COMMAND
        learned = report.learned_host_key
        assert learned is not None
        assert learned.public_key == worker.host_public_key
        assert learned.fingerprint == worker.host_key_fingerprint
        assert learned.known_hosts_line == f"10.250.0.1 {worker.host_public_key}"
        assert recorded == [learned]
        assert prober.pinned_host_key("vm-1") == worker.host_public_key

        assert (await prober.probe(target)).learned_host_key is None  # reported once

        # The learned key is now pinned: a changed key is a mismatch, not a new first use.
        worker.faults.wrong_host_key = True
        await prober.disconnect("vm-1")
        with pytest.raises(HostKeyMismatch):
            await prober.probe(target)
        # The caller can store the line and use it as known_hosts from then on.
        worker.faults.wrong_host_key = False
        known = SshTarget("vm-1", "10.250.0.1", client_key, KnownHostKeys(learned.known_hosts_line))
        assert (await prober.check_ready(known)).ready
    finally:
        await prober.aclose()


@pytest.mark.parametrize(
    ("node_secret", "expected"),
    [
        ("someone-elses-secret-000000", "did not match"),
        (None, "exited 1"),
    ],
)
async def test_first_use_refused_when_the_secret_is_not_proven(
    stub: StubFactory, client_key: SshClientKey, node_secret: str | None, expected: str
) -> None:
    worker = await stub(instance_secret=SecretStr(node_secret) if node_secret else None)
    assert worker.port is not None
    prober = tofu_prober(worker.port)
    try:
        with pytest.raises(InstanceSecretNotProven) as info:
            await prober.probe(tofu_target(worker.port, client_key))
        assert expected in str(info.value)
        assert worker.host_key_fingerprint in str(info.value)
        assert SECRET not in str(info.value)
        assert info.value.probe_result == "HostKeyMismatch"
        assert list(worker.commands) == [DEFAULT_INSTANCE_SECRET_COMMAND]  # nothing else ran
        assert prober.pinned_host_key("vm-1") is None
        assert not prober.connected("vm-1")
    finally:
        await prober.aclose()


async def test_first_use_refused_when_the_proof_hangs(
    stub: StubFactory, client_key: SshClientKey
) -> None:
    worker = await stub(instance_secret=SecretStr(SECRET), faults=StubFaults(hang_commands=True))
    assert worker.port is not None
    prober = tofu_prober(worker.port)
    prober.settings = fast_settings(command_timeout=0.3)
    try:
        with pytest.raises(InstanceSecretNotProven) as info:
            await prober.probe(tofu_target(worker.port, client_key))
        assert "did not answer" in str(info.value)
    finally:
        await prober.aclose()


async def test_forget_drops_the_pinned_key_for_a_replaced_node(
    stub: StubFactory, client_key: SshClientKey
) -> None:
    first = await stub(instance_secret=SecretStr(SECRET))
    assert first.port is not None
    prober = tofu_prober(first.port)
    try:
        await prober.probe(tofu_target(first.port, client_key))
        await first.stop()
        replacement = await stub(instance_secret=SecretStr("replacement-secret-77aa00bb"))
        assert replacement.port is not None
        assert isinstance(prober.resolver, MappedResolver)
        prober.resolver.map("10.250.0.1", Endpoint("127.0.0.1", replacement.port))
        target = tofu_target(replacement.port, client_key, secret="replacement-secret-77aa00bb")
        with pytest.raises(HostKeyMismatch):
            await prober.probe(target)  # still pinned to the old node's key
        await prober.forget("vm-1")
        report = await prober.probe(target)
        assert report.learned_host_key is not None
        assert report.learned_host_key.public_key == replacement.host_public_key
    finally:
        await prober.aclose()


async def test_failing_recorder_keeps_the_key_trusted_in_memory(
    stub: StubFactory, client_key: SshClientKey
) -> None:
    worker = await stub(instance_secret=SecretStr(SECRET))
    assert worker.port is not None

    async def broken_recorder(learned: LearnedHostKey) -> None:
        raise RuntimeError("apiserver unavailable")

    prober = tofu_prober(worker.port, on_host_key_learned=broken_recorder)
    try:
        report = await prober.probe(tofu_target(worker.port, client_key))
        assert report.learned_host_key is not None
        assert report.ready.ready
    finally:
        await prober.aclose()


async def test_hang_connect_fault_is_a_silent_tcp_peer(stub: StubFactory) -> None:
    worker = await stub(faults=StubFaults(hang_connect=True))
    assert worker.port is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", worker.port)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(reader.read(1), timeout=0.3)
    worker.faults.hang_connect = False
    reader2, writer2 = await asyncio.open_connection("127.0.0.1", worker.port)
    banner = await asyncio.wait_for(reader2.readline(), timeout=5)
    assert banner.startswith(b"SSH-2.0-")
    await worker.stop()  # closes the silent connection too
    await eventually(lambda: reader.at_eof() or writer.is_closing())
    for w in (writer, writer2):
        w.close()


async def test_connection_dropped_mid_command_is_connection_lost(
    stub: StubFactory, prober: SshProber, client_key: SshClientKey
) -> None:
    worker = await stub(faults=StubFaults(hang_commands=True))
    target = target_for(worker, client_key)
    probe = asyncio.create_task(prober.check_ready(target))
    await eventually(lambda: len(worker.commands) == 1)
    await worker.stop()  # the node vanishes while the command runs
    with pytest.raises(ConnectionLost) as info:
        await probe
    assert "connection lost during ready" in str(info.value)
    assert not prober.connected(target.node)


async def test_poweroff_whose_connection_drops_still_counts_as_requested(
    stub: StubFactory, prober: SshProber, client_key: SshClientKey
) -> None:
    worker = await stub()
    target = target_for(worker, client_key)
    await prober.check_ready(target)
    worker.faults.hang_commands = True  # the node starts shutting down and never answers
    request = asyncio.create_task(prober.poweroff(target))
    await eventually(lambda: "systemctl poweroff" in worker.commands)
    await worker.stop()
    requested = await request
    assert requested.connection_dropped
    assert requested.exit_status is None
