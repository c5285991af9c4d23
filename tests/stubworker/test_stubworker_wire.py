"""The stub worker over real SSH, driven by a plain asyncssh client (not nodewarden's prober).

Checks the node contract on the wire, the fault knobs, power-off/restart, and that a
thousand workers in one process are cheap.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator

import asyncssh
import pytest
from pydantic import SecretStr

from nodewarden.ssh.facts import Inhibitor
from nodewarden.ssh.protocol import (
    BUSCTL_LIST_INHIBITORS,
    DEFAULT_INSTANCE_SECRET_COMMAND,
    DEFAULT_TELEMETRY_COMMAND,
)
from nodewarden_doubles.stubworker import StubFaults, StubWorker, StubWorkerConfig

UUID_1 = "zzzzz-dz642-000000000000001"
UUID_2 = "zzzzz-dz642-000000000000002"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def client_key() -> asyncssh.SSHKey:
    return asyncssh.generate_private_key("ssh-ed25519")


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def worker(client_key: asyncssh.SSHKey, clock: Clock) -> AsyncIterator[StubWorker]:
    config = StubWorkerConfig(
        authorized_keys=(client_key.export_public_key("openssh").decode(),),
        instance_secret=SecretStr("wire-test-secret-0123456789"),
        boot_delay=30,
        inhibitors=[Inhibitor(("shutdown",), "backup", "dump", "block", 0, 9)],
        gpu_utilisation=(55.0,),
    )
    w = StubWorker(config, clock=clock)
    await w.start()
    yield w
    await w.stop()


async def connect(worker: StubWorker, client_key: asyncssh.SSHKey) -> asyncssh.SSHClientConnection:
    known = asyncssh.import_known_hosts(worker.known_hosts_line() + "\n")
    return await asyncssh.connect(
        "127.0.0.1",
        worker.port,
        username="root",
        client_keys=[client_key],
        known_hosts=known,
        config=None,
        agent_path=None,
    )


async def test_contract_commands_on_the_wire(
    worker: StubWorker, client_key: asyncssh.SSHKey, clock: Clock
) -> None:
    async with await connect(worker, client_key) as conn:
        booting = await conn.run("systemctl is-system-running")
        assert (booting.exit_status, booting.stdout) == (1, "starting\n")
        clock.now += 30
        ready = await conn.run("systemctl is-system-running")
        assert (ready.exit_status, ready.stdout) == (0, "running\n")

        proof = await conn.run(DEFAULT_INSTANCE_SECRET_COMMAND)
        assert proof.stdout == "wire-test-secret-0123456789\n"

        spec = {"uuid": UUID_1, "runtime": {"durationHintSeconds": 5, "exitCodeHint": 2}}
        started = await conn.run("nodewarden-runner run --detach", input=json.dumps(spec))
        assert started.exit_status == 0
        pid = int(str(started.stdout).strip())
        listed = await conn.run("nodewarden-runner --list")
        assert listed.stdout == f"{pid} {UUID_1}\n"
        clock.now += 5
        status = await conn.run(f"nodewarden-runner --status {UUID_1}")
        assert json.loads(str(status.stdout)) == {
            "uuid": UUID_1,
            "state": "exited",
            "pid": pid,
            "exitCode": 2,
            "signal": None,
            "dispatcherId": None,
            "uid": None,
            "fence": None,
        }
        assert (await conn.run("nodewarden-runner --kill TERM " + UUID_1)).exit_status == 0
        assert (await conn.run("nodewarden-runner --bogus")).exit_status == 2

        busctl = json.loads(str((await conn.run(BUSCTL_LIST_INHIBITORS)).stdout))
        assert busctl == {
            "type": "a(ssssuu)",
            "data": [[["shutdown", "backup", "dump", "block", 0, 9]]],
        }
        text = str((await conn.run("systemd-inhibit --list")).stdout)
        assert text.splitlines()[0].split() == [
            "WHO", "UID", "USER", "PID", "COMM", "WHAT", "WHY", "MODE",
        ]  # fmt: skip
        assert text.endswith("\n1 inhibitors listed.\n")

        ethtool = str((await conn.run("ethtool eth0")).stdout)
        assert "\tSupports Wake-on: pumbg\n\tWake-on: g\n" in ethtool
        assert (await conn.run("ethtool eth7")).exit_status == 1

        telemetry = str((await conn.run(DEFAULT_TELEMETRY_COMMAND)).stdout).splitlines()
        assert telemetry[0].split()[:3] == ["0.05", "0.03", "0.01"]
        assert telemetry[1:] == ["0, 55"]
        assert (await conn.run("frobnicate --now")).exit_status == 127
    assert worker.commands[0] == "systemctl is-system-running"


OBJECT_UID = "3f0c7a52-9d1e-4b8a-9c57-0d9e1f2a3b4c"


async def test_runs_record_their_owner_and_a_lower_token_is_refused(
    worker: StubWorker, client_key: asyncssh.SSHKey, clock: Clock
) -> None:
    """The contract's owner options and fencing: recorded by ``run``, reported by
    ``--list``/``--status``; a token below the highest seen for that dispatcher is
    refused with exit 3 and changes nothing; another dispatcher's tokens do not count."""
    spec = json.dumps({"uuid": UUID_1, "runtime": {}})
    async with await connect(worker, client_key) as conn:
        run = "nodewarden-runner run --detach --dispatcher-id alpha --uid " + OBJECT_UID
        started = await conn.run(f"{run} --fence 7", input=spec)
        assert started.exit_status == 0, started.stderr
        pid = int(str(started.stdout).strip())
        listed = await conn.run("nodewarden-runner --list")
        assert listed.stdout == f"{pid} {UUID_1} dispatcher=alpha uid={OBJECT_UID} fence=7\n"
        status = json.loads(str((await conn.run(f"nodewarden-runner --status {UUID_1}")).stdout))
        assert (status["dispatcherId"], status["uid"], status["fence"]) == ("alpha", OBJECT_UID, 7)

        stale = await conn.run(
            f"nodewarden-runner --kill TERM {UUID_1} --dispatcher-id alpha --fence 6"
        )
        assert stale.exit_status == 3 and "fenced" in str(stale.stderr)
        assert worker.runner.status(UUID_1)["state"] == "running"  # nothing changed
        other = json.dumps({"uuid": UUID_2, "runtime": {}})
        beta = await conn.run(
            "nodewarden-runner run --detach --dispatcher-id beta --fence 1", input=other
        )
        assert beta.exit_status == 0  # beta's tokens are not compared with alpha's
        bad = await conn.run("nodewarden-runner run --detach --fence x", input=other)
        assert bad.exit_status == 2
        kill = await conn.run(
            f"nodewarden-runner --kill TERM {UUID_1} --dispatcher-id alpha --fence 8"
        )
        assert kill.exit_status == 0
        clock.now += 1
        ledger = worker.runner.ledger()
        assert [(r["uuid"], r["end"], r["dispatcherId"]) for r in ledger] == [
            (UUID_1, "killed", "alpha"),
            (UUID_2, None, "beta"),
        ]
        assert ledger[0]["endedAt"] == ledger[0]["startedAt"]  # killed at once (fake clock)
    worker.runner.reboot()
    assert worker.runner.ledger()[1]["end"] == "powerLoss"
    assert worker.runner.highest_fence == {"alpha": 8, "beta": 1}  # kept across the reboot


