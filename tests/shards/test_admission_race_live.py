"""The admission race through the live code on the real API server: the dispatcher's start
(`Dispatcher` -> `Runners.start`: the lock written by the real `ContainerQueue`, then
`_admitted_after_lock` with `ApiAdmission`) against the power controller's shutdown gate
(`power.admitting.ShutdownGate.may_send` with `ApiShutdown`), in each of the six
interleavings of their four operations (a barrier in front of the queue's lock write and
of the admission read; the gate's own hook).

The dispatcher runs on the in-process rig of tests/dispatch/inproc (fake cloud, pool and
SSH: a runner start on X is counted at the fake VM) except for its queue and admission
reader, which talk to the API server; the board says X is open (this process never
heard of the other's close). A power-off of X is counted when the gate lets the request
go. Never both. Switched off (no `ApiAdmission`), the order in which the shutdown's
re-read comes before the lock starts a runner on the node being switched off: the canary.
"""

from __future__ import annotations

import asyncio
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parents[1]
if str(TESTS / "dispatch/inproc") not in sys.path:
    sys.path.insert(0, str(TESTS / "dispatch/inproc"))

import pytest  # noqa: E402
from fakes import ME, Rig  # noqa: E402
from test_admission_race_cluster import Barrier, Race, race  # noqa: E402, F401
from test_admission_race_model import LEADER, OWNER, interleavings  # noqa: E402

from calibration import scaled  # noqa: E402
from dispatchkit import container  # noqa: E402
from nodewarden.api.kinds import CONTAINER_DISPATCH, WORKER_NODE  # noqa: E402
from nodewarden.config import DispatchSettings  # noqa: E402
from nodewarden.dispatch.admitting import ApiAdmission  # noqa: E402
from nodewarden.dispatch.dispatcher import Dispatcher  # noqa: E402
from nodewarden.dispatch.queue import Container, ContainerQueue  # noqa: E402
from nodewarden.fleet import admission  # noqa: E402
from nodewarden.kube.client import Kube  # noqa: E402
from nodewarden.policy.facts import NodeFacts  # noqa: E402
from nodewarden.policy.state import NodePowerState  # noqa: E402
from nodewarden.power.admitting import ApiShutdown, ShutdownGate  # noqa: E402
from nodewarden.power.runtime import NodeRuntime  # noqa: E402

pytestmark = pytest.mark.cluster


class HookedQueue(ContainerQueue):
    """The real queue; its lock write waits at the barrier first."""

    hook: admission.Step = admission.no_step

    async def write(self, c: Container, status: Any, **kw: Any) -> bool:
        if status.get("phase") == "Locked":
            await self.hook(admission.LOCK)
        return await super().write(c, status, **kw)


class HookedReader:
    """`ApiAdmission`; its read waits at the barrier first."""

    def __init__(self, reader: ApiAdmission, hook: admission.Step) -> None:
        self.reader = reader
        self.hook = hook

    async def read_admission(self, node: str) -> str | None:
        await self.hook(admission.READ_ADMISSION)
        return await self.reader.read_admission(node)


class Live:
    def __init__(self, a: Kube, b: Kube, namespace: str) -> None:
        self.a, self.b, self.namespace = a, b, namespace
        self.runs = 0

    async def race(
        self, order: tuple[str, ...], switched_on: bool = True
    ) -> tuple[bool, bool, dict[str, Any]]:
        """(runner started on X, X powered off, C's status) for one order on fresh objects."""
        i = self.runs
        self.runs += 1
        x = f"vm-{i}"
        spec = {"nodeType": "CloudVM", "instanceType": "small"}
        await self.a.create(WORKER_NODE, self.namespace, {"metadata": {"name": x}, "spec": spec})
        await self.a.patch_status(WORKER_NODE, self.namespace, x, {"admission": admission.OPEN})
        barrier = Barrier(list(order))
        leader_hook, owner_hook = barrier.hook("leader"), barrier.hook("owner")

        rig = Rig()
        queue = HookedQueue(kube=self.a, namespace=self.namespace, dispatcher_id=ME)
        queue.hook = leader_hook
        reader = HookedReader(ApiAdmission(self.a, self.namespace), leader_hook)
        rig.queue = queue  # type: ignore[assignment]
        rig.dispatcher = Dispatcher(
            namespace=self.namespace,
            dispatcher_id=ME,
            settings=DispatchSettings(term_interval=5, term_timeout=30, sync_interval=1),
            queue=queue,
            policies=rig.policies,
            pool=rig.pool,
            cloud=rig.cloud,
            prober=rig.prober,
            board=rig.board,
            clock=rig.clock,
            admission=reader if switched_on else None,
        )
        vm = rig.vm(x)
        await rig.start()
        await rig.round()  # recovered: the first probe round
        body = container(f"c-{i}", 2000 + i)
        created = await self.a.create(
            CONTAINER_DISPATCH, self.namespace, {k: body[k] for k in ("metadata", "spec")}
        )
        queue.observe(created)

        async def leader() -> None:
            try:
                while queue.api_writes == 0:  # until a round locked it (and ran the start)
                    await rig.round()
            finally:
                await barrier.end("leader", LEADER)

        gate = ShutdownGate(
            ApiShutdown(self.b, self.namespace, lambda name, body: None),
            timedelta(seconds=30),
            step=owner_hook,
        )
        now = rig.clock()
        rt = NodeRuntime(x, None, {}, NodePowerState(node=x), NodeFacts(node=x), spec_seen_at=now)

        async def owner() -> bool:
            try:
                return await gate.may_send(rt, now)
            finally:
                await barrier.end("owner", OWNER)

        _, powered_off = await asyncio.wait_for(
            asyncio.gather(leader(), owner()), timeout=scaled(20)
        )
        assert tuple(barrier.seen) == order
        latest = await self.a.get(CONTAINER_DISPATCH, self.namespace, f"c-{i}")
        assert latest is not None
        return bool(vm.started), powered_off, latest.get("status") or {}


@pytest.fixture
def live(request: pytest.FixtureRequest) -> Live:
    """The race fixture's two API clients (imported above)."""
    clients: Race = request.getfixturevalue("race")
    return Live(clients.a, clients.b, clients.namespace)


async def test_the_live_start_and_the_live_shutdown_gate_never_both_go(live: Live) -> None:
    outcomes = {}
    for order in interleavings():
        started, powered_off, status = await live.race(order)
        assert not (started and powered_off), order
        outcomes[order] = (started, powered_off)
        if not started:  # locked, read Closed: unlocked again, no attempt counted
            assert (status["phase"], status["reason"]) == ("Queued", "AdmissionClosed"), status
            assert not status.get("attempts")
    assert outcomes[LEADER + OWNER] == (True, False)
    assert outcomes[OWNER + LEADER] == (False, True)
    # interleaved, the start always backs off; its unlock comes before the re-read when
    # the re-read is the last operation (the leader's read ends with the unlock), then X
    # goes: no container holds it any more
    for order, (started, powered_off) in outcomes.items():
        if order not in (LEADER + OWNER, OWNER + LEADER):
            assert not started, order
            assert powered_off == (order[-1] == admission.READ_DEMAND), order


async def test_switched_off_the_start_runs_on_a_node_the_shutdown_let_go(live: Live) -> None:
    owner_first = (*OWNER, admission.LOCK)  # no admission read when switched off
    started, powered_off, status = await live.race(owner_first, switched_on=False)
    assert started and powered_off
    assert status["phase"] == "Running"
