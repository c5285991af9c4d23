"""The capacity ledger under random interleavings, in process (hypothesis).

Two `small` nodes (2 vCPUs each) and containers of 1 or 2 vCPUs; the operations are
arrivals, rounds (with a fresh probe or with the listing of before), slow starts released
with a fate (the runner starts; it starts but the answer times out; it never starts),
starts that fail, cancels, runners that ignore TERM, runners that exit, and takeovers (the
leader dies: the starts it had on the wire reach the node or not, and a new dispatcher
starts from the same API objects and nodes). After every operation:

* safety: no node ever ran more vCPUs than it has (`FakeVM.most_vcpus`, from the configs
  the runners were started with), and the ledger the dispatcher hands on (what the
  scheduler and the power controller count) never holds more than a node has;
* liveness: a Queued container that a node had room for after a probed round is started
  (or at least tried) in the next probed round, and a Locked container without a runner
  is relocked or released within two; "room" is judged from the ground truth (runners,
  starts on the wire, and what the API says is Locked or Running there), in the
  scheduler's order (priority, then age), idle nodes first.

A dispatcher that starts nothing fails the liveness check
(`test_a_dispatcher_that_starts_nothing_fails_the_property`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from fakes import SMALL, FakeVM, Rig, container, name_of
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodewarden.scheduling.views import ContainerView, Phase, Plan

VMS = ("vm-a", "vm-b")
CAPACITY = SMALL.vcpus

Op = tuple[Any, ...]


class Starved(AssertionError):
    """A container waited longer than the property allows while a node had room."""


@dataclass
class World:
    """The rig of the current leader and the checks' memory."""

    rig: Rig
    names: list[str] = field(default_factory=list)
    roomy: set[str] = field(default_factory=set)
    """Queued containers a node had room for after the last probed round."""
    lockless: dict[str, int] = field(default_factory=dict)
    """Locked containers without a runner -> probed rounds in a row they stayed so."""
    ledger_peak: dict[str, int] = field(default_factory=dict)

    @classmethod
    async def make(cls) -> World:
        rig = Rig([SMALL], maxNodes=len(VMS), maxAttempts=50)
        for name in VMS:
            rig.vm(name)
        world = cls(rig)
        world._watch()
        await rig.start()
        return world

    def _watch(self) -> None:
        """Record what the dispatcher hands on after each round (the ledger with the
        starts it just chose), as vCPUs held per node."""

        def planned(views: list[ContainerView], plan: Plan, now: Any) -> None:
            held: dict[str, int] = {}
            for v in views:
                if v.node is None or v.whole_node:
                    continue
                if v.phase is Phase.RUNNING or (v.phase is Phase.LOCKED and not v.runner_absent):
                    held[v.node] = held.get(v.node, 0) + v.resources.vcpus
            for node, vcpus in held.items():
                self.ledger_peak[node] = max(self.ledger_peak.get(node, 0), vcpus)

        self.rig.dispatcher.planned = planned

    @property
    def vms(self) -> dict[str, FakeVM]:
        return self.rig.cloud.vms

    # -- operations --------------------------------------------------------------------

    async def apply(self, op: Op) -> None:
        kind = op[0]
        rig = self.rig
        if kind == "arrive":
            name = f"c{len(self.names)}"
            self.names.append(name)
            rig.api.create(container(name, vcpus=op[1], priority=op[2]))
            self.forget()
        elif kind == "round":
            await self.probed_round()
        elif kind == "stale":
            await rig.unprobed_round()
        elif kind == "slow":
            self.vms[op[1]].slow_starts = op[2]
        elif kind == "release":
            vm = self.vms[op[1]]
            if vm.parked:
                vm.release(vm.parked[0].uuid, op[2])
                await rig.settle()
        elif kind == "fail":
            self.vms[op[1]].start_fails = op[2]
        elif kind == "stubborn":
            self.vms[op[1]].term_stops = not op[2]
        elif kind == "cancel":
            live = [n for n in self.names if rig.api.phase(n) not in ("Complete", "Cancelled")]
            if live:
                rig.api.cancel(live[op[1] % len(live)])
                self.forget()
        elif kind == "exit":
            running = [(vm, u) for vm in self.vms.values() for u in sorted(vm.runners)]
            if running:
                vm, uuid = running[op[1] % len(running)]
                vm.exit(uuid, 0)
        elif kind == "takeover":
            await self.takeover(land=op[1])
        self.check_safety()

    async def takeover(self, land: bool) -> None:
        """The leader dies. The starts it had on the wire reach the node (`land`) or not;
        a new dispatcher starts from the same API objects and nodes."""
        old = self.rig
        for vm in self.vms.values():
            for parked in list(vm.parked):
                if land and parked.fate != "fail":
                    old.prober.land(vm, parked)
        await old.dispatcher.stop()
        for vm in self.vms.values():
            vm.parked.clear()
        self.rig = Rig(
            api=old.api, cloud=old.cloud, clock=old.clock, maxNodes=len(VMS), maxAttempts=50
        )
        self._watch()
        await self.rig.start()
        self.forget()

    def forget(self) -> None:
        """Arrivals, cancels and takeovers change who may have the room: liveness is judged
        again from the next probed round."""
        self.roomy = set()
        self.lockless = {}

    # -- checks ------------------------------------------------------------------------

    def vcpus(self, name: str) -> int:
        return int(self.rig.api.objects[name]["spec"]["resources"]["vcpus"])

    def check_safety(self) -> None:
        for vm in self.vms.values():
            assert vm.most_vcpus <= CAPACITY, f"{vm.name} ran {vm.most_vcpus} vCPUs"
        for node, vcpus in self.ledger_peak.items():
            assert vcpus <= CAPACITY, f"the ledger held {vcpus} vCPUs on {node}"

    def used(self) -> dict[str, int]:
        """Ground truth: vCPUs on each node from its runners, the starts on the wire to it
        and what the API says is Locked or Running there."""
        api = self.rig.api
        on: dict[str, dict[str, int]] = {n: {} for n in VMS}
        for vm in self.vms.values():
            for uuid in vm.runners:
                on[vm.name][uuid] = vm.runner_vcpus.get(uuid) or 1
            for parked in vm.parked:
                on[vm.name][parked.uuid] = int(parked.config["resources"]["vcpus"])
        for name in self.names:
            status = api.status(name)
            if status.get("phase") in ("Locked", "Running") and status.get("node") in on:
                held = (status.get("resources") or {}).get("vcpus") or self.vcpus(name)
                on[status["node"]].setdefault(api.objects[name]["spec"]["uuid"], held)
        return {node: sum(uuids.values()) for node, uuids in on.items()}

    def eligible(self) -> list[str]:
        """Queued containers the dispatcher may place now, in the scheduler's order."""
        api, d = self.rig.api, self.rig.dispatcher
        out = []
        for index, name in enumerate(self.names):
            spec = api.objects[name]["spec"]
            if api.phase(name) not in (None, "Queued") or spec.get("cancel"):
                continue
            if spec["uuid"] in d.ctx.held_back or spec["uuid"] in d.ctx.inflight:
                continue
            out.append((-int(spec["priority"]), index, name))
        return [name for *_, name in sorted(out)]

    def with_room(self) -> set[str]:
        free = {node: CAPACITY - used for node, used in self.used().items()}
        out = set()
        for name in self.eligible():
            need = self.vcpus(name)
            idle = [n for n in VMS if free[n] == CAPACITY]
            node = next((n for n in [*idle, *VMS] if free[n] >= need), None)
            if node is not None:
                free[node] -= need
                out.add(name)
        return out

    async def probed_round(self) -> None:
        tried_before = {vm: len(v.started) for vm, v in self.vms.items()}
        await self.rig.round()
        tried = {name_of(u) for vm, v in self.vms.items() for u in v.started[tried_before[vm] :]}
        waiting = set(self.eligible())
        starved = (self.roomy & waiting) - tried
        if starved:
            raise Starved(f"{sorted(starved)} waited two rounds with room: {self.used()}")
        self.roomy = self.with_room()
        self.check_locks()

    def check_locks(self) -> None:
        api = self.rig.api
        on_wire = {p.uuid for vm in self.vms.values() for p in vm.parked}
        running = {u for vm in self.vms.values() for u in vm.runners}
        still: dict[str, int] = {}
        for name in self.names:
            uuid = api.objects[name]["spec"]["uuid"]
            if api.phase(name) != "Locked" or uuid in running or uuid in on_wire:
                continue
            still[name] = self.lockless.get(name, 0) + 1
            if still[name] > 2:
                raise Starved(f"{name} stayed Locked without a runner for 3 rounds")
        self.lockless = still

    async def quiesce(self) -> None:
        """Faults end, every start on the wire arrives, runners exit one round after they
        started: every container ends, each round judged by the checks."""
        for vm in self.vms.values():
            vm.slow_starts = vm.start_fails = False
            vm.term_stops = True
            vm.release()
        await self.rig.settle()
        self.forget()
        for _ in range(60):
            await self.probed_round()
            self.check_safety()
            if all(
                self.rig.api.phase(n) in ("Complete", "Cancelled", "Failed") for n in self.names
            ):
                return
            for vm in self.vms.values():
                for uuid in sorted(vm.runners):
                    vm.exit(uuid, 0)
        phases = {n: self.rig.api.phase(n) for n in self.names}
        raise Starved(f"containers never finished: {phases}")


