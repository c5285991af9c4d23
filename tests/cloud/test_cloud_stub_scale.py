"""The stub cloud runs 1,000 VMs in one process, each with a real SSH server.

Figures (creation time, memory) are printed; benchmarks/bench_stub_cloud.py measures
them in more detail. Assertions are functional plus generous bounds only.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest

from cloud.cloud_peers import OperatorKey, StubCloudFactory, poll_until, ssh_run, stub_facade
from nodewarden.cloud import InstanceState
from nodewarden.scheduling.instancetypes import InstanceType
from nodewarden.ssh.protocol import DEFAULT_READY_COMMAND

VMS = 1000


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.slow
async def test_one_thousand_vms(
    stub_cloud_factory: StubCloudFactory,
    catalogue: list[InstanceType],
    operator_key: OperatorKey,
) -> None:
    cloud = stub_cloud_factory()
    facade = stub_facade(cloud, catalogue, max_threads=8)
    itype = facade.instance_type("small")
    assert itype is not None
    requests = [
        facade.create_request(
            name=f"wn-{i:04d}", instance_type=itype, ssh_public_key=operator_key.public_line
        )[0]
        for i in range(VMS)
    ]
    rss_before = rss_mib()
    loop = asyncio.get_running_loop()
    start = loop.time()
    created = await asyncio.gather(*(facade.create(r) for r in requests))
    created_after = loop.time() - start
    up = await asyncio.to_thread(cloud.wait_for_workers, VMS, 120)
    listening_after = loop.time() - start
    rss_with = rss_mib()
    print(
        f"\n{VMS} stub VMs: creates done in {created_after:.2f} s, all SSH servers listening "
        f"after {listening_after:.2f} s; RSS {rss_before:.0f} -> {rss_with:.0f} MiB "
        f"({(rss_with - rss_before) * 1024 / VMS:.0f} KiB per VM)"
    )
    assert up == VMS
    assert len({vm.id for vm in created}) == VMS
    addresses = {vm.address() for vm in created}
    assert len(addresses) == VMS
    endpoints = {facade.ssh_endpoint(vm) for vm in created}
    assert len(endpoints) == VMS and all(e.host == "127.0.0.1" for e in endpoints)
    listed = await facade.list_instances()
    assert len(listed) == VMS and all(i.state is InstanceState.RUNNING for i in listed)
    assert rss_with - rss_before < 500  # generous: measured ~25 KiB per VM

    for vm in random.Random(7).sample(created, 5):
        worker: Any = cloud.worker(vm.id)
        result = await ssh_run(
            facade.ssh_endpoint(vm),
            operator_key.private,
            worker.host_public_key,
            DEFAULT_READY_COMMAND,
        )
        assert result.exit_status == 0

    await asyncio.gather(*(facade.destroy(vm) for vm in created))

    async def all_gone() -> bool | None:
        return True if not cloud.vms() else None

    await poll_until(all_gone, timeout=60)
    await facade.close()
