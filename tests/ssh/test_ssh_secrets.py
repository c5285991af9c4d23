"""No secret (SSH private key, instance secret) reaches any log record, error or report.

Runs a busy scenario — trust on first use, probes, runner control, failed proofs, host-key
mismatch, refused auth, timeouts, power-off — with every logger at DEBUG (asyncssh at its
"full debug" level 2) and searches everything that was logged or raised.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import asyncssh
import pytest
from pydantic import SecretStr
from ssh_helpers import StubFactory, fast_settings, target_for

from nodewarden.ssh import (
    Endpoint,
    InstanceSecretTrust,
    MappedResolver,
    ProbeThrottle,
    SshClientKey,
    SshError,
    SshProber,
    SshTarget,
)
from nodewarden_doubles.stubworker import StubFaults

INSTANCE_SECRET = "instance-secret-5b1e0c9a77f34d21"
OTHER_NODE_SECRET = "other-node-secret-0a9d8c7b6e5f4321"


class CollectEverything(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.texts: list[str] = []
        self.loggers: set[str] = set()

    def emit(self, record: logging.LogRecord) -> None:
        self.loggers.add(record.name)
        self.texts.append(record.getMessage())
        self.texts.extend(f"{k}={v!r}" for k, v in vars(record).items())
        if record.exc_info:
            self.texts.append(logging.Formatter().formatException(record.exc_info))


@pytest.fixture
def captured() -> Iterator[CollectEverything]:
    handler = CollectEverything()
    root = logging.getLogger()
    ssh_logger = logging.getLogger("asyncssh")
    old_levels = (root.level, ssh_logger.level)
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    ssh_logger.setLevel(logging.DEBUG)
    asyncssh.set_debug_level(2)
    try:
        yield handler
    finally:
        asyncssh.set_debug_level(1)
        root.removeHandler(handler)
        root.setLevel(old_levels[0])
        ssh_logger.setLevel(old_levels[1])


async def test_no_secret_in_logs_errors_or_reports(
    stub: StubFactory, captured: CollectEverything
) -> None:
    raw_key = asyncssh.generate_private_key("ssh-ed25519")
    pem = raw_key.export_private_key("openssh").decode()
    client_key = SshClientKey(SecretStr(pem))
    secrets = [INSTANCE_SECRET, OTHER_NODE_SECRET, pem.strip()]
    secrets += [line for line in pem.splitlines() if len(line) >= 16 and "-----" not in line]

    ours = (client_key.public_key,)
    good = await stub(authorized_keys=ours, instance_secret=SecretStr(INSTANCE_SECRET))
    impostor = await stub(authorized_keys=ours, instance_secret=SecretStr(OTHER_NODE_SECRET))
    hostile = await stub(authorized_keys=ours, faults=StubFaults(wrong_host_key=True))
    refusing = await stub(authorized_keys=ours, faults=StubFaults(refuse_auth=True))
    assert good.port and impostor.port
    resolver = MappedResolver()
    resolver.map("10.250.0.1", Endpoint("127.0.0.1", good.port))
    resolver.map("10.250.0.2", Endpoint("127.0.0.1", impostor.port))
    prober = SshProber(
        fast_settings(command_timeout=0.5), resolver=resolver, throttle=ProbeThrottle(0)
    )
    outputs: list[str] = []
    trust = InstanceSecretTrust(SecretStr(INSTANCE_SECRET))
    try:
        vm1 = SshTarget("vm-1", "10.250.0.1", client_key, trust)
        report = await prober.probe(vm1, inhibitors=True, telemetry=True)
        outputs.append(repr(report))
        started = await prober.start_runner(
            vm1, {"uuid": "zzzzz-dz642-000000000000001", "environment": {"A": "b"}}
        )
        outputs += [repr(started), repr(vm1), repr(trust), str(client_key)]
        good.faults.runner_start_failure_rate = 1.0
        attempts = [
            prober.start_runner(vm1, {"uuid": "zzzzz-dz642-000000000000002"}),
            # Same expected secret, but the node at .2 holds another one: proof fails.
            prober.probe(SshTarget("vm-2", "10.250.0.2", client_key, trust)),
            prober.probe(target_for(hostile, client_key, node="hostile")),
            prober.probe(target_for(refusing, client_key, node="refusing")),
        ]
        raised: list[str] = []
        for attempt in attempts:
            try:
                await attempt
            except SshError as exc:
                raised.append(type(exc).__name__)
                outputs += [str(exc), repr(exc)]
        good.faults.hang_commands = True
        try:
            await prober.check_ready(vm1)
        except SshError as exc:
            raised.append(type(exc).__name__)
            outputs.append(str(exc))
        assert raised == [
            "CommandFailed",
            "InstanceSecretNotProven",
            "HostKeyMismatch",
            "AuthFailed",
            "CommandTimeout",
        ]
        good.faults.hang_commands = False
        outputs.append(repr(await prober.poweroff(vm1)))
    finally:
        await prober.aclose()

    assert len(captured.texts) > 100
    assert {"asyncssh", "nodewarden.ssh.prober"} <= captured.loggers
    haystack = "\n".join(captured.texts + outputs)
    for secret in secrets:
        assert secret not in haystack
