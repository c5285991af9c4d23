"""The prophet: a run's own placement with clairvoyant power and no avoidable wait.

For one run of a policy or peer (the "policy under test"), the prophet keeps its
placement -- every container that finished runs on the node it ran on (a VM instance, or
a side node), nothing else runs -- and redoes power and timing knowing the whole trace:

* **capacity is ready at arrival**: each node is booted ahead (its shortest boot), so a
  container starts at its arrival plus the runner's start latency, unless its node is
  still full with the containers placed there before it (then as soon as it has room,
  never later than in the run) or the trace has only just begun (no boot before it);
* **a node is kept on through an idle gap only when that is cheaper than a cycle**
  (shortest shutdown + shortest boot; `lives` picks, gap by gap, the cheapest way to
  cover a node's busy periods under the fleet's billing);
* where the run waited on purpose and that was cheaper on a node (a container delayed
  into time that node paid for anyway), the prophet keeps the run's start times on that
  node: its waits never exceed the run's.

So the prophet pays for every boot, kept gap and packing loss of the placement, for no
idle timeout, no wasted (evicted) run and no avoidable wait. `prompt_only` gives the
variant that never keeps a run's wait: every container as early as its node has room
(the cost of starting everything promptly with this placement; it may exceed the run's). Each node costs it no more
than in the run (the run's own timing, with the shortest delays and the cheapest gaps,
is one of its choices; its run ends when its work does), so it never costs more than the
run at equal or lower wait, and,
being a schedule that runs the work on booted nodes, never less than the oracle bound:
`tests/simulate/test_peers_prophet.py` checks both on random small traces.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from nodewarden.scheduling.instancetypes import Requirements, effective_requirements
from nodewarden.simulate.accounting import Ledger, billed_us
from nodewarden.simulate.distributions import to_us
from nodewarden.simulate.engine import Simulation
from nodewarden.simulate.fleet import Fleet
from nodewarden.simulate.peers.world import Kind, PeerRun, PeerWorld, fleet_kinds
from nodewarden.simulate.results import RunResult
from nodewarden.simulate.utilisation import dominant_share, weighted_work

_US = 1_000_000
LOOKBACK = 64


@dataclass(frozen=True, slots=True)
class Ran:
    """A container as the run ran it to the end: where, and when it was placed."""

    uuid: str
    arrival: int
    placed: int
    """When the run placed it on its node (its start minus the runner's start latency)."""
    runtime: int
    need: Requirements
    node: str
    """The node instance (a VM from its launch to its termination, or a side node)."""
    kind: Kind
    initially_on: bool


@dataclass(frozen=True, slots=True)
class Delays:
    """A kind's shortest boot and shutdown (µs)."""

    boot: int
    shutdown: int

    @property
    def cycle(self) -> int:
        return self.boot + self.shutdown


def kind_delays(fleet: Fleet, kind: Kind) -> Delays:
    if kind.vm:
        cloud = fleet.cloud
        boot = cloud.create_latency.lower_bound() + cloud.boot.lower_bound()
        return Delays(boot, cloud.shutdown.lower_bound())
    assert kind.group is not None
    return Delays(kind.group.boot.lower_bound(), kind.group.shutdown.lower_bound())


_Interval = tuple[int, int, Requirements]
_Life = tuple[int, int, bool]


class Prophet:
    """Prices a run's placement with clairvoyant power (module docstring)."""

    def __init__(
        self,
        fleet: Fleet,
        trace_end: int,
        sides: Iterable[tuple[str, Kind, bool]],
        prompt_only: bool = False,
    ) -> None:
        self.prompt_only = prompt_only
        self.fleet = fleet
        self.end = trace_end
        self.sides = list(sides)
        self.latency = to_us(fleet.controller.start_latency)
        self.period = to_us(fleet.cloud.billing.period)
        self.minimum = to_us(fleet.cloud.billing.minimum)

    def run(self, ran: Sequence[Ran], name: str, placement: str) -> PeerRun:
        ledger = Ledger()
        nodes: dict[str, list[Ran]] = {}
        for r in sorted(ran, key=lambda r: (r.placed, r.uuid)):
            nodes.setdefault(r.node, []).append(r)
        vm_spans: dict[str, list[tuple[int, int]]] = {}
        idle_sides = {s[0]: s for s in self.sides if s[2]}
        prompts = {
            key: self._prompt(mine, kind_delays(self.fleet, mine[0].kind), mine[0].initially_on)
            for key, mine in nodes.items()
        }
        # the prophet's run ends when its work would (nodes still on are billed to then,
        # as in every row): when the trace does, or its last container, started promptly
        self.end = max([self.end] + [e for p in prompts.values() for _, e, _ in p])
        for key, mine in nodes.items():
            idle_sides.pop(key, None)
            first = mine[0]
            delays = kind_delays(self.fleet, first.kind)
            own = [(r.placed, r.placed + self.latency + r.runtime, r.need) for r in mine]
            prompt = prompts[key]
            options = [
                (self._lives(s, delays, first.initially_on, first.kind.vm), s)
                for s in ((prompt,) if self.prompt_only else (prompt, own))
            ]
            (_, lives), chosen = min(options, key=lambda o: o[0][0])
            for r, (begin, _, _) in zip(mine, chosen, strict=True):
                ledger.waits.append((begin + self.latency - r.arrival) / _US)
                share = dominant_share(r.need, first.kind.capacity)
                ledger.useful += weighted_work(r.runtime, share, first.kind.price)
            self._bill(ledger, first.kind, delays, lives, _merge(chosen))
            if first.kind.vm:
                vm_spans.setdefault(first.kind.name, []).extend((s, e) for s, e, _ in lives)
        for _, kind, _ in idle_sides.values():  # on at the start, never used: switched off
            delays = kind_delays(self.fleet, kind)
            self._bill(ledger, kind, delays, [(0, min(delays.shutdown, self.end), False)], [])
        ledger.slots.update(s[0] for s in self.sides)
        for kind_name, spans in vm_spans.items():
            ledger.slots.update(f"{kind_name}#{i}" for i in range(_concurrency(spans)))
        idle = ledger.cost - ledger.busy_cost
        ledger.idle_by_cause["booting, shutting down, kept through a gap"] = max(0.0, idle)
        label = "prophet, all prompt" if self.prompt_only else "prophet"
        return PeerRun(f"{label} [{name}]", placement, ledger.figures(), 0, 0, ledger.cost)

    def _bill(
        self,
        ledger: Ledger,
        kind: Kind,
        delays: Delays,
        lives: list[_Life],
        busy: list[tuple[int, int]],
    ) -> None:
        for start, end, booted in lives:
            billed = billed_us(end - start, self.period, self.minimum) if kind.vm else None
            ledger.on_interval(start, end, kind.price, billed)
            if booted:
                ledger.cycles += 1
                ledger.boots.append(delays.boot / _US)
        for begin, end in busy:
            ledger.busy_interval(begin, end, kind.price)

    # -- timing -----------------------------------------------------------------------------

    def _prompt(self, mine: list[Ran], delays: Delays, initially_on: bool) -> list[_Interval]:
        """Each container (in the run's order) placed at the earliest moment from its
        arrival with room on its node -- never later than the run placed it."""
        placed: list[_Interval] = []
        cap = mine[0].kind.capacity
        limit = (cap.vcpus, cap.ram, cap.scratch, cap.gpus)
        ready = 0 if initially_on else delays.boot
        for r in mine:
            span = self.latency + r.runtime
            earliest = max(r.arrival, min(ready, r.placed))
            live = [iv for iv in placed if iv[1] > earliest]
            moments = sorted(
                {earliest, r.placed} | {e for _, e, _ in live if earliest < e < r.placed}
            )
            begin = next(
                t for t in moments if t == r.placed or _room(live, t, t + span, r.need, limit)
            )
            placed.append((begin, begin + span, r.need))
        return placed

    # -- power ------------------------------------------------------------------------------

    def _lives(
        self, intervals: list[_Interval], delays: Delays, initially_on: bool, vm: bool
    ) -> tuple[float, list[_Life]]:
        """The cheapest on-periods (start, end, booted) covering the busy periods, each
        ending at the run's end at the latest (or its last busy period's); with their cost."""
        periods = _merge(intervals)
        stop = max(self.end, periods[-1][1])
        if initially_on:
            periods = [(0, 0), *periods]
        if not vm or (self.period == 0 and delays.cycle >= self.minimum):
            lives = self._greedy(periods, delays, initially_on)
        else:
            lives = self._search(periods, delays, initially_on)
        lives = [(s, min(e, max(stop, s)), b) for s, e, b in lives]
        return sum(self._price(s, e, vm) for s, e, _ in lives), lives

    def _price(self, start: int, end: int, vm: bool) -> float:
        return billed_us(end - start, self.period, self.minimum) if vm else end - start

    def _greedy(
        self, periods: list[tuple[int, int]], delays: Delays, initially_on: bool
    ) -> list[_Life]:
        """Per-second billing: each gap alone, kept when no longer than a cycle."""
        out: list[_Life] = []
        start = 0 if initially_on else max(0, periods[0][0] - delays.boot)
        booted = not initially_on
        for (_, end), (nxt, _) in itertools.pairwise(periods):
            if nxt - end > delays.cycle:
                out.append((start, end + delays.shutdown, booted))
                start, booted = nxt - delays.boot, True
        out.append((start, periods[-1][1] + delays.shutdown, booted))
        return out

    def _search(
        self, periods: list[tuple[int, int]], delays: Delays, initially_on: bool
    ) -> list[_Life]:
        """Billing per period, or a minimum charge that binds: the cheapest split (a life
        starts after a gap long enough to cycle; the first one and up to LOOKBACK such
        starts back are tried)."""
        n = len(periods)
        starts = [0] + [j for j in range(1, n) if periods[j][0] - periods[j - 1][1] >= delays.cycle]

        def begin(j: int) -> int:
            return 0 if j == 0 and initially_on else max(0, periods[j][0] - delays.boot)

        best = [0.0] + [math.inf] * n
        choice = [0] * (n + 1)
        for i in range(1, n + 1):
            end = min(periods[i - 1][1] + delays.shutdown, max(self.end, periods[-1][1]))
            earlier = [s for s in starts if s < i]
            for j in {0, *earlier[-LOOKBACK:]}:
                cost = best[j] + self._price(begin(j), end, True)
                if cost < best[i]:
                    best[i], choice[i] = cost, j
        out: list[_Life] = []
        i = n
        while i > 0:
            j = choice[i]
            out.append(
                (begin(j), periods[i - 1][1] + delays.shutdown, not (j == 0 and initially_on))
            )
            i = j
        return out[::-1]


def _room(
    live: list[_Interval], begin: int, end: int, need: Requirements, limit: tuple[int, ...]
) -> bool:
    """`need` fits beside `live` all through [begin, end)."""
    moments = [begin] + [b for b, _, _ in live if begin < b < end]
    for t in moments:
        used = [need.vcpus, need.ram, need.scratch, need.gpus]
        for b, e, n in live:
            if b <= t < e:
                used[0] += n.vcpus
                used[1] += n.ram
                used[2] += n.scratch
                used[3] += n.gpus
        if any(u > cap for u, cap in zip(used, limit, strict=True)):
            return False
    return True


def _merge(intervals: Iterable[tuple[int, int, object]]) -> list[tuple[int, int]]:
    """Busy periods: overlapping or touching intervals joined, in order."""
    out: list[tuple[int, int]] = []
    for begin, end, _ in sorted(intervals, key=lambda iv: (iv[0], iv[1])):
        if out and begin <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((begin, end))
    return out


def _concurrency(spans: list[tuple[int, int]]) -> int:
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    peak = level = 0
    for _, step in events:
        level += step
        peak = max(peak, level)
    return peak


# -- from a run ---------------------------------------------------------------------------------


def _sides(fleet: Fleet) -> list[tuple[str, Kind, bool]]:
    return [
        (name, kind, kind.group.initial_power == "On")
        for kind in fleet_kinds(fleet)
        if kind.group is not None
        for name in kind.members
    ]


def prophet_of_world(world: PeerWorld, prompt_only: bool = False) -> PeerRun:
    """The prophet of a peer's finished run (`PeerWorld.run` first)."""
    latency = world.start_latency
    kinds = {name: k for k in world.kinds for name in (k.members or (k.name,))}
    ran = []
    for c in world.containers:
        if not c.done or c.started is None:
            continue
        name = c.instance.split("@")[0]
        kind = kinds[name] if name in kinds else kinds[name.rsplit("-", 1)[0]]
        initially_on = kind.group is not None and kind.group.initial_power == "On"
        ran.append(
            Ran(
                c.uuid,
                c.spec.arrival,
                c.started - latency,
                c.spec.runtime,
                c.need,
                c.instance,
                kind,
                initially_on,
            )
        )
    peer = world.peer
    prophet = Prophet(world.fleet, world.trace.end, _sides(world.fleet), prompt_only)
    return prophet.run(ran, peer.name, peer.placement)


def prophet_of_simulation(sim: Simulation, result: RunResult, prompt_only: bool = False) -> PeerRun:
    """The prophet of a nodewarden policy's finished run (`Simulation.run` first)."""
    fleet = sim.fleet
    kinds = {name: k for k in fleet_kinds(fleet) for name in (k.members or (k.name,))}
    latency = to_us(fleet.controller.start_latency)
    policy = fleet.cloud.instance_type_policy
    ran = []
    for c in sim.containers:
        if c.finished is None or c.started is None or c.instance is None:
            continue
        name = c.instance.split("@")[0]
        node_kind = kinds[name] if name in kinds else kinds[name[3:].rsplit("-", 1)[0]]
        initially_on = node_kind.group is not None and node_kind.group.initial_power == "On"
        ran.append(
            Ran(
                c.spec.uuid,
                c.spec.arrival,
                c.started - latency,
                c.spec.runtime,
                effective_requirements(c.spec.resources, policy),
                c.instance,
                node_kind,
                initially_on,
            )
        )
    name = result.policy.name
    placement = "nodewarden"
    return Prophet(fleet, sim.trace.end, _sides(fleet), prompt_only).run(ran, name, placement)
