"""The cross-process admission protocol (docs/sharding.md section 2, `fleet.admission`)
raced on the real API server.

The leader's start (lock write on ContainerDispatch C naming WorkerNode X, then a quorum
read of X's admission) and the shard owner's shutdown (`status.admission: Closed` on X,
then a quorum read of the containers) run as two tasks, each with its own API client (as
two processes would). A barrier hook before each of the four operations forces each of
the six interleavings that keep each side's own order; then many runs with no barrier
(random jitter only) race them freely. The counts are simple counters on the two
sequences' outcomes (not the hollow fleet): a runner start on X is counted when the start
sequence says RUN, a power-off of X when the shutdown sequence may send. The check:
never both a start on X and a power-off of X that did not see C.

The canary reads from a cache instead: the ContainerDispatches and WorkerNodes as an
informer held them when the race began (a watch that has not delivered the race's writes
yet -- what a lagging informer serves). It must let both through in some interleaving
(the store-buffering outcome), so the check is known to catch the bug.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from test_admission_race_model import LEADER, OWNER, interleavings

from calibration import scaled
from clusterkit import ClusterHandle
from dispatchkit import container
from nodewarden.api.kinds import CONTAINER_DISPATCH, WORKER_NODE
from nodewarden.dispatch.admitting import ApiAdmission
from nodewarden.fleet import admission
from nodewarden.fleet.admission import Start
from nodewarden.kube.client import Conflict, Kube, api_client_from
from nodewarden.power.admitting import ApiShutdown

pytestmark = pytest.mark.cluster

RANDOM_RUNS = 24


def test_the_model_names_the_operations_as_the_protocol_does() -> None:
    """The orders come from the model (`interleavings`): the same four operations."""
    assert LEADER == (admission.LOCK, admission.READ_ADMISSION)
    assert OWNER == (admission.CLOSE, admission.READ_DEMAND)


# -- the ports over the real API server ----------------------------------------------------


@dataclass
class Pair:
    """One race's objects: WorkerNode X (admission Open) and ContainerDispatch C (Queued)."""

    node: str
    container: str
    container_version: str