async def play(ops: Sequence[Op]) -> None:
    world = await World.make()
    try:
        for op in ops:
            await world.apply(op)
        await world.quiesce()
    finally:
        await world.rig.dispatcher.stop()


VM = st.sampled_from(VMS)
OPS = st.one_of(
    st.tuples(st.just("arrive"), st.sampled_from([1, 2]), st.integers(1, 3)),
    st.tuples(st.just("arrive"), st.sampled_from([1, 2]), st.integers(1, 3)),
    st.tuples(st.just("slow"), VM, st.booleans()),
    st.tuples(st.just("release"), VM, st.sampled_from(["start", "timeout", "fail"])),
    st.tuples(st.just("fail"), VM, st.booleans()),
    st.tuples(st.just("stubborn"), VM, st.booleans()),
    st.tuples(st.just("cancel"), st.integers(0, 9)),
    st.tuples(st.just("exit"), st.integers(0, 9)),
    st.tuples(st.just("takeover"), st.booleans()),
)
AFTER: dict[str, list[Op]] = {
    "nothing": [],
    "round": [("round",)],
    "two rounds": [("round",), ("round",)],
    "stale rounds": [("stale",), ("stale",)],
}
"""What follows each operation: probed rounds, or rounds that plan with the listing of
before (probes run on their own interval)."""


