"""The power controller: every power decision for every WorkerNode (side node or cloud VM).

- `controller` -- `PowerController`: facts in, `policy.machine.step`, actions out, Safety
  Records into PowerIntents, WorkerNode status and Events (the loop is described there).
- `runtime`    -- `NodeRuntime` (what the controller holds per node) and its settings.
- `demand`     -- queued demand per node (the scheduler's fit rules) and fleet counts.
- `nodestatus` -- the status fields and conditions the controller writes, the board view.
- `phases`     -- PowerIntent phases derived from a step, and their messages.
- `gauges`     -- the power-path gauges, from every node's runtime.
- `control`    -- how a node's power is observed and changed (Redfish, Wake-on-LAN, SSH
  poweroff, cloud destroy), always through the credential resolver.
- `readings`   -- adapter facts -> the core's readings, with provenance and real times.
- `intents`    -- PowerIntents: manual ones in order per node, policy-made ones, phases.
- `board`      -- what the dispatcher may ask: admission, state, readiness, wakeability.
- `status`     -- the one writer of WorkerNode status (power fields and the pool's).

`build.build_controller` composes it beside the dispatcher; they share the policy book, the
worker pool (probes, cloud list, destroy), the board and the status writer.
"""

from __future__ import annotations
