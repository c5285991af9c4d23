"""A node's free capacity while the scheduler plans (pure, mutable during one `plan` call).

`Slot` starts at the node's capacity and is taken from by each container placed on it;
it reports a node holding more than its capacity (`over_capacity`). `side_node_fits` is
the side-node fit rule (GPU servers kept for GPU work).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from nodewarden.scheduling.instancetypes import Requirements
from nodewarden.scheduling.views import NodeView


class Slot:
    """Mutable free capacity of one node during planning."""

    __slots__ = (
        "blocked",
        "containers",
        "free_gpus",
        "free_ram",
        "free_scratch",
        "free_vcpus",
        "soon",
        "soon_at",
        "view",
    )

    def __init__(self, view: NodeView) -> None:
        self.view = view
        self.free_vcpus = view.capacity.vcpus
        self.free_ram = view.capacity.ram
        self.free_scratch = view.capacity.scratch
        self.free_gpus = view.capacity.gpus
        self.containers = 0
        self.blocked = False  # holds a runner of unknown size: nothing more fits
        self.soon: list[int] | None = None
        """vCPUs, RAM, scratch, GPUs held by containers being cancelled (free soon)."""
        self.soon_at: datetime | None = None
        """When the last of them is expected gone."""

    def fits(self, need: Requirements) -> bool:
        cap = self.view.capacity
        return (
            not self.blocked
            and need.vcpus <= self.free_vcpus
            and need.ram <= self.free_ram
            and need.scratch <= self.free_scratch
            and need.gpus <= self.free_gpus
            and cap.preemptible == need.preemptible
            and (need.gpus == 0 or not need.gpu_model or cap.gpu_model == need.gpu_model)
        )

    def take(self, need: Requirements) -> None:
        self.free_vcpus -= need.vcpus
        self.free_ram -= need.ram
        self.free_scratch -= need.scratch
        self.free_gpus -= need.gpus
        self.containers += 1

    def freeing(self, need: Requirements, at: datetime) -> None:
        """What `need` holds is expected back at `at` (a container being cancelled)."""
        soon = self.soon or [0, 0, 0, 0]
        self.soon = [
            soon[0] + need.vcpus,
            soon[1] + need.ram,
            soon[2] + need.scratch,
            soon[3] + need.gpus,
        ]
        self.soon_at = at if self.soon_at is None else max(self.soon_at, at)

    def fits_soon(self, need: Requirements) -> bool:
        """`need` fits once what is being cancelled here is gone (not now)."""
        soon = self.soon
        if soon is None or self.blocked or self.fits(need):
            return False
        cap = self.view.capacity
        return (
            need.vcpus <= self.free_vcpus + soon[0]
            and need.ram <= self.free_ram + soon[1]
            and need.scratch <= self.free_scratch + soon[2]
            and need.gpus <= self.free_gpus + soon[3]
            and cap.preemptible == need.preemptible
            and (need.gpus == 0 or not need.gpu_model or cap.gpu_model == need.gpu_model)
        )

    def block(self) -> None:
        self.blocked = True
        self.containers += 1

    def fullness(self) -> float:
        """How full the node is: the mean used share of its vCPUs and RAM (and GPUs, when
        it has any), 0 idle .. 1 full; a node without capacity counts as full."""
        cap = self.view.capacity
        if cap.vcpus <= 0 or cap.ram <= 0:
            return 1.0
        used = (cap.vcpus - self.free_vcpus) / cap.vcpus + (cap.ram - self.free_ram) / cap.ram
        if cap.gpus > 0:
            return (used + (cap.gpus - self.free_gpus) / cap.gpus) / 3
        return used / 2

    def count(self, need: Requirements) -> int:
        """How many containers of `need` fit beside what the node holds (0 when the node
        is of another market or GPU model, or holds a runner of unknown size)."""
        if not self.fits(need):
            return 0
        free = (self.free_vcpus, self.free_ram, self.free_scratch, self.free_gpus)
        counts = [
            have // asked for have, asked in zip(free, amounts(need), strict=True) if asked > 0
        ]
        return min(counts) if counts else 1 << 30

    @property
    def full(self) -> bool:
        return self.blocked or self.free_vcpus <= 0 or self.free_ram <= 0

    def over(self) -> str | None:
        """What the node holds beyond its capacity, or None when it fits."""
        if min(self.free_vcpus, self.free_ram, self.free_scratch, self.free_gpus) >= 0:
            return None
        cap = self.view.capacity
        used = (
            f"{cap.vcpus - self.free_vcpus} vCPUs, {gib(cap.ram - self.free_ram)} RAM, "
            f"{gib(cap.scratch - self.free_scratch)} scratch, {cap.gpus - self.free_gpus} GPUs"
        )
        holds = (
            f"{cap.vcpus} vCPUs, {gib(cap.ram)} RAM, {gib(cap.scratch)} scratch, {cap.gpus} GPUs"
        )
        return f"runs {self.containers} containers using {used}; it holds {holds}"


def gib(value: int) -> str:
    return f"{value / 2**30:.3g}Gi"


def amounts(need: Requirements) -> tuple[int, int, int, int]:
    """vCPUs, RAM, scratch, GPUs of `need` (in the order of `Capacity`)."""
    return (need.vcpus, need.ram, need.scratch, need.gpus)


def side_node_fits(slot: Slot, need: Requirements) -> bool:
    # Keep GPU servers for GPU work.
    return slot.fits(need) and (need.gpus > 0 or slot.view.capacity.gpus == 0)


def over_capacity(slots: Mapping[str, Slot]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, slot in slots.items():
        over = slot.over()
        if over is not None:
            out[name] = over
    return out
