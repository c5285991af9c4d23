"""The power controller: every power decision for every WorkerNode (side node or cloud VM).

- `controller`   -- `PowerController`, the thin owner: builds the collaborators below over
  one `context.PowerContext` and keeps the public surface (the loop is described there).
- `round`        -- the round: each node stepped through `policy.machine.step`, its
  actions carried out (state persisted before a request, reads, probes, admission).
- `sensing`      -- the BMC power reads and capability discoveries the controller schedules.
- `poolfacts`    -- facts in from the worker pool (probes, cloud list) and the dispatcher.
- `observations` -- facts in from the feed: WorkerNodes, PowerIntents, PowerPolicies.
- `validation`   -- the `Valid` condition and the BMC claims (one machine, one BMC).
- `recording`    -- Safety Records into PowerIntents, decision history, Events, conditions.
- `runtime`      -- `NodeRuntime` (what the controller holds per node) and its settings.
- `demand`       -- queued demand per node (the scheduler's fit rules) and fleet counts.
- `nodestatus`   -- the status fields and conditions the controller writes, the board view.
- `phases`       -- PowerIntent phases derived from a step, and their messages.
- `gauges`       -- the power-path gauges, from every node's runtime.
- `control`      -- how a node's power is observed and changed (Redfish, Wake-on-LAN, SSH
  poweroff, cloud destroy), always through the credential resolver.
- `readings`     -- adapter facts -> the core's readings, with provenance and real times.
- `intents`      -- PowerIntents: manual ones in order per node, policy-made ones, phases.
- `enrolment`    -- a node's BMC and host identity, its enrolment and BMC claim.
- `explain`      -- the live explain document of one node.

`compose.build_controller` composes it beside the dispatcher; they share (`fleet/`) the
policy book, the board and the status writer, and the pool through `fleet.ports`.
"""

from __future__ import annotations
