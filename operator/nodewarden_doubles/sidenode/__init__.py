"""Side nodes that really power-cycle: stub SSH workers that are up only while their power is On.

A side node is a `nodewarden_doubles.stubworker.StubWorker` (the node contract over real
SSH on 127.0.0.1) coupled to a power source:

- a system of the project fake BMC (`FakeBmcPower`, in-process),
- a system of the real sushy-tools emulator (`SushyPower`, polled over HTTPS; the
  emulator runs as a subprocess, `SushyEmulator`),
- no BMC: Wake-on-LAN (`WolPower`), switched On by a magic packet to the
  `WakeOnLanListener` and Off by ``systemctl poweroff`` over SSH.

When the power becomes On the SSH server starts on the node's fixed port after
``boot_delay`` (same host key every boot) and the ready command passes ``ready_delay``
later; ``cat /proc/uptime`` counts from power-on. When it becomes Off the server stops,
every connection drops and running containers are lost. ``systemctl poweroff`` over
SSH stops the server at once and switches the source Off ``shutdown_delay`` later.
Fault knobs per node (`SideNodeFaults`, plus the stub worker's and the fake BMC's own)
change at run time.

In-process::

    node = PoweredSideNode(SideNodeSettings(worker=StubWorkerConfig(authorized_keys=(key,))),
                           FakeBmcPower(bmc, "1"))
    port = await node.start()
    ...
    await node.stop()

As a process (demos, multi-process tests): ``python -m nodewarden_doubles.sidenode
--config FILE --state-dir DIR`` (`server`; config format in `config`), driven from
Python through `SideNodeProcess` and its `SideNodeAdmin` client (`process`).
"""

from __future__ import annotations

from nodewarden_doubles.sidenode.group import SideNodeGroup
from nodewarden_doubles.sidenode.node import (
    FAULT_INHIBITOR,
    NodeEvent,
    PoweredSideNode,
    SideNodeFaults,
    SideNodeSettings,
)
from nodewarden_doubles.sidenode.power import (
    FakeBmcPower,
    PowerReading,
    PowerSource,
    SushyPower,
    WolPower,
)
from nodewarden_doubles.sidenode.sushy import SushyEmulator, SushySystem
from nodewarden_doubles.sidenode.wakeonlan import (
    WakeOnLanListener,
    WakePacketRecord,
    parse_magic_packet,
)

__all__ = [
    "FAULT_INHIBITOR",
    "FakeBmcPower",
    "NodeEvent",
    "PowerReading",
    "PowerSource",
    "PoweredSideNode",
    "SideNodeFaults",
    "SideNodeGroup",
    "SideNodeSettings",
    "SushyEmulator",
    "SushyPower",
    "SushySystem",
    "WakeOnLanListener",
    "WakePacketRecord",
    "WolPower",
    "parse_magic_packet",
]
