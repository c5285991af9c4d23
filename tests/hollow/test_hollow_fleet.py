"""The hollow fleet under the operator's real SSH prober and power control, in process:
probes see its ready state and runners, runner commands and power requests reach its
model with who sent them, delays follow a fake clock, the fence stops a request before
it reaches a node, and the two-owner detector reports a node two replicas acted on."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime

import asyncssh
import pytest
from pydantic import SecretStr

from nodewarden.credentials import CredentialResolver
from nodewarden.credentials.settings import CredentialsConfig
from nodewarden.fence import Leadership
from nodewarden.policy.events import RequestAccepted, RequestErrored
from nodewarden.policy.facts import PowerReading
from nodewarden.power.control import NodeRef, PowerControl
from nodewarden.ssh.credentials import InstanceSecretTrust, SshClientKey, SshTarget
from nodewarden.ssh.errors import SshError
from nodewarden.ssh.prober import SshProber
from nodewarden.ssh.runners import RunnerOwner
from nodewarden.ssh.stream import StreamStopped, WatchUnsupported
from nodewarden_doubles.hollow import (
    HollowBmcSecrets,
    HollowDialer,
    HollowFleet,
    side_node_spec,
)
from nodewarden_doubles.hollow.bmc import bmc_transports

UUID = "zzzzz-dz642-000000000000001"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def client_key() -> SshClientKey:
    pem = asyncssh.generate_private_key("ssh-ed25519").export_private_key().decode()
    return SshClientKey(SecretStr(pem))


def target(node: str, key: SshClientKey) -> SshTarget:
    return SshTarget(node, "127.0.0.1", key, InstanceSecretTrust(SecretStr("s" * 16)))


def side_node(name: str) -> NodeRef:
    return NodeRef(name, side_node_spec(name))


def control(fleet: HollowFleet, replica: str, fence: Leadership | None = None) -> PowerControl:
    resolver = CredentialResolver(
        HollowBmcSecrets(), "ns", CredentialsConfig(bmc_endpoints=["127.0.0.1:9"], secret_ttl="0s")
    )
    return PowerControl(
        resolver,
        None,
        None,
        lambda: datetime.now(tz=UTC),
        fence=fence,
        user_agent=f"nodewarden/0.1.0 (power; dispatcher=nw; replica={replica})",
        bmc_transport=bmc_transports(fleet),
    )


async def test_probes_and_runner_commands_through_the_real_prober(client_key: SshClientKey) -> None:
    clock = Clock()
    fleet = HollowFleet(clock=clock, boot_delay=5, ready_delay=3, shutdown_delay=10)
    fleet.add(["n1", "n2"])
    prober = SshProber(dialer=HollowDialer(fleet, actor="replica-a"))
    n1 = target("n1", client_key)
    try:
        report = await prober.probe(n1, uptime=True, host_uuid=True)
        assert report.ready.state == "Ready" and report.runners is not None
        assert report.runners.runners == ()
        assert report.host_uuid is not None
        assert report.host_uuid.uuid == fleet.nodes["n1"].system_uuid

        owner = RunnerOwner("nw", fence=7)
        started = await prober.start_runner(n1, {"uuid": UUID}, owner=owner)
        listed = await prober.probe(n1)
        assert listed.runners is not None
        assert [(r.pid, r.uuid, r.fence) for r in listed.runners.runners] == [
            (started.pid, UUID, 7)
        ]
        assert fleet.counts()[("n1", "runner:run")] == 1
        assert fleet.counts()[("n2", "runner:run")] == 0

        await prober.poweroff(n1)
        assert fleet.nodes["n1"].power == "PoweringOff"
        clock.now += 10
        with pytest.raises(SshError):
            await prober.probe(n1)  # off: the connection is gone, dialling fails
        assert fleet.node("n1").power == "Off"
        assert fleet.node("n1").runner is not None
        assert fleet.node("n1").runner.running() == []  # a power loss ends the runner
        assert fleet.actors("n1") == {"replica-a"}
        assert (await prober.probe(target("n2", client_key))).ready.state == "Ready"
    finally:
        await prober.aclose()


async def test_the_watch_command_is_refused_as_an_older_runner_would(
    client_key: SshClientKey,
) -> None:
    fleet = HollowFleet(streams=False)
    fleet.add(["n1"])
    prober = SshProber(dialer=HollowDialer(fleet))
    try:
        with pytest.raises(WatchUnsupported):
            async for _ in prober.watch(target("n1", client_key), heartbeat=1.0):
                pass
    finally:
        await prober.aclose()


async def test_the_watch_stream_pushes_changes_and_heartbeats_and_ends_at_power_off(
    client_key: SshClientKey,
) -> None:
    fleet = HollowFleet(shutdown_delay=0)
    fleet.add(["n1"])
    prober = SshProber(dialer=HollowDialer(fleet, actor="replica-a"))
    n1 = target("n1", client_key)
    seen: list[tuple[bool, tuple[str, ...]]] = []
    arrived = asyncio.Event()

    async def read() -> None:
        async for facts in prober.watch(n1, heartbeat=0.2):
            runners = facts.runners.runners if facts.runners is not None else ()
            seen.append((facts.changed, tuple(r.uuid for r in runners)))
            arrived.set()

    async def until(condition: Callable[[], bool]) -> None:
        async with asyncio.timeout(10.0):
            while not condition():
                await arrived.wait()
                arrived.clear()

    reader = asyncio.create_task(read())
    try:
        await until(lambda: len(seen) >= 1)
        assert seen[0] == (True, ())
        commands = fleet.counts()
        await prober.start_runner(n1, {"uuid": UUID}, owner=RunnerOwner("nw", fence=1))
        await until(lambda: any(UUID in runners for _, runners in seen))
        # pushed as a change (heartbeats before it, if the machine was slow, carry no runner)
        assert next(s for s in seen if UUID in s[1]) == (True, (UUID,))
        assert all(s == (False, ()) for s in seen[1 : seen.index((True, (UUID,)))])
        await until(lambda: (False, (UUID,)) in seen)  # a heartbeat: the same facts again
        assert fleet.counts() - commands == Counter({("n1", "runner:run"): 1})
        fleet.reset("n1", "ForceOff", "replica-a")
        with pytest.raises(StreamStopped):
            await asyncio.wait_for(reader, 2.0)
    finally:
        reader.cancel()
        await prober.aclose()


async def test_power_reads_and_requests_through_the_real_power_control() -> None:
    clock = Clock()
    fleet = HollowFleet(clock=clock, boot_delay=5, ready_delay=3, shutdown_delay=10)
    fleet.add(["n1", "n2"])
    power = control(fleet, "replica-a")
    n1 = side_node("n1")
    try:
        reading = await power.read_power(n1)
        assert isinstance(reading, PowerReading) and reading.power == "On"
        outcome = await power.request(n1, "t-1", 1, "GracefulShutdown")
        assert isinstance(outcome, RequestAccepted), outcome
        clock.now += 9
        assert fleet.node("n1").power == "PoweringOff"
        clock.now += 1
        assert fleet.node("n1").power == "Off"
        assert isinstance(await power.request(n1, "t-2", 1, "On"), RequestAccepted)
        clock.now += 5
        assert fleet.node("n1").power == "On" and not fleet.ready("n1")
        clock.now += 3
        assert fleet.ready("n1")
        assert fleet.counts()[("n1", "bmc:GracefulShutdown")] == 1
        assert fleet.counts()[("n1", "bmc:On")] == 1
        assert fleet.actors("n1") == {"replica-a"}
        assert fleet.actors("n2") == set()
        assert fleet.node("n2").power == "On"
    finally:
        await power.close()


async def test_a_fenced_request_never_reaches_the_node() -> None:
    fleet = HollowFleet()
    fleet.add(["n1"])
    lapsed = Leadership("nw-shard-0", duration=15, margin=5, clock=lambda: 100.0)
    lapsed.renewed(sent_at=50.0, transitions=3)  # valid until 60: over at 100
    power = control(fleet, "replica-a", fence=lapsed)
    try:
        outcome = await power.request(side_node("n1"), "t-1", 1, "GracefulShutdown")
        assert isinstance(outcome, RequestErrored) and "not sent" in outcome.detail
        assert fleet.actions == []
        assert fleet.node("n1").power == "On"
    finally:
        await power.close()


async def test_two_replicas_acting_on_one_node_are_reported() -> None:
    fleet = HollowFleet()
    fleet.add(["n1", "n2", "n3"])
    a, b = control(fleet, "replica-a"), control(fleet, "replica-b")
    try:
        await a.request(side_node("n1"), "t-1", 1, "GracefulShutdown")
        await b.request(side_node("n2"), "t-2", 1, "GracefulShutdown")
        assert fleet.acted_on_by_several() == {}
        await b.request(side_node("n1"), "t-3", 1, "On")
        assert fleet.acted_on_by_several() == {"n1": {"replica-a", "replica-b"}}
        assert fleet.interleaved() == {}  # a then b: a handover, not two owners at once
        await a.request(side_node("n1"), "t-4", 1, "GracefulShutdown")
        assert fleet.interleaved() == {"n1": ["replica-a", "replica-b", "replica-a"]}
    finally:
        await a.close()
        await b.close()


def test_every_node_has_its_own_system_uuid_and_a_seed_repeats_them() -> None:
    fleet = HollowFleet(seed=4)
    fleet.add(["a", "b"])
    fleet.add(["c"])
    uuids = [fleet.nodes[n].system_uuid for n in "abc"]
    assert len(set(uuids)) == 3
    again = HollowFleet(seed=4)
    again.add(["a", "b", "c"])
    assert [again.nodes[n].system_uuid for n in "abc"] == uuids


async def test_a_reset_type_not_offered_is_refused_and_counted() -> None:
    fleet = HollowFleet()
    fleet.add(["n1"])
    power = control(fleet, "replica-a")
    try:
        outcome = await power.request(side_node("n1"), "t-1", 1, "PowerCycle")
        assert not isinstance(outcome, RequestAccepted)
        assert [(x.kind, x.accepted) for x in fleet.actions] == [("bmc:PowerCycle", False)]
        assert fleet.node("n1").power == "On"
    finally:
        await power.close()
