"""The container dispatcher (Arvados crunch-dispatch-cloud lineage): containers only.

- `queue`       ContainerDispatch cache and status writes (lock with a precondition)
- `ports`       the Protocols the dispatcher depends on (queue, pool, cloud, prober)
- `dispatcher`  `Dispatcher`, the entry, composing the collaborators below
- `context`     what the collaborators share (ports, settings, round state)
- `loop`        recovery at start-up and the rounds
- `runners`     runners vs containers, runner starts, runner-gone evidence
- `views`       the scheduler's view of each node (from the power board)
- `planner`     plan from the capacity ledger and carry it out
- `outcomes`    container status writes: ends, requeues, cancellations, waits
- `nodelist`    the management API's node and container list

The worker pool is `nodewarden.pool`, the shared state `nodewarden.fleet`, and the
composition root that builds them all `nodewarden.compose`.
"""

from __future__ import annotations

from nodewarden.dispatch.dispatcher import Dispatcher

__all__ = ["Dispatcher"]
