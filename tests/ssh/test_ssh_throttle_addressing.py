"""Probe throttle spacing, address resolvers, and the credential types' secrecy."""

from __future__ import annotations

import asyncio
import time

import asyncssh
import pytest
from pydantic import SecretBytes, SecretStr

from nodewarden.ssh import (
    DirectResolver,
    Endpoint,
    InstanceSecretTrust,
    InvalidClientKey,
    KnownHostKeys,
    LoopbackOnlyResolver,
    MappedResolver,
    ProbeSettings,
    ProbeThrottle,
    ResolutionRefused,
    SshClientKey,
    SshTarget,
)


class RecordingClock:
    """Clock + sleep pair: sleeping advances the clock and records the delay."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


async def test_throttle_spaces_sequential_probes_evenly() -> None:
    rec = RecordingClock()
    throttle = ProbeThrottle(10, clock=rec.clock, sleep=rec.sleep)
    for _ in range(5):
        await throttle.acquire()
    assert rec.sleeps == pytest.approx([0.1, 0.1, 0.1, 0.1])
    assert rec.now == pytest.approx(0.4)
    assert throttle.granted == 5


async def test_throttle_gives_concurrent_waiters_distinct_slots() -> None:
    rec = RecordingClock()
    # Clock frozen while all ask at once: each must be given its own later slot.
    frozen: list[float] = []

    async def frozen_sleep(seconds: float) -> None:
        frozen.append(seconds)

    throttle = ProbeThrottle(4, clock=rec.clock, sleep=frozen_sleep)
    await asyncio.gather(*(throttle.acquire() for _ in range(5)))
    assert sorted(frozen) == pytest.approx([0.25, 0.5, 0.75, 1.0])


async def test_throttle_does_not_wait_after_an_idle_gap() -> None:
    rec = RecordingClock()
    throttle = ProbeThrottle(2, clock=rec.clock, sleep=rec.sleep)
    await throttle.acquire()
    rec.now += 10
    await throttle.acquire()
    assert rec.sleeps == []


async def test_zero_means_unthrottled() -> None:
    rec = RecordingClock()
    throttle = ProbeThrottle(0, clock=rec.clock, sleep=rec.sleep)
    for _ in range(100):
        await throttle.acquire()
    assert rec.sleeps == []
    assert throttle.unthrottled


async def test_throttle_holds_its_rate_in_real_time() -> None:
    throttle = ProbeThrottle(50)
    start = time.monotonic()
    await asyncio.gather(*(throttle.acquire() for _ in range(11)))
    # 11 slots at 50/s span at least 10 intervals of 20 ms (lower bound only: noisy host).
    assert time.monotonic() - start >= 0.19


def test_negative_rate_is_rejected() -> None:
    with pytest.raises(ValueError):
        ProbeThrottle(-1)


def test_loopback_only_resolver_refuses_other_addresses() -> None:
    resolver = LoopbackOnlyResolver()
    assert resolver.resolve("127.0.0.1", 2222) == Endpoint("127.0.0.1", 2222)
    assert resolver.resolve("::1", 22) == Endpoint("::1", 22)
    for host in ("10.0.0.5", "192.168.1.1", "example.org", "0.0.0.0"):
        with pytest.raises(ResolutionRefused):
            resolver.resolve(host, 22)


def test_mapped_resolver_maps_fake_cloud_addresses_to_loopback() -> None:
    resolver = MappedResolver()
    resolver.map("10.250.0.7", Endpoint("127.0.0.1", 40001))
    resolver.map("10.250.0.8", Endpoint("127.0.0.1", 40002), port=2222)
    assert resolver.resolve("10.250.0.7", 22) == Endpoint("127.0.0.1", 40001)
    assert resolver.resolve("10.250.0.8", 2222) == Endpoint("127.0.0.1", 40002)
    with pytest.raises(ResolutionRefused):
        resolver.resolve("10.250.0.8", 22)  # mapped for another port only
    with pytest.raises(ResolutionRefused):
        resolver.resolve("10.250.0.9", 22)  # never mapped
    resolver.unmap("10.250.0.7")
    with pytest.raises(ResolutionRefused):
        resolver.resolve("10.250.0.7", 22)


def test_mapped_resolver_refuses_non_loopback_targets() -> None:
    with pytest.raises(ValueError):
        MappedResolver().map("10.0.0.1", Endpoint("10.0.0.1", 22))


def test_direct_resolver_passes_addresses_through() -> None:
    assert DirectResolver().resolve("node7.example", 22) == Endpoint("node7.example", 22)


def test_client_key_repr_shows_fingerprint_only() -> None:
    raw = asyncssh.generate_private_key("ssh-ed25519")
    pem = raw.export_private_key("openssh").decode()
    key = SshClientKey(SecretStr(pem))
    body = [line for line in pem.splitlines() if not line.startswith("-----")]
    for text in (repr(key), str(key), repr(SshTarget("n", "127.0.0.1", key, KnownHostKeys("")))):
        assert all(line not in text for line in body)
    assert key.fingerprint in repr(key)
    assert key.public_key.startswith("ssh-ed25519 ")


def test_invalid_client_key_error_does_not_echo_the_input() -> None:
    secret_looking = "-----BEGIN OPENSSH PRIVATE KEY-----\nc2VjcmV0LXN0dWZm\n-----END"
    with pytest.raises(InvalidClientKey) as info:
        SshClientKey(SecretBytes(secret_looking.encode()))
    assert "c2VjcmV0LXN0dWZm" not in str(info.value)


def test_instance_secret_is_hidden_and_must_be_long_enough() -> None:
    trust = InstanceSecretTrust(SecretStr("s3cr3t-per-instance-value"))
    assert "s3cr3t" not in repr(trust)
    with pytest.raises(ValueError):
        InstanceSecretTrust(SecretStr("short"))


def test_known_hosts_lookup_uses_the_logical_host_and_port() -> None:
    k22 = asyncssh.generate_private_key("ssh-ed25519").export_public_key("openssh").decode()
    k2222 = asyncssh.generate_private_key("ssh-ed25519").export_public_key("openssh").decode()
    known = KnownHostKeys(f"10.0.0.5 {k22}[10.0.0.5]:2222 {k2222}")
    on_22 = known.trusted_for("10.0.0.5", 22)
    on_2222 = known.trusted_for("10.0.0.5", 2222)
    assert [k.export_public_key("openssh").decode() for k in on_22.host_keys] == [k22]
    assert [k.export_public_key("openssh").decode() for k in on_2222.host_keys] == [k2222]
    assert known.trusted_for("10.0.0.6", 22).empty


def test_known_hosts_garbage_is_rejected() -> None:
    with pytest.raises(ValueError):
        KnownHostKeys("10.0.0.5 ssh-ed25519 !!!notbase64\n")


def test_ethtool_template_must_name_the_interface() -> None:
    assert ProbeSettings(ethtool_command="sudo ethtool {iface}").ethtool_command
    for bad in ("ethtool eth0", "ethtool {iface} {other}"):
        with pytest.raises(ValueError):
            ProbeSettings(ethtool_command=bad)
