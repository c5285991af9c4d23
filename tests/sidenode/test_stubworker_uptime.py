"""``cat /proc/uptime`` on the stub worker: seconds since boot, as Linux prints them."""

from __future__ import annotations

from sidenode_helpers import ssh_run

from nodewarden.ssh import SshClientKey
from nodewarden_doubles.stubworker import StubWorker, StubWorkerConfig


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def _uptime(worker: StubWorker, key: SshClientKey) -> str:
    assert worker.port is not None
    return await ssh_run(worker.port, worker.known_hosts_line(), key, "cat /proc/uptime")


async def test_uptime_counts_from_the_last_start_or_the_given_boot_time() -> None:
    key = SshClientKey.generate()
    clock = Clock()
    worker = StubWorker(StubWorkerConfig(authorized_keys=(key.public_key,)), clock=clock)
    await worker.start()
    try:
        clock.now += 12345.67
        line = await _uptime(worker, key)
        up, idle = (float(f) for f in line.split())
        assert line.endswith("\n") and len(line.split()) == 2
        assert up == 12345.67 and idle > 0
        await worker.power_off()
        assert worker.uptime is None
        clock.now += 50
        await worker.start()
        assert (await _uptime(worker, key)).split()[0] == "0.00"  # a fresh boot
        await worker.stop()
        await worker.start(booted_at=clock.now - 30)  # listener restarted, no reboot
        assert (await _uptime(worker, key)).split()[0] == "30.00"
    finally:
        await worker.stop()
