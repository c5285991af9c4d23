"""The prober against in-process stub workers: each fact, runner control, kept-alive connections."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

import pytest
from ssh_helpers import FakeMonotonic, StubFactory, eventually, fast_settings, target_for

from nodewarden.ssh import (
    BadOutput,
    CommandFailed,
    Endpoint,
    HostNotAllowed,
    Inhibitor,
    InhibitorsUnknown,
    InvalidArgument,
    KnownHostKeys,
    MappedResolver,
    ProbeSettings,
    ProbeThrottle,
    SshClientKey,
    SshProber,
    SshTarget,
    Unreachable,
    WakeOnLanUnknown,
)
from nodewarden_doubles.stubworker import StubFaults

UUID_1 = "zzzzz-dz642-000000000000001"
UUID_2 = "zzzzz-dz642-000000000000002"


async def test_probe_reports_booting_then_ready_with_runners(
    stub: StubFactory, prober: SshProber, client_key: SshClientKey, stub_clock: FakeMonotonic
) -> None:
    worker = await stub(boot_delay=60)
    target = target_for(worker, client_key)
    before = datetime.now(tz=UTC)

    booting = await prober.probe(target)
    assert booting.ready.state == "Booting"
    assert booting.ready.detail == "starting"
    assert booting.runners is None  # not listed while booting
    assert booting.ready.observed_at >= before
    assert booting.ready.source.endswith("systemctl is-system-running")

    stub_clock.advance(61)
    ready = await prober.probe(target)
    assert ready.ready.ready
    assert ready.runners is not None
    assert ready.runners.runners == ()
    assert ready.finished_at >= ready.started_at
    assert "nodewarden-runner --list" in list(worker.commands)


async def test_broken_node_never_becomes_ready(
    stub: StubFactory, prober: SshProber, client_key: SshClientKey, stub_clock: FakeMonotonic
) -> None:
    worker = await stub(boot_delay=0, faults=StubFaults(broken_ready=True))
    stub_clock.advance(3600)
    fact = await prober.check_ready(target_for(worker, client_key))
    assert fact.state == "Booting"
    assert fact.exit_status == 1
    assert fact.detail == "degraded"


async def test_runner_start_list_status_and_kill(
    stub: StubFactory, prober: SshProber, client_key: SshClientKey, stub_clock: FakeMonotonic
) -> None:
    worker = await stub()
    target = target_for(worker, client_key)
    config = {"uuid": UUID_1, "runtime": {"durationHintSeconds": 30, "exitCodeHint": 3}}

    started = await prober.start_runner(target, config)
    again = await prober.start_runner(target, config)
    assert again.pid == started.pid  # idempotent while running
    other = await prober.start_runner(target, {"uuid": UUID_2})  # no duration: runs until killed

    listed = await prober.list_runners(target)
    assert {(r.pid, r.uuid) for r in listed.runners} == {
        (started.pid, UUID_1),
        (other.pid, UUID_2),
    }
    assert (await prober.runner_status(target, UUID_1)).state == "running"

    stub_clock.advance(31)
    finished = await prober.runner_status(target, UUID_1)
    assert (finished.state, finished.exit_code, finished.finished) == ("exited", 3, True)

    await prober.kill_runner(target, UUID_2, "SIGTERM")
    await prober.kill_runner(target, UUID_2, 9)  # already gone: still fine
    killed = await prober.runner_status(target, UUID_2)
    assert (killed.state, killed.signal, killed.exit_code) == ("killed", "TERM", None)
    assert (await prober.list_runners(target)).runners == ()
    unknown = await prober.runner_status(target, "zzzzz-dz642-999999999999999")
    assert unknown.state == "unknown"


async def test_runner_crash_shows_as_lost_and_start_failure_as_command_failed(
    stub: StubFactory, prober: SshProber, client_key: SshClientKey, stub_clock: FakeMonotonic
) -> None:
    worker = await stub(seed=7, faults=StubFaults(runner_crash_rate=1.0))
    target = target_for(worker, client_key)
    await prober.start_runner(target, {"uuid": UUID_1, "runtime": {"durationHintSeconds": 10}})
    stub_clock.advance(10)
    outcome = await prober.runner_status(target, UUID_1)
    assert outcome.state == "lost"
    assert outcome.exit_code is None

    worker.faults.runner_start_failure_rate = 1.0
    with pytest.raises(CommandFailed) as info:
        await prober.start_runner(target, {"uuid": UUID_2})
    assert info.value.exit_status == 1
    assert "injected fault" in str(info.value)


async def test_runner_arguments_are_validated_before_any_command(
    stub: StubFactory, prober: SshProber, client_key: SshClientKey
) -> None:
    worker = await stub()
    target = target_for(worker, client_key)
    with pytest.raises(InvalidArgument):
        await prober.start_runner(target, {"uuid": "x; rm -rf /"})
    with pytest.raises(InvalidArgument):
        await prober.kill_runner(target, UUID_1, "STOP; reboot")
    with pytest.raises(InvalidArgument):
        await prober.runner_status(target, "$(reboot)")
    with pytest.raises(InvalidArgument):
        await prober.wake_on_lan(target, "eth0;reboot")
    assert list(worker.commands) == []


async def test_inhibitors_from_busctl(
    stub: StubFactory, prober: SshProber, client_key: SshClientKey
) -> None:
    lock = Inhibitor(("shutdown",), "backup", "nightly dump", "block", 0, 4711)
    worker = await stub(inhibitors=[lock])
    fact = await prober.inhibitors(target_for(worker, client_key))
    assert fact.via == "busctl"
    assert fact.inhibitors == (lock,)
    assert fact.shutdown_blockers == (lock,)


async def test_inhibitors_fall_back_to_systemd_inhibit_text(
    stub: StubFactory, prober: SshProber, client_key: SshClientKey
) -> None:
    locks = [
        Inhibitor(("sleep",), "NetworkManager", "turn off networks", "delay", 0, 612),
        Inhibitor(("shutdown", "idle"), "db backup", "pg_basebackup running", "block", 0, 90),
    ]
    worker = await stub(inhibitors=locks, busctl_available=False)
    fact = await prober.inhibitors(target_for(worker, client_key))
    assert fact.via == "systemd-inhibit"
    assert fact.inhibitors == tuple(locks)
    assert [i.who for i in fact.shutdown_blockers] == ["db backup"]

    worker.config.inhibitors = []
    empty = await prober.inhibitors(target_for(worker, client_key))
    assert (empty.via, empty.inhibitors) == ("systemd-inhibit", ())


async def test_inhibitors_unknown_when_both_tools_fail(
    stub: StubFactory, prober: SshProber, client_key: SshClientKey
) -> None:
    worker = await stub(
        busctl_available=False,
        extra_commands={"systemd-inhibit --list --no-pager": (1, "", "Failed to connect to bus")},
    )
    with pytest.raises(InhibitorsUnknown) as info:
        await prober.inhibitors(target_for(worker, client_key))
    assert "unknown" in str(info.value)


async def test_inhibitors_fallback_output_must_parse(
    stub: StubFactory, prober: SshProber, client_key: SshClientKey
) -> None:
    worker = await stub(
        busctl_available=False,
        extra_commands={"systemd-inhibit --list --no-pager": (0, "garbage here\n", "")},
    )
    with pytest.raises(BadOutput):
        await prober.inhibitors(target_for(worker, client_key))


async def test_wake_on_lan_support_and_mode(
    stub: StubFactory, prober: SshProber, client_key: SshClientKey
) -> None:
    worker = await stub(interface="eno1", wol_supported="pumbg", wol_enabled="g")
    target = target_for(worker, client_key)
    fact = await prober.wake_on_lan(target, "eno1")
    assert fact.supports_magic_packet and fact.magic_packet_enabled
    assert fact.supported == frozenset("pumbg")

    worker.config.wol_enabled = "d"
    disabled = await prober.wake_on_lan(target, "eno1")
    assert disabled.supports_magic_packet and not disabled.magic_packet_enabled

    worker.config.wol_supported = ""
    unsupported = await prober.wake_on_lan(target, "eno1")
    assert not unsupported.supports_magic_packet

    worker.faults.ethtool_permission_denied = True
    worker.config.wol_supported = "g"
    with pytest.raises(WakeOnLanUnknown):
        await prober.wake_on_lan(target, "eno1")

    with pytest.raises(CommandFailed):
        await prober.wake_on_lan(target, "eth9")  # no such device


async def test_telemetry_with_gpus_and_without(
    stub: StubFactory, prober: SshProber, client_key: SshClientKey
) -> None:
    gpu_node = await stub(load=(3.5, 2.0, 1.25), gpu_utilisation=(87.0, None))
    fact = await prober.telemetry(target_for(gpu_node, client_key))
    assert (fact.load1, fact.load5, fact.load15) == (3.5, 2.0, 1.25)
    assert fact.gpus is not None
    assert [(g.index, g.utilisation) for g in fact.gpus] == [(0, 87.0), (1, None)]
    assert fact.sampled_at.tzinfo is not None

    cpu_node = await stub()
    assert (await prober.telemetry(target_for(cpu_node, client_key, node="cpu"))).gpus is None


async def test_full_probe_bundles_inhibitors_and_telemetry(
    stub: StubFactory, prober: SshProber, client_key: SshClientKey
) -> None:
    worker = await stub(gpu_utilisation=(10.0,))
    report = await prober.probe(target_for(worker, client_key), inhibitors=True, telemetry=True)
    assert report.inhibitors is not None and report.inhibitors.inhibitors == ()
    assert report.telemetry is not None and report.telemetry.gpus is not None


async def test_connection_is_kept_alive_and_shared(
    stub: StubFactory, prober: SshProber, client_key: SshClientKey
) -> None:
    worker = await stub()
    target = target_for(worker, client_key)
    for _ in range(3):
        await prober.probe(target)
    await asyncio.gather(*(prober.probe(target) for _ in range(25)))
    assert worker.connections_accepted == 1
    assert prober.stats.connects == 1
    assert prober.connected(target.node)


async def test_stale_connection_is_replaced_transparently(
    stub: StubFactory, prober: SshProber, client_key: SshClientKey
) -> None:
    worker = await stub()
    target = target_for(worker, client_key)
    await prober.probe(target)
    port = worker.port
    await worker.stop()  # the node drops every connection ...
    await worker.start()  # ... and comes back on the same port
    assert worker.port == port
    report = await prober.probe(target)
    assert report.ready.ready
    assert prober.stats.connects == 2
    assert worker.connections_accepted == 2


async def test_poweroff_is_a_request_and_the_node_goes_away(
    stub: StubFactory, prober: SshProber, client_key: SshClientKey
) -> None:
    worker = await stub()
    target = target_for(worker, client_key)
    await prober.start_runner(target, {"uuid": UUID_1})
    request = await prober.poweroff(target)
    assert request.exit_status in (0, None)
    assert "systemctl poweroff" in request.source
    await eventually(lambda: worker.powered_off)
    with pytest.raises(Unreachable):
        await prober.check_ready(target)
    await worker.start()  # powered on again: no containers survive a power cycle
    assert (await prober.list_runners(target)).runners == ()


async def test_mapped_address_and_known_hosts_for_the_logical_host(
    stub: StubFactory, client_key: SshClientKey
) -> None:
    worker = await stub()
    assert worker.port is not None
    resolver = MappedResolver()
    resolver.map("10.250.0.7", Endpoint("127.0.0.1", worker.port))
    # The known_hosts Secret names the node's own address, not the loopback mapping.
    known = KnownHostKeys.for_key("10.250.0.7", 22, worker.host_public_key)
    prober = SshProber(fast_settings(), resolver=resolver, throttle=ProbeThrottle(0))
    try:
        target = SshTarget("vm-7", "10.250.0.7", client_key, known)
        assert (await prober.check_ready(target)).ready
        with pytest.raises(HostNotAllowed):
            await prober.check_ready(SshTarget("vm-8", "10.250.0.8", client_key, known))
    finally:
        await prober.aclose()


async def test_default_resolver_refuses_non_loopback_addresses(client_key: SshClientKey) -> None:
    prober = SshProber(fast_settings())
    known = KnownHostKeys.for_key("192.0.2.10", 22, client_key.public_key)
    with pytest.raises(HostNotAllowed):
        await prober.check_ready(SshTarget("far", "192.0.2.10", client_key, known))
    assert prober.stats.connects == 0 and prober.stats.connect_failures == 0


async def test_probes_are_throttled_across_nodes(
    stub: StubFactory, client_key: SshClientKey
) -> None:
    workers = [await stub() for _ in range(3)]
    prober = SshProber(fast_settings(), throttle=ProbeThrottle(20))
    try:
        targets = [target_for(w, client_key, node=f"n{i}") for i, w in enumerate(workers)]
        start = time.monotonic()
        await asyncio.gather(*(prober.check_ready(t) for t in targets * 4))
        # 12 probes at 20/s: the last slot is at least 11 x 50 ms after the first.
        assert time.monotonic() - start >= 0.5
        assert prober.throttle.granted == 12
    finally:
        await prober.aclose()


async def test_custom_commands_are_used(stub: StubFactory, client_key: SshClientKey) -> None:
    worker = await stub(ready_command="test -e /run/booted", runner_command="sudo crunch-run")
    settings = ProbeSettings(ready_command="test -e /run/booted", runner_command="sudo crunch-run")
    prober = SshProber(settings, throttle=ProbeThrottle(0))
    try:
        report = await prober.probe(target_for(worker, client_key))
        assert report.ready.ready and report.runners is not None
        assert list(worker.commands) == ["test -e /run/booted", "sudo crunch-run --list"]
    finally:
        await prober.aclose()


async def test_a_failing_part_fails_the_whole_probe(
    stub: StubFactory, prober: SshProber, client_key: SshClientKey
) -> None:
    worker = await stub(
        busctl_available=False,
        extra_commands={"systemd-inhibit --list --no-pager": (1, "", "no bus")},
    )
    target = target_for(worker, client_key)
    with pytest.raises(InhibitorsUnknown):
        await prober.probe(target, inhibitors=True, telemetry=True)
    report = await prober.probe(target, telemetry=True)  # without the failing part it is fine
    assert report.telemetry is not None