class Leader:
    """The start's port: the lock write with the version the plan read (the live
    dispatcher's is `Outcomes.write(precondition=True)`), and the live quorum GET
    (`dispatch.admitting.ApiAdmission`)."""

    def __init__(
        self, kube: Kube, namespace: str, pair: Pair, cache: Mapping[str, Any] | None = None
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.pair = pair
        self.reader = ApiAdmission(kube, namespace)
        self.cache = cache
        """Canary: WorkerNode bodies from a cache that has not seen the race's writes."""

    async def lock(self, container: str, node: str) -> bool:
        status = {"phase": "Locked", "node": node, "lockedBy": "leader", "reason": "Locked"}
        try:
            await self.kube.patch_status(
                CONTAINER_DISPATCH,
                self.namespace,
                container,
                status,
                resource_version=self.pair.container_version,
            )
        except Conflict:
            return False
        return True

    async def read_admission(self, node: str) -> str | None:
        if self.cache is None:
            return await self.reader.read_admission(node)
        body = self.cache.get(node)
        return None if body is None else (body.get("status") or {}).get("admission")


class Owner(ApiShutdown):
    """The shutdown's port: the live one (`power.admitting.ApiShutdown`: a quorum GET of
    the WorkerNode and the admission write with its resourceVersion; a quorum LIST)."""

    def __init__(
        self, kube: Kube, namespace: str, cache: list[Mapping[str, Any]] | None = None
    ) -> None:
        super().__init__(kube, namespace, lambda name, body: None)
        self.cache = cache
        """Canary: ContainerDispatch bodies from a cache that has not seen the race's writes."""

    async def read_containers(self, node: str) -> Iterable[Mapping[str, Any]]:
        if self.cache is not None:
            return self.cache
        return await super().read_containers(node)


# -- the barrier -----------------------------------------------------------------------------


@dataclass
class Barrier:
    """Lets the four operations run one at a time, in `order`: an operation begins only
    once every operation before it in `order` has finished (a side's operation is
    finished when the side reaches its next hook, or ends)."""

    order: list[str]
    done: int = 0
    running: dict[str, str] = field(default_factory=dict)
    seen: list[str] = field(default_factory=list)
    cond: asyncio.Condition = field(default_factory=asyncio.Condition)

    def hook(self, side: str) -> admission.Step:
        async def step(operation: str) -> None:
            async with self.cond:
                self._finished(side)
                if operation not in self.order[self.done :]:
                    return  # not raced (a live side's later round): runs freely
                await self.cond.wait_for(lambda: self.order[self.done] == operation)
                self.running[side] = operation
                self.seen.append(operation)

        return step

    async def end(self, side: str, ops: tuple[str, ...]) -> None:
        async with self.cond:
            self._finished(side)
            # a side that stopped early never runs its remaining operations
            self.order = self.order[: self.done] + [
                op for op in self.order[self.done :] if op not in ops
            ]
            self.cond.notify_all()

    def _finished(self, side: str) -> None:
        if self.running.pop(side, None) is not None:
            self.done += 1
            self.cond.notify_all()


SEED = random.randrange(1 << 32)
JITTER = random.Random(SEED)


async def jitter(operation: str) -> None:
    """A random run's hook: a random pause before each operation, longer before each
    side's first (up to 200 ms: a request takes some tens of ms here), so the runs
    overlap in every way, or not at all."""
    first = operation in (admission.LOCK, admission.CLOSE)
    await asyncio.sleep(JITTER.uniform(0, 0.2 if first else 0.03))


# -- one race ------------------------------------------------------------------------------


@dataclass
class Outcome:
    start: Start
    shutdown: admission.Shutdown

    @property
    def started(self) -> bool:
        return self.start is Start.RUN

    @property
    def powered_off_blind(self) -> bool:
        """A power-off of X sent without the shutdown having seen C as demand."""
        return self.shutdown.may_send


@dataclass
class Race:
    a: Kube
    b: Kube
    namespace: str
    runs: int = 0
    counts: dict[str, int] = field(
        default_factory=lambda: {"starts": 0, "power_offs": 0, "both_backed_off": 0}
    )

    async def pair(self) -> Pair:
        i = self.runs
        self.runs += 1
        node, name = f"x-{i}", f"c-{i}"
        await self.a.create(
            WORKER_NODE,
            self.namespace,
            {
                "metadata": {"name": node},
                "spec": {"nodeType": "CloudVM", "instanceType": "m5.large"},
            },
        )
        await self.a.patch_status(WORKER_NODE, self.namespace, node, {"admission": admission.OPEN})
        body = container(name, 1000 + i)
        created = await self.a.create(
            CONTAINER_DISPATCH, self.namespace, {k: body[k] for k in ("metadata", "spec")}
        )
        return Pair(node, name, created["metadata"]["resourceVersion"])

    async def run(self, barrier: Barrier | None = None, *, cached: bool = False) -> Outcome:
        """One race on a fresh pair: in `barrier`'s order, or freely (random jitter)."""
        pair = await self.pair()
        leader = Leader(self.a, self.namespace, pair)
        owner = Owner(self.b, self.namespace)
        if cached:  # what an informer held when the race began
            leader.cache = {
                b["metadata"]["name"]: b for b in await self.a.list(WORKER_NODE, self.namespace)
            }
            owner.cache = await self.b.list(CONTAINER_DISPATCH, self.namespace)

        async def start() -> Start:
            if barrier is None:
                return await admission.start(leader, pair.container, pair.node, False, jitter)
            try:
                return await admission.start(
                    leader, pair.container, pair.node, False, barrier.hook("leader")
                )
            finally:
                await barrier.end("leader", LEADER)

        async def shutdown() -> admission.Shutdown:
            if barrier is None:
                return await admission.shutdown(owner, pair.node, jitter)
            try:
                return await admission.shutdown(owner, pair.node, barrier.hook("owner"))
            finally:
                await barrier.end("owner", OWNER)

        started, stopped = await asyncio.wait_for(
            asyncio.gather(start(), shutdown()), timeout=scaled(10)
        )
        outcome = Outcome(started, stopped)
        assert started is not Start.LOST and stopped.closed  # each write landed
        self.counts["starts"] += outcome.started
        self.counts["power_offs"] += outcome.powered_off_blind
        self.counts["both_backed_off"] += not outcome.started and not outcome.powered_off_blind
        return outcome

    async def ordered(self, order: tuple[str, ...], *, cached: bool = False) -> Outcome:
        barrier = Barrier(list(order))
        outcome = await self.run(barrier, cached=cached)
        assert tuple(barrier.seen) == order
        return outcome


@pytest.fixture
async def race(cluster: ClusterHandle, namespace: str) -> Any:
    """Two API clients (each side's own, as two processes would have)."""
    api_a = await api_client_from(cluster.kubeconfig)
    api_b = await api_client_from(cluster.kubeconfig)
    try:
        yield Race(Kube(api_a), Kube(api_b), namespace)
    finally:
        await api_a.close()
        await api_b.close()


def check(outcome: Outcome, what: object) -> None:
    assert not (outcome.started and outcome.powered_off_blind), (
        f"{what}: a runner started on X and X was powered off without seeing C"
    )


async def test_every_interleaving_of_a_start_and_a_shutdown_lets_at_most_one_through(
    race: Race,
) -> None:
    began = time.monotonic()
    outcomes = {}
    for order in interleavings():
        outcome = await race.ordered(order)
        check(outcome, order)
        outcomes[order] = (outcome.started, outcome.powered_off_blind)
    # each side alone first goes through; fully interleaved, both back off
    assert outcomes[LEADER + OWNER] == (True, False)
    assert outcomes[OWNER + LEADER] == (False, True)
    assert sum(not s and not p for s, p in outcomes.values()) == 4
    for _ in range(RANDOM_RUNS):
        outcome = await race.run()
        check(outcome, "a concurrent run")
    print(
        f"\nadmission race: 6 orders + {RANDOM_RUNS} concurrent runs (seed {SEED}), {race.counts} "
        f"({time.monotonic() - began:.1f}s)"
    )
    assert (
        race.counts["starts"] + race.counts["power_offs"] + race.counts["both_backed_off"]
        == 6 + RANDOM_RUNS
    )


async def test_the_canary_reading_a_cache_powers_off_under_a_started_runner(race: Race) -> None:
    blind = []
    for order in interleavings():
        outcome = await race.ordered(order, cached=True)
        if outcome.started and outcome.powered_off_blind:
            blind.append(order)
    # at least whenever both writes come before both reads (store buffering): a cache
    # that has not seen the other side's write lets both through
    writes_first = {o for o in interleavings() if set(o[:2]) == {admission.LOCK, admission.CLOSE}}
    assert writes_first <= set(blind), blind
