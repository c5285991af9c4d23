"""Builds the `nodewarden_doubles.stubworker.StubWorker` behind one stub VM from its `WorkerSpec`.

The VM's init script (parsed by the stub cloud) gives the authorised SSH key, login user
and instance secret; the cloud's fault dice give broken / hung / crash behaviour. A VM
created without a nodewarden init script gets a freshly generated key nobody holds, so
it is unreachable like a real VM without the operator's key.
"""

from __future__ import annotations

import asyncssh

from nodewarden_doubles.stubcloud.cloud import WorkerHandle, WorkerSpec
from nodewarden_doubles.stubworker import StubFaults as WorkerFaults
from nodewarden_doubles.stubworker import StubWorker, StubWorkerConfig


def make_stub_worker(spec: WorkerSpec) -> WorkerHandle:
    if spec.authorized_key:
        key = spec.authorized_key
    else:
        key = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()
    faults = WorkerFaults(
        hang_connect=spec.hung and spec.hung_mode == "connect",
        hang_commands=spec.hung and spec.hung_mode == "commands",
        broken_ready=spec.broken,
        runner_crash_rate=spec.runner_crash_rate,
    )
    config = StubWorkerConfig(
        authorized_keys=(key,),
        name=spec.hostname,
        instance_secret=spec.instance_secret,
        boot_delay=spec.boot_delay,
        seed=spec.seed,
        faults=faults,
    )
    on_poweroff = spec.on_poweroff
    return StubWorker(
        config, on_poweroff=(lambda _worker: on_poweroff()) if on_poweroff is not None else None
    )
