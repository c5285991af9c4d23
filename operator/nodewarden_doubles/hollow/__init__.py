"""A hollow fleet (issue 24 item 4): thousands of nodes answered from one in-process model,
the way kubemark's hollow nodes and KWOK stand in for kubelets.

The operator's own code runs unchanged above two seams of the product:

- SSH: `HollowDialer` is a `nodewarden.ssh.connection.DialerPort` (`SshProber(dialer=...)`).
  The prober's `Connections` (sessions, timeouts, reconnects, the fence guard right before
  a command leaves), its parsers and the runner client are the real ones; only the TCP
  connect, the SSH handshake and the instance-secret proof are skipped. Each command of the
  node contract (`nodewarden.ssh.protocol`) is answered by the model: the ready probe,
  ``RUNNER --list / run --detach / --kill / --status`` (the stub worker's `FakeRunner`,
  fencing tokens included), ``systemctl poweroff``, inhibitors, uptime, the product UUID.
  ``RUNNER --watch`` pushes state lines on change and heartbeats, woken by the model
  (``HollowFleet(streams=False)``: refused as by an older runner, command probes instead).
- BMC: `HollowBmcTransport` is a `nodewarden.redfish.transport.BmcTransport`
  (`PowerControl(bmc_transport=fleet.bmc_transports())`). The Redfish client, its auth
  and `PowerControl` are the real ones; only HTTPS is skipped. One endpoint serves every
  system (`spec.bmc.systemId` = the node's name), as a BMC aggregator does.

Figures measured on it are labelled "SSH/TLS excluded". Every power action and runner
command that reaches a node is recorded with who sent it (`HollowFleet.actions`; the
replica named in the BMC request's User-Agent or given to the dialer), so a test can prove
that no node was acted on by two owners (`HollowFleet.acted_on_by_several`).

Cloud VMs: `StubCloud(worker_factory=hollow_workers(fleet))` (`hollow.cloud`) keeps the
stub cloud's libcloud driver -- reached through the operator's `cloud.driver_plugin`
registry -- and makes each VM that boots a hollow node; its destroy is counted per node.

The operator finds all three through its driver registry: ``cloud.driver_plugin:
nodewarden_doubles.hollow.plugin:plugin`` is the stub cloud's plugin plus the nodes' wires
(`nodewarden.cloud.plugins.WirePlugin`), over the fleet published under the cloud's name
(`HollowFleet.publish`); `compose` builds the prober and power control on them.

Not yet: a model shared by several operator processes (docs/sharding.md section 4).
"""

from __future__ import annotations

from nodewarden_doubles.hollow.bmc import HOLLOW_BMC_ENDPOINT, HollowBmcTransport, bmc_transports
from nodewarden_doubles.hollow.model import ActionRecord, HollowFleet, HollowNode
from nodewarden_doubles.hollow.nodes import HollowBmcSecrets, side_node_spec
from nodewarden_doubles.hollow.ssh import HollowConnection, HollowDialer

__all__ = [
    "HOLLOW_BMC_ENDPOINT",
    "ActionRecord",
    "HollowBmcSecrets",
    "HollowBmcTransport",
    "HollowConnection",
    "HollowDialer",
    "HollowFleet",
    "HollowNode",
    "bmc_transports",
    "side_node_spec",
]
