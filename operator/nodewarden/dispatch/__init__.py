"""The container dispatcher (Arvados crunch-dispatch-cloud lineage): containers only.

- `queue`       ContainerDispatch cache and status writes (lock with a precondition)
- `ports`       the Protocols the dispatcher depends on (queue, pool, cloud, prober)
- `dispatcher`  the main loop: recover, reconcile runners, cancel, plan, execute, lifecycle

The worker pool is `nodewarden.pool`, the shared state `nodewarden.fleet`, and the
composition root that builds them all `nodewarden.compose`.
"""

from __future__ import annotations

from nodewarden.dispatch.dispatcher import Dispatcher

__all__ = ["Dispatcher"]
