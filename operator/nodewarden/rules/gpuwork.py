"""GPU work first on GPU capacity, the power half (issue 25 item 4): when a GPU node takes
only GPU work (admission `GPUOnly`).

A node with GPUs that runs only CPU work, its GPUs idle for the policy's idle threshold,
counts as idle for the GPU rule: it stops taking CPU-only work that could run elsewhere,
so its CPU work drains away, while it still takes GPU work (and CPU-only work that
nothing without GPUs could ever fit, `placement.Ask.gpu_anywhere`). A GPU node running
nothing is idle like any other node (Open, the usual idle path), and one running GPU work
is busy. "Idle GPUs" means, all three:

- no container holds a GPU on it in the dispatcher's capacity ledger (a runner of
  unknown size counts as holding one: what it uses is not known);
- that has been so for at least the policy's idle threshold (`gpu_idle_since`, the same
  rule as the node's idle-since: `rules.readings.idle_since`), as observed by this
  process: the timer lives in memory and a restart starts it again, from the
  dispatcher's first ledger (`with_gpu`'s `ledger_since`) -- never from before the
  restart, so a restart only ever lengthens the evidence asked for, never shortens it;
- the GPU utilisation its last probe read (nvidia-smi), when one answered within the
  policy's telemetry max age, is at most `BUSY_PERCENT` on every GPU (work nodewarden
  does not know of vetoes it). Without such a reading the ledger decides (a node without
  nvidia-smi is judged by what nodewarden runs there).

It never switches a node off: the shutdown gates still see the CPU containers as active
jobs (`policy.gateblocks.drained` fails with `ACTIVE_WORK` and `GPU_IDLE_CPU_DRAIN`,
and records the GPU evidence here), and once the CPU work has ended the
usual idle path applies (idle threshold from the last container's end, min-on, cooldown,
demand, the drain handshake). GPUOnly is not a state of the power machine: the machine's
admission stays Open (only its own shutdown handshake closes it); GPUOnly narrows what
Open admits, and shows as `status.admission: GPUOnly`. Lever: a PowerPolicy's
`spec.placement.gpuIdle` (`Off`: never GPUOnly, earlier releases).

The verdict itself (`gpu_only`, `gpu_only_at`) lives in `policy.gpuidle`, where the
work gate reads it; this module builds the evidence from the ledger and the probe.
Pure: values in, values out; the power controller and the simulator call it alike.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from nodewarden.api.workernode import WorkerNodeSpec
from nodewarden.policy.facts import GpuWork, WorkReading
from nodewarden.policy.gpuidle import BUSY_PERCENT, busy_gpus, gpu_only, gpu_only_at
from nodewarden.rules.readings import idle_since
from nodewarden.scheduling.instancetypes import Catalogue
from nodewarden.scheduling.views import ContainerView, Phase

__all__ = [
    "BUSY_PERCENT",
    "busy_gpus",
    "gpu_counts",
    "gpu_only",
    "gpu_only_at",
    "gpu_work",
    "node_gpus",
    "with_gpu",
    "with_utilisation",
    "work_gpu",
]


def node_gpus(spec: WorkerNodeSpec | None, catalogue: Catalogue) -> int:
    """The GPUs a node offers: a side node's capacity, a cloud VM's instance type."""
    if spec is None:
        return 0
    if spec.node_type == "SideNode":
        return spec.capacity.gpus if spec.capacity is not None else 0
    itype = catalogue.by_name(spec.instance_type) if spec.instance_type else None
    return itype.gpus if itype is not None else 0


def gpu_counts(containers: Iterable[ContainerView]) -> dict[str, int]:
    """Per node: the containers holding GPUs on it in the ledger (Locked or Running
    there, a runner of unknown size included)."""
    out: dict[str, int] = {}
    for c in containers:
        node = c.node
        if node is None or c.phase not in (Phase.LOCKED, Phase.RUNNING):
            continue
        if c.whole_node or c.resources.gpus > 0:
            out[node] = out.get(node, 0) + 1
    return out


def gpu_work(
    gpus: int,
    gpu_jobs: int,
    source: str,
    observed_at: datetime,
    previous: GpuWork | None,
) -> GpuWork | None:
    """The GPU evidence of a node with `gpus` GPUs (None: it has none); `previous` keeps
    the GPU idle-since and the last utilisation read."""
    if gpus <= 0:
        return None
    before = previous.gpu_idle_since if previous is not None else None
    return GpuWork(
        gpus=gpus,
        gpu_jobs=gpu_jobs,
        gpu_idle_since=idle_since(gpu_jobs, observed_at, before),
        source=source,
        observed_at=observed_at,
        utilisation=previous.utilisation if previous is not None else None,
        utilisation_source=previous.utilisation_source if previous is not None else None,
        utilisation_at=previous.utilisation_at if previous is not None else None,
    )


def with_utilisation(
    gpu: GpuWork, utilisation: tuple[float | None, ...] | None, source: str, at: datetime
) -> GpuWork:
    """`gpu` with a probe's GPU utilisation reading (None: no GPU tool answered)."""
    return gpu.model_copy(
        update={"utilisation": utilisation, "utilisation_source": source, "utilisation_at": at}
    )


def with_gpu(
    reading: WorkReading,
    gpus: int,
    gpu_jobs: int,
    previous: WorkReading | None,
    ledger_since: datetime | None = None,
) -> WorkReading:
    """`reading` with the GPU evidence of a node offering `gpus` (`gpu_jobs` from the
    ledger; the previous reading keeps the GPU idle-since and the utilisation read).
    `ledger_since`: since when the ledger `gpu_jobs` comes from has been known (the
    dispatcher's first plan of this process). The GPU evidence is dated no earlier: a
    runner list read before it (a restart: probes answer while the dispatcher recovers)
    says nothing of which containers hold GPUs, so the GPU idle time counts from the
    ledger on -- a restart never makes GPUs look idle longer than they were observed."""
    at = reading.observed_at if ledger_since is None else max(reading.observed_at, ledger_since)
    gpu = gpu_work(gpus, gpu_jobs, reading.source, at, work_gpu(previous))
    if gpu == reading.gpu:
        return reading
    return reading.model_copy(update={"gpu": gpu})


def work_gpu(work: WorkReading | None) -> GpuWork | None:
    """The GPU evidence of a work reading (None: none)."""
    return work.gpu if work is not None else None