async def test_refused_auth_and_unknown_client_key(
    worker: StubWorker, client_key: asyncssh.SSHKey
) -> None:
    worker.faults.refuse_auth = True
    with pytest.raises(asyncssh.PermissionDenied):
        await connect(worker, client_key)
    worker.faults.refuse_auth = False
    with pytest.raises(asyncssh.PermissionDenied):
        await connect(worker, asyncssh.generate_private_key("ssh-ed25519"))
    assert list(worker.commands) == []


async def test_wrong_host_key_fault_presents_another_key(worker: StubWorker) -> None:
    genuine = await asyncssh.get_server_host_key("127.0.0.1", worker.port)
    assert genuine is not None
    assert genuine.get_fingerprint() == worker.host_key_fingerprint
    worker.faults.wrong_host_key = True
    other = await asyncssh.get_server_host_key("127.0.0.1", worker.port)
    assert other is not None
    assert other.get_fingerprint() != worker.host_key_fingerprint


async def test_hung_and_slow_commands(worker: StubWorker, client_key: asyncssh.SSHKey) -> None:
    async with await connect(worker, client_key) as conn:
        worker.faults.hang_commands = True
        with pytest.raises(asyncssh.TimeoutError):
            await conn.run("true", timeout=0.3)
        worker.faults.hang_commands = False
        worker.faults.command_delay = 0.2
        start = time.monotonic()
        assert (await conn.run("true")).exit_status == 0
        assert time.monotonic() - start >= 0.19


async def test_poweroff_drops_the_node_and_restart_keeps_its_port(
    client_key: asyncssh.SSHKey,
) -> None:
    powered_off: list[str] = []
    config = StubWorkerConfig(
        authorized_keys=(client_key.export_public_key("openssh").decode(),), name="w1"
    )
    worker = StubWorker(config, on_poweroff=lambda w: powered_off.append(w.config.name))
    port = await worker.start()
    try:
        async with await connect(worker, client_key) as conn:
            started = await conn.run(
                "nodewarden-runner run --detach", input=json.dumps({"uuid": UUID_1})
            )
            assert started.exit_status == 0
            answer = await conn.run("systemctl poweroff")
            assert answer.exit_status == 0
            await asyncio.wait_for(conn.wait_closed(), timeout=10)
        assert powered_off == ["w1"] and worker.powered_off and not worker.running
        with pytest.raises(OSError):
            await asyncio.open_connection("127.0.0.1", port)
        assert await worker.start() == port
        async with await connect(worker, client_key) as conn:
            listed = await conn.run("nodewarden-runner --list")
            assert listed.stdout == ""  # a power cycle loses the containers
    finally:
        await worker.stop()


def test_config_validation() -> None:
    with pytest.raises(ValueError):
        StubWorkerConfig(authorized_keys=())
    with pytest.raises(ValueError):
        StubFaults(runner_crash_rate=1.5)
    with pytest.raises(ValueError):
        StubWorkerConfig(authorized_keys=("ssh-ed25519 AAAA",), boot_delay=-1)


async def test_a_thousand_workers_in_one_process(client_key: asyncssh.SSHKey) -> None:
    public = client_key.export_public_key("openssh").decode()
    fds_before = len(os.listdir("/proc/self/fd"))
    workers = [
        StubWorker(StubWorkerConfig(authorized_keys=(public,), name=f"w{i}", seed=i))
        for i in range(1000)
    ]
    try:
        ports = await asyncio.gather(*(w.start() for w in workers))
        assert len(set(ports)) == 1000
        assert len({w.host_key_fingerprint for w in workers}) == 1000  # each its own key
        for w in workers[::97]:
            async with await connect(w, client_key) as conn:
                assert (await conn.run("systemctl is-system-running")).exit_status == 0
    finally:
        await asyncio.gather(*(w.stop() for w in workers))
    assert len(os.listdir("/proc/self/fd")) <= fds_before + 5  # listeners released
