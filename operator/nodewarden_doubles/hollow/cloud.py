"""Hollow VMs for the stub cloud: `StubCloud(worker_factory=hollow_workers(fleet))`.

The stub cloud keeps doing what it does -- the libcloud driver the operator reaches
through its `cloud.driver_plugin` registry (`nodewarden_doubles.stubcloud:plugin`), tags,
quotas, faults, create / destroy delays -- but a VM that boots becomes a node of the
hollow model (named as the VM, On and ready) instead of a real SSH server; the operator's
prober reaches it through `HollowDialer`. A VM the node powers off (``systemctl
poweroff``) is marked stopped by the cloud, as with a real stub worker; a destroyed VM
leaves the model's node gone (``cloud:destroy`` in its actions).
"""

from __future__ import annotations

from nodewarden_doubles.hollow.model import HollowFleet
from nodewarden_doubles.stubcloud.cloud import WorkerFactory, WorkerHandle, WorkerSpec

HOLLOW_SSH_PORT = 9
"""The port a hollow VM reports: loopback discard, never dialled (the hollow dialer
answers in process)."""


class HollowVm:
    """`nodewarden_doubles.stubcloud.cloud.WorkerHandle` of one hollow VM."""

    def __init__(self, fleet: HollowFleet, spec: WorkerSpec) -> None:
        self.fleet = fleet
        self.spec = spec

    async def start(self) -> int:
        name = self.spec.hostname
        self.fleet.add([name])
        self.fleet.nodes[name].on_off = self.spec.on_poweroff
        return HOLLOW_SSH_PORT

    async def stop(self) -> None:
        self.fleet.destroyed(self.spec.hostname)


def hollow_workers(fleet: HollowFleet) -> WorkerFactory:
    def make(spec: WorkerSpec) -> WorkerHandle:
        return HollowVm(fleet, spec)

    return make