@st.composite
def scenarios(draw: st.DrawFn) -> list[Op]:
    ops: list[Op] = [("slow", vm, draw(st.booleans())) for vm in VMS]
    for _ in range(draw(st.integers(3, 14))):
        ops.append(draw(OPS))
        ops += AFTER[draw(st.sampled_from(sorted(AFTER)))]
    return ops


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)
@given(scenarios())
async def test_the_ledger_never_overcommits_and_never_starves(ops: list[Op]) -> None:
    await play(ops)


async def test_a_dispatcher_that_starts_nothing_fails_the_property(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from nodewarden.dispatch.planner import Planner

    async def execute_nothing(self: Planner, result: Plan, now: Any) -> None:
        return None

    monkeypatch.setattr(Planner, "execute", execute_nothing)
    with pytest.raises(Starved):
        await play([("arrive", 1, 1), ("round",), ("round",), ("round",)])


async def test_slow_starts_on_both_nodes_with_whole_node_containers() -> None:
    # review path (a) as one fixed interleaving: starts in flight, more arrivals
    ops: list[Op] = [("slow", "vm-a", True), ("slow", "vm-b", True)]
    ops += [("arrive", 2, 1), ("round",)] * 3
    ops += [("release", "vm-a", "start"), ("release", "vm-b", "start"), ("round",)]
    await play(ops)
