"""The GPU-idle verdict (issue 25 item 4): whether a GPU node takes only GPU work now
(admission `GPUOnly`), from its GPU evidence (`facts.GpuWork`, built by `rules.gpuwork`,
whose docstring states the rule). Read by the work gate (`gateblocks.drained`: its
reason code and evidence), the power controller (status and the board) and the
simulator. It never lets a node be switched off: it only narrows what admission admits.
Pure.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from nodewarden.policy.facts import GpuWork, WorkReading

BUSY_PERCENT = 5.0
"""A GPU the probe reads above this (percent) is busy, whatever the ledger says."""


def busy_gpus(gpu: GpuWork, now: datetime, max_age: timedelta) -> int | None:
    """GPUs the probe read busy (None: no reading within `max_age`; [N/A] counts busy)."""
    util, at = gpu.utilisation, gpu.utilisation_at
    if util is None or at is None or now - at > max_age:
        return None
    return sum(1 for u in util if u is None or u > BUSY_PERCENT)


def _cpu_only(work: WorkReading | None) -> GpuWork | None:
    """The GPU evidence of a node that runs work, none of it holding a GPU (else None)."""
    if work is None or work.active_jobs <= 0:
        return None
    gpu = work.gpu
    if gpu is None or gpu.gpu_jobs > 0 or gpu.gpu_idle_since is None:
        return None
    return gpu


def gpu_only(
    work: WorkReading | None,
    idle_threshold: timedelta,
    max_age: timedelta,
    now: datetime,
    enabled: bool = True,
) -> bool:
    """The node takes only GPU work now: it runs CPU work only, its GPUs have been idle
    for the idle threshold and no fresh utilisation reading says otherwise. A node
    running nothing is idle like any other (the usual idle path; Open)."""
    gpu = _cpu_only(work) if enabled else None
    if gpu is None or gpu.gpu_idle_since is None:
        return False
    if now - gpu.gpu_idle_since < idle_threshold:
        return False
    return not busy_gpus(gpu, now, max_age)


def gpu_only_at(
    work: WorkReading | None, idle_threshold: timedelta, enabled: bool = True
) -> datetime | None:
    """When the node turns GPUOnly with nothing else changing (None: not by time)."""
    gpu = _cpu_only(work) if enabled else None
    if gpu is None or gpu.gpu_idle_since is None:
        return None
    return gpu.gpu_idle_since + idle_threshold
