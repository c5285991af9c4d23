"""The hollow fleet as the operator finds it: a cloud driver plugin that also provides the
nodes' wires (`nodewarden.cloud.plugins.WirePlugin`).

    cloud:
      driver: nodewarden-stub
      driver_plugin: "nodewarden_doubles.hollow.plugin:plugin"
      driver_params: {cloud: NAME}

The stub cloud `NAME` (started in this process with `worker_factory=hollow_workers(fleet)`)
serves the cloud API; the `HollowFleet` published under the same `NAME` answers every SSH
connection (`HollowDialer`, told the replica) and every BMC request (`bmc_transports`). The
operator's `compose` builds its prober and power control on them; nothing above changes.
"""

from __future__ import annotations

from collections.abc import Mapping

from nodewarden.redfish.transport import BmcTransportFactory
from nodewarden.ssh.connection import DialerPort
from nodewarden_doubles.hollow.bmc import bmc_transports
from nodewarden_doubles.hollow.model import HollowFleet
from nodewarden_doubles.hollow.ssh import HollowDialer
from nodewarden_doubles.stubcloud import StubPlugin


def _fleet(driver_params: Mapping[str, object]) -> HollowFleet:
    return HollowFleet.named(str(driver_params.get("cloud", "default")))


class _HollowPlugin(StubPlugin):
    """The stub cloud's plugin (provider, registration, addresses) plus the nodes' wires."""

    def dialer(self, driver_params: Mapping[str, object], replica: str | None) -> DialerPort:
        return HollowDialer(_fleet(driver_params), actor=replica)

    def bmc_transport(self, driver_params: Mapping[str, object]) -> BmcTransportFactory:
        return bmc_transports(_fleet(driver_params))


plugin = _HollowPlugin()
"""Name it in the operator config: ``driver_plugin: nodewarden_doubles.hollow.plugin:plugin``."""
