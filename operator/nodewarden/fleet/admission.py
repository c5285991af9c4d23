"""Admission that crosses processes (docs/sharding.md section 2): the two sequences and
what each of their reads means.

The dispatcher-Lease leader starts runners; the shard owner of node X decides X's
shutdown. With no shared memory, both sides order themselves through the API server
(etcd: writes and quorum reads are linearizable):

- **Shutdown** (`shutdown`): write `status.admission: Closed` on WorkerNode X; once that
  write is acknowledged, a *quorum* read (a GET/LIST without `resourceVersion`, never an
  informer cache) of the ContainerDispatches; only if none holds X (`holding`) may the
  transition be persisted and the power request sent.
- **Start** (`start`): write the lock on ContainerDispatch C naming X; once that write is
  acknowledged, a quorum read of WorkerNode X; only if its admission admits C
  (`admits`) may the runner start, otherwise C is unlocked and planned again.

Each process reads after its own write, so at least one side sees the other's write:
never a runner started on X and a power-off of X that did not see the container (the
model: tests/shards/test_admission_race_model.py; against the real API server:
tests/shards/test_admission_race_cluster.py). Both may back off; each retries on its next
round.

Here: the pure rules (`admits`, `holding`) and the sequences as small coroutines over a
narrow port (`StartPort`, `ShutdownPort`) with a hook before each operation (`Step`: a
test holds each side at a barrier to force an interleaving; the live code passes none).
The adapters that talk to the API server live with their callers (`dispatch.runners`,
`power.admitting`). Imports only the standard library.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

OPEN = "Open"
GPU_ONLY = "GPUOnly"
CLOSED = "Closed"
"""`WorkerNode.status.admission` (api/workernode.py `Admission`): the field this protocol
writes and reads -- the same one the power controller already writes from its state
machine (Closing shows as Closed; GPUOnly is consolidation's GPU-idle narrowing)."""

TERMINAL = frozenset({"Complete", "Cancelled", "Failed"})
"""ContainerDispatch phases that hold no node (api/containerdispatch.py TERMINAL_PHASES)."""

LOCK, READ_ADMISSION = "lock", "read_admission"
CLOSE, READ_DEMAND = "close", "read_demand"
"""The four operations, by the names `Step` is called with (the model's names)."""

Step = Callable[[str], Awaitable[None]]
"""Awaited before each operation with its name (a test's barrier; live: `no_step`)."""


async def no_step(operation: str) -> None:
    return None


# -- the rules: what a quorum read means ---------------------------------------------------


def admits(admission: str | None, gpu_work: bool) -> bool:
    """A start may go on a node whose `status.admission` reads `admission`: Open; GPUOnly
    for work that may use GPUs (`gpu_work`, as `fleet.board.PowerBoard.admits`). Absent
    (a node whose status was never written) or Closed: no start."""
    return admission == OPEN or (admission == GPU_ONLY and gpu_work)


def holds(body: Mapping[str, Any], node: str) -> bool:
    """ContainerDispatch `body` holds `node`: its lock names the node and it is not
    finished. The dispatcher clears `status.node` when it requeues a container and moves
    it to a terminal phase only once its runner is seen gone, so this is "locked to X and
    its runner not seen gone"."""
    status = body.get("status") or {}
    return status.get("node") == node and status.get("phase") not in TERMINAL


def holding(bodies: Iterable[Mapping[str, Any]], node: str) -> tuple[str, ...]:
    """The names of the ContainerDispatches in `bodies` that hold `node` (sorted)."""
    return tuple(
        sorted(str((b.get("metadata") or {}).get("name") or "") for b in bodies if holds(b, node))
    )


# -- the two sequences ---------------------------------------------------------------------


class AdmissionReader(Protocol):
    """The start's read (the live dispatcher writes its lock itself)."""

    async def read_admission(self, node: str) -> str | None:
        """`status.admission` of WorkerNode `node` by a quorum read (None: no such node
        or no admission written). Raises when the API server cannot be read."""
        ...


class StartPort(AdmissionReader, Protocol):
    """What a start needs of the API server."""

    async def lock(self, container: str, node: str) -> bool:
        """Write the lock on `container` naming `node` (resourceVersion precondition;
        fenced by the dispatcher Lease). True once the API server acknowledged it; False
        when it refused it (a conflict: the container changed, plan again)."""
        ...


class ShutdownPort(Protocol):
    """What a shutdown needs of the API server."""

    async def close_admission(self, node: str) -> bool:
        """Write `status.admission: Closed` on WorkerNode `node` (resourceVersion
        precondition; fenced by the node's shard Lease). True once acknowledged (or it
        already reads Closed on the server); False when refused."""
        ...

    async def read_containers(self, node: str) -> Iterable[Mapping[str, Any]]:
        """ContainerDispatch bodies by a quorum read (at least every one whose
        `status.node` is `node`; more is fine, `holding` filters)."""
        ...


class Start(Enum):
    RUN = "run"
    """Locked, and the node admits the container: start the runner."""
    BACK_OFF = "back-off"
    """Locked, but the node's admission is closed to it: unlock the container, plan again."""
    LOST = "lost"
    """The lock write was refused: nothing holds the node, plan again."""


@dataclass(frozen=True, slots=True)
class Shutdown:
    """What the shutdown sequence found."""

    closed: bool
    """The admission write was acknowledged (False: refused, nothing was read)."""
    holding: tuple[str, ...] = ()
    """ContainerDispatches the quorum read found holding the node (demand: no shutdown)."""

    @property
    def may_send(self) -> bool:
        """Persist the transition and send the power request."""
        return self.closed and not self.holding


async def start(
    port: StartPort, container: str, node: str, gpu_work: bool, step: Step = no_step
) -> Start:
    """The leader's start of `container` on `node` (module docstring)."""
    await step(LOCK)
    if not await port.lock(container, node):
        return Start.LOST
    await step(READ_ADMISSION)
    return Start.RUN if admits(await port.read_admission(node), gpu_work) else Start.BACK_OFF


async def admitted_after_lock(
    port: AdmissionReader, node: str, gpu_work: bool, step: Step = no_step
) -> bool:
    """The start's second half, for a caller that wrote the lock itself (the live
    dispatcher: its lock write carries the whole status): the quorum read of `node`'s
    admission after the lock was acknowledged."""
    await step(READ_ADMISSION)
    return admits(await port.read_admission(node), gpu_work)


async def shutdown(port: ShutdownPort, node: str, step: Step = no_step) -> Shutdown:
    """The shard owner's shutdown of `node` up to the send (module docstring)."""
    await step(CLOSE)
    if not await port.close_admission(node):
        return Shutdown(closed=False)
    await step(READ_DEMAND)
    return Shutdown(closed=True, holding=holding(await port.read_containers(node), node))
