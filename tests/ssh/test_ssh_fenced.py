"""The runner client's fence layer (`nodewarden.ssh.fenced`) against a stub worker over SSH.

Runner starts and signals carry the owner options and the token; nothing is sent once
leadership is no longer valid -- checked again right before the command leaves, after
the connection was made -- and a runner that refuses the token ends leadership.
"""

from __future__ import annotations

import pytest
from ssh_helpers import StubFactory, target_for

from fencekit import Clock, held
from nodewarden.fence import FenceToken, NotLeader
from nodewarden.ssh import SshClientKey, SshProber
from nodewarden.ssh.errors import FenceRejected, NotSent
from nodewarden.ssh.fenced import FencedRunners

UUID_1 = "zzzzz-dz642-000000000000001"
OBJECT_UID = "0e6f1c9a-5b2d-4c1e-9f3a-7d8e2b4a6c10"


async def test_starts_and_signals_carry_owner_uid_and_token(
    stub: StubFactory, prober: SshProber, client_key: SshClientKey
) -> None:
    worker = await stub()
    runners = FencedRunners(prober, held(41, Clock()), "alpha")
    target = target_for(worker, client_key)
    started = await runners.start_runner(target, {"uuid": UUID_1}, uid=OBJECT_UID)
    listed = await prober.list_runners(target)
    [run] = listed.runners
    assert (run.pid, run.dispatcher_id, run.uid, run.fence) == (
        started.pid,
        "alpha",
        OBJECT_UID,
        41,
    )
    status = await runners.runner_status(target, UUID_1)
    assert (status.dispatcher_id, status.uid) == ("alpha", OBJECT_UID)
    await runners.kill_runner(target, UUID_1, "TERM")
    assert worker.runner.status(UUID_1)["state"] == "killed"
    assert worker.commands[-1].endswith(f"--kill TERM {UUID_1} --dispatcher-id alpha --fence 41")


async def test_nothing_is_sent_once_leadership_is_not_valid(
    stub: StubFactory, prober: SshProber, client_key: SshClientKey
) -> None:
    worker = await stub()
    clock = Clock()
    lead = held(3, clock)
    runners = FencedRunners(prober, lead, "alpha")
    target = target_for(worker, client_key)
    clock.now += 10.0  # valid for duration 15 - margin 5 after the renewal was sent
    with pytest.raises(NotSent):
        await runners.start_runner(target, {"uuid": UUID_1})
    with pytest.raises(NotSent):
        await runners.kill_runner(target, UUID_1)
    assert list(worker.commands) == []


class ValidOnce:
    """A fence that lets the first check pass and refuses the next: leadership ends while
    the command waits for its connection."""

    def __init__(self) -> None:
        self.checks = 0

    def check(self, action: str) -> FenceToken:
        self.checks += 1
        if self.checks > 1:
            raise NotLeader(f"{action}: the lease expired meanwhile")
        return FenceToken("nodewarden-alpha", 9)

    def rejected(self, by: str) -> None:
        raise AssertionError("not expected")


async def test_the_check_is_repeated_right_before_the_command_is_sent(
    stub: StubFactory, prober: SshProber, client_key: SshClientKey
) -> None:
    worker = await stub()
    fence = ValidOnce()
    runners = FencedRunners(prober, fence, "alpha")
    with pytest.raises(NotSent, match="expired meanwhile"):
        await runners.start_runner(target_for(worker, client_key), {"uuid": UUID_1})
    assert fence.checks == 2  # once for the token, once with the connection up
    assert not any("run --detach" in c for c in worker.commands)
    assert worker.runner.started == 0


async def test_a_runner_that_saw_a_newer_token_ends_leadership(
    stub: StubFactory, prober: SshProber, client_key: SshClientKey
) -> None:
    worker = await stub()
    target = target_for(worker, client_key)
    newer = FencedRunners(prober, held(8, Clock()), "alpha")
    await newer.start_runner(target, {"uuid": UUID_1})  # the new leader acted here
    old = held(7, Clock())
    lost: list[str] = []
    old.on_lost(lost.append)
    with pytest.raises(FenceRejected):
        await FencedRunners(prober, old, "alpha").kill_runner(target, UUID_1, "KILL")
    assert worker.runner.status(UUID_1)["state"] == "running"  # the stale KILL did nothing
    assert lost and "newer fencing token" in lost[0]
    with pytest.raises(NotLeader):
        old.check("anything")
