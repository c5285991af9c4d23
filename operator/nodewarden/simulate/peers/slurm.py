"""The SLURM power-save row (SchedMD slurm: doc/html/power_save.shtml, slurm.conf).

Placement (SLURM's own, `SlurmPlacement`): the nodes are a fixed list -- every side node
and, per instance type, cloud nodes (`State=CLOUD`) -- each with a `Weight`, here its
price (cheapest first, a common site choice). A job (priority, then submit time; jobs
need one node, so backfill starts whatever fits) goes to the lowest-weight node with
room, "from powered up nodes first, powering up nodes second and lastly powered down
nodes -- respecting node weights in each set"; jobs share nodes (select/cons_tres). GPU
nodes are a partition of GPU jobs.

Power save: a node idle for `SuspendTime` is suspended by `SuspendProgram` (at most
`SuspendRate` nodes a minute, default 60; the power-save thread looks every 10 s); it
cannot be used for `SuspendTimeout`, then counts as powered down. A job allocated to a
powered-down node resumes it with `ResumeProgram` (at most `ResumeRate` a minute,
default 300) and starts when the node registers; a node that does not register within
`ResumeTimeout` goes DOWN and its jobs are requeued. **The power state is assumed from
the program's exit, never observed**: a power-off the BMC dropped leaves the node on,
and billed, while SLURM takes it for off; resuming it later finds a node that never
rebooted (no new boot time) and it goes DOWN; a dropped power-on never registers and
goes DOWN. A DOWN node is suspended again after SuspendTime ("idle or down") and stays
out of service until a person returns it (never, within a run). VMs are created and
destroyed through the cloud API, which does not drop requests here.

Knobs: SuspendTime (SLURM's default -1 disables power save; 600 s, the guide's example,
is this row's default and the swept knob), SuspendRate 60, ResumeRate 300;
SuspendTimeout and ResumeTimeout set, as a site must, above the fleet's slowest
shutdown and boot (the documented defaults, 30 s and 60 s, are shorter than the built-in
fleet's boots: every resume would end DOWN).

Not modelled: multi-node jobs, backfill reservations, fairshare, per-partition power
settings, ReturnToService, ResumeFailProgram, a ResumeProgram that retries or verifies.
"""

from __future__ import annotations

from collections import deque

from nodewarden.simulate.peers.packing import shape
from nodewarden.simulate.peers.world import (
    PeerWorld,
    Phase,
    PNode,
    delay_upper,
    span,
)

_US = 1_000_000
MINUTE = 60 * _US
POWER_SAVE_INTERVAL = 10 * _US


def _weight(node: PNode) -> tuple[float, str]:
    return (node.kind.price, node.name)


class _Rate:
    """At most `per_minute` actions in any minute (0: no limit)."""

    def __init__(self, per_minute: int) -> None:
        self.limit = per_minute
        self.times: deque[int] = deque()

    def allows(self, now: int) -> bool:
        while self.times and self.times[0] <= now - MINUTE:
            self.times.popleft()
        return not self.limit or len(self.times) < self.limit

    def note(self, now: int) -> None:
        self.times.append(now)


class SlurmPlacement:
    """Lowest weight with room: powered up, powering up, then powered down (module
    docstring)."""

    name = "slurm"

    def __init__(self, resume_rate: int = 300) -> None:
        self.resumes = _Rate(resume_rate)

    def place(self, world: PeerWorld) -> None:
        now = world.now
        up: list[PNode] = []
        coming: list[PNode] = []
        for node in world.nodes.values():
            if node.down or node.cordoned:
                continue
            if node.phase is Phase.READY:
                up.append(node)
            elif node.phase is Phase.BOOTING:
                coming.append(node)
        up.sort(key=_weight)
        coming.sort(key=_weight)
        stuck: set[tuple[object, ...]] = set()
        for c in world.queued():
            key = shape(c.need)
            if key in stuck:
                continue
            chosen = next((n for n in up if n.fits(c.need)), None)
            chosen = chosen or next((n for n in coming if n.fits(c.need)), None)
            if chosen is None and self.resumes.allows(now):
                kind = next(
                    (k for k in world.kinds if k.fits(c.need) and (k.vm or world.off_member(k))),
                    None,
                )
                chosen = world.launch(kind) if kind is not None else None
                if chosen is not None:
                    self.resumes.note(now)
                    coming.append(chosen)
                    coming.sort(key=_weight)
            if chosen is None:
                stuck.add(key)
                continue
            world.assign(c, chosen)


class Slurm:
    """slurmctld's power save (module docstring)."""

    placement = SlurmPlacement.name
    observes_power = False

    def __init__(
        self, suspend_time_s: float = 600.0, suspend_rate: int = 60, resume_rate: int = 300
    ) -> None:
        self.suspend_time = round(suspend_time_s * _US)
        self.name = f"slurm power save SuspendTime={span(suspend_time_s)}"
        self.placer = SlurmPlacement(resume_rate)
        self.suspends = _Rate(suspend_rate)
        self.suspended: dict[str, int] = {}
        self.down_since: dict[str, int] = {}
        self.next_save = 0
        self.timeouts: tuple[int, int] | None = None

    def _timeouts(self, world: PeerWorld) -> tuple[int, int]:
        """(SuspendTimeout, ResumeTimeout): above the fleet's slowest shutdown and boot."""
        if self.timeouts is None:
            fleet = world.fleet
            cloud = fleet.cloud
            down = [world.api + delay_upper(cloud.shutdown), 30 * _US]
            up = [delay_upper(cloud.create_latency) + delay_upper(cloud.boot), 60 * _US]
            for group in fleet.side_nodes:
                lag = delay_upper(group.bmc.latency)
                down.append(lag + delay_upper(group.shutdown))
                up.append(lag + delay_upper(group.boot))
            self.timeouts = (max(down), max(up) + MINUTE)
        return self.timeouts

    def round(self, world: PeerWorld) -> None:
        suspend_timeout, resume_timeout = self._timeouts(world)
        now = world.now
        self.placer.place(world)
        for name, since in list(self.suspended.items()):
            node = world.nodes.get(name)
            if node is None:
                del self.suspended[name]
            elif now >= since + suspend_timeout:
                world.assume_off(node)
                del self.suspended[name]
            else:
                world.request_round(since + suspend_timeout)
        for node in list(world.nodes.values()):
            if node.phase is Phase.BOOTING and not node.down:
                due = node.launched_at + resume_timeout
                if now >= due:
                    node.down = True
                    self.down_since[node.name] = now
                    world.evict(node)  # its jobs are requeued
                else:
                    world.request_round(due)
        if now >= self.next_save:
            self.next_save = (now // POWER_SAVE_INTERVAL + 1) * POWER_SAVE_INTERVAL
            self._power_save(world)
        if any(n.phase is not Phase.OFF for n in world.nodes.values()):
            world.request_round(self.next_save)

    def _power_save(self, world: PeerWorld) -> None:
        now = world.now
        for node in sorted(world.nodes.values(), key=_weight):
            if node.phase in (Phase.OFF, Phase.STOPPING) or not self.suspends.allows(now):
                continue
            if node.down:
                due = self.down_since.get(node.name, now) + self.suspend_time
            elif node.phase is Phase.READY and node.empty and node.idle_since is not None:
                due = node.idle_since + self.suspend_time
            else:
                continue
            if now >= due:
                self.suspends.note(now)
                world.power_off(node)
                self.suspended[node.name] = now
