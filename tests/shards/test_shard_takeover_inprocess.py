"""The pieces of issue 24 together, in process, before the shard elector exists: two
replicas balance four shard Leases (`shards.balance`) in an in-memory Lease store with
optimistic writes, each shard held through a real `fence.Leadership` on a fake monotonic
clock, and act on the nodes of their shards through the real `PowerControl` (one per held
shard, fenced by that shard's Leadership) over the hollow fleet. Replica A is then cut off
from the API server but keeps running and trying to act: its shards move to B within the
Lease duration, and the hollow BMCs never see A and B interleave on a node. Without the
fence (the canary) they do."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from nodewarden.credentials import CredentialResolver
from nodewarden.credentials.settings import CredentialsConfig
from nodewarden.fence import Fence, Leadership, Unfenced
from nodewarden.power.control import NodeRef, PowerControl
from nodewarden.shards.balance import LeaseSeen, View, decide
from nodewarden.shards.keys import node_key, shard_of
from nodewarden_doubles.hollow import (
    HollowBmcSecrets,
    HollowFleet,
    side_node_spec,
)
from nodewarden_doubles.hollow.bmc import bmc_transports

SHARDS = 4
DURATION = 15.0
MARGIN = 5.0
NODES = [f"node-{i:02d}" for i in range(20)]


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Record:
    holder: str | None = None
    version: int = 0
    transitions: int = 0


@dataclass
class Store:
    """Lease records with resourceVersion semantics: a write names the version it read."""

    records: dict[str, Record] = field(default_factory=dict)

    def write(self, name: str, holder: str | None, version: int) -> Record | None:
        record = self.records.setdefault(name, Record())
        if record.version != version:
            return None
        if holder is not None and holder != record.holder:
            record.transitions += 1
        record.holder, record.version = holder, record.version + 1
        return record


def ref(name: str) -> NodeRef:
    return NodeRef(name, side_node_spec(name))


@dataclass
class Replica:
    name: str
    clock: Clock
    fleet: HollowFleet
    fenced: bool
    cut_off: bool = False
    leaderships: dict[int, Leadership] = field(default_factory=dict)
    controls: dict[int, PowerControl] = field(default_factory=dict)
    seen: dict[str, tuple[int, float]] = field(default_factory=dict)
    """Lease name -> (version, when this replica saw it change): `fence.LeaseWatch`."""
    turn: int = 0

    def observe(self, store: Store) -> None:
        for name, record in store.records.items():
            if name not in self.seen or self.seen[name][0] != record.version:
                self.seen[name] = (record.version, self.clock())

    def lease(self, store: Store, name: str) -> LeaseSeen:
        record = store.records.get(name, Record())
        changed = self.seen.get(name, (0, None))[1]
        return LeaseSeen(record.holder, changed, DURATION)

    def held(self) -> frozenset[int]:
        return frozenset(s for s, lead in self.leaderships.items() if lead.valid)

    def balance(self, store: Store) -> None:
        """Renew, then release and acquire as `balance.decide` says (no I/O when cut off)."""
        for lead in self.leaderships.values():
            lead.beat()
        if self.cut_off:
            return
        self.observe(store)
        member = f"member-{self.name}"
        store.write(member, self.name, store.records.get(member, Record()).version)
        for shard in self.held():
            name = f"shard-{shard}"
            sent = self.clock()
            written = store.write(name, self.name, store.records[name].version)
            if written is not None:
                self.leaderships[shard].renewed(sent, written.transitions)
        self.observe(store)
        view = View(
            me=self.name,
            shards=SHARDS,
            held=self.held(),
            leases={s: self.lease(store, f"shard-{s}") for s in range(SHARDS)},
            members={
                n.removeprefix("member-"): self.lease(store, n)
                for n in store.records
                if n.startswith("member-")
            },
            now=self.clock(),
        )
        decision = decide(view)
        for shard in decision.release:
            self.leaderships[shard].step_down("rebalanced", clean=True)
            store.write(f"shard-{shard}", None, store.records[f"shard-{shard}"].version)
        for shard in decision.acquire:
            name = f"shard-{shard}"
            sent = self.clock()
            written = store.write(name, self.name, store.records.get(name, Record()).version)
            if written is not None:
                lead = Leadership(name, DURATION, MARGIN, clock=self.clock)
                lead.renewed(sent, written.transitions)
                self.leaderships[shard] = lead
                fence: Fence = lead if self.fenced else Unfenced()
                self.controls[shard] = control(self.fleet, self.name, fence)
        self.observe(store)

    async def act(self) -> None:
        """One power request to one node of every shard this replica has a control for
        (a replica cut off keeps trying: only the fence stops it)."""
        self.turn += 1
        for shard, power in sorted(self.controls.items()):
            mine = [n for n in NODES if shard_of(node_key("fleet", n), SHARDS) == shard]
            node = mine[self.turn % len(mine)]
            action = "GracefulShutdown" if self.turn % 2 else "On"
            await power.request(ref(node), f"{self.name}-{self.turn}", 1, action)


def control(fleet: HollowFleet, replica: str, fence: Fence) -> PowerControl:
    resolver = CredentialResolver(
        HollowBmcSecrets(), "ns", CredentialsConfig(bmc_endpoints=["127.0.0.1:9"], secret_ttl="0s")
    )
    return PowerControl(
        resolver,
        None,
        None,
        lambda: datetime.now(tz=UTC),
        fence=fence,
        user_agent=f"nodewarden/0.1.0 (power; dispatcher=nw; replica={replica})",
        bmc_transport=bmc_transports(fleet),
    )


async def run(fenced: bool) -> tuple[HollowFleet, dict[str, Replica], float | None]:
    clock = Clock()
    fleet = HollowFleet(clock=clock)
    fleet.add(NODES)
    store = Store()
    replicas = {n: Replica(n, clock, fleet, fenced) for n in ("a", "b")}
    cut_at, all_b_at = 40.0, None
    try:
        while clock.now < 100:
            if clock.now == cut_at:
                replicas["a"].cut_off = True
            for replica in replicas.values():
                replica.balance(store)
            for replica in replicas.values():
                await replica.act()
            if clock.now > cut_at and all_b_at is None and len(replicas["b"].held()) == SHARDS:
                all_b_at = clock.now - cut_at
            clock.now += 1.0
    finally:
        for replica in replicas.values():
            for power in replica.controls.values():
                await power.close()
    return fleet, replicas, all_b_at


async def test_a_cut_off_replica_hands_over_within_the_lease_and_never_overlaps() -> None:
    fleet, replicas, all_b_at = await run(fenced=True)
    assert all_b_at is not None and all_b_at <= DURATION + 2, all_b_at
    assert replicas["b"].held() == frozenset(range(SHARDS)) and not replicas["a"].held()
    assert fleet.interleaved() == {}
    # before the cut both acted (two shards each), after it only b, on every node
    assert {a.actor for a in fleet.actions} == {"a", "b"}
    cut_off_acted = [a.at for a in fleet.actions if a.actor == "a" and a.at >= 40]
    assert cut_off_acted and max(cut_off_acted) < 40 + DURATION - MARGIN + 1  # then fenced
    last = {n: [a.actor for a in fleet.actions if a.node == n][-1] for n in NODES}
    assert set(last.values()) == {"b"}


async def test_without_the_fence_the_hollow_bmcs_see_two_owners() -> None:
    fleet, _, _ = await run(fenced=False)
    assert fleet.interleaved() != {}


async def test_before_the_cut_the_shards_are_split_two_and_two() -> None:
    clock = Clock()
    fleet = HollowFleet(clock=clock)
    fleet.add(NODES)
    store = Store()
    replicas = [Replica(n, clock, fleet, fenced=True) for n in ("a", "b")]
    for _ in range(3):
        for replica in replicas:
            replica.balance(store)
        clock.now += 1
    assert sorted(len(r.held()) for r in replicas) == [2, 2]
    assert replicas[0].held().isdisjoint(replicas[1].held())
    for replica in replicas:
        for power in replica.controls.values():
            await power.close()
