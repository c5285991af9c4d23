"""Test doubles for nodewarden: first-class, but beside the product, never inside it.

- `stubcloud`  -- a libcloud driver ("nodewarden-stub") whose VMs are real SSH servers on
  127.0.0.1, in-process or as its own server process, with fault injection; the operator
  reaches it through `cloud.driver_plugin: nodewarden_doubles.stubcloud:plugin`.
- `stubworker` -- an in-process asyncssh server that meets the node contract
  (`nodewarden.ssh.protocol`): ready probe, runner, inhibitors, ethtool, telemetry.
- `fakebmc`    -- a Redfish BMC (aiohttp) for behaviours sushy-tools cannot produce.
- `hollow`     -- a hollow fleet (kubemark/KWOK-like): many nodes answered from one
  in-process model below the real prober and power control (`SshProber(dialer=)`,
  `PowerControl(bmc_transport=)`), every power action counted with who sent it.

`make demo`, the tests and the benchmarks use these; the `nodewarden` package never
imports them (a test walks its import graph), so the operator image ships without them.
"""
