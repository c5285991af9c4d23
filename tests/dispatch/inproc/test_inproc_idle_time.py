"""The management API's `idleSeconds` (`Dispatcher.snapshot`) is the time since the node
last ran a runner -- since its first runner listing with no runner, after it came up
or after its last runner ended -- as the power controller counts idle time
(`power.readings.work_reading`); 0 while a runner runs or before the node is ready.
The real `WorkerPool` folds the probes; only the SSH prober and the credential
resolver are fakes (before, `idle_since` was never written: 0 for every node)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

from fakes import KEY, ME, NS, FakeApi, FakeClock, FakeQueue
from pydantic import SecretStr

from nodewarden.api.workernode import WorkerNodeSpec
from nodewarden.config import DispatchSettings
from nodewarden.dispatch.dispatcher import Dispatcher
from nodewarden.fleet.policies import PolicyBook
from nodewarden.ownership import DISPATCHER_LABEL
from nodewarden.pool.workers import WorkerPool
from nodewarden.ssh.credentials import InstanceSecretTrust, SshTarget
from nodewarden.ssh.facts import ProbeReport, ReadyFact, RunnerProcess, RunnersFact

NODE = "side-1"


class Creds:
    def target(self, node: str) -> SshTarget:
        return SshTarget(
            node=node,
            host="127.0.0.1",
            client_key=KEY,
            trust=InstanceSecretTrust(SecretStr("0" * 64)),
        )


class Resolver:
    """The credential resolver's answer for a side node: always this loopback target."""

    async def ssh(self, node: str, spec: WorkerNodeSpec) -> Creds:
        return Creds()


class Prober:
    """Answers a probe with the node's readiness and runners as the test sets them."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.ready = False
        self.runners: tuple[RunnerProcess, ...] = ()

    async def probe(self, target: SshTarget, **asked: Any) -> ProbeReport:
        now = self.clock()
        state = "Ready" if self.ready else "Booting"
        ready = ReadyFact(target.node, state, 0 if self.ready else 1, "", now, "probe")
        runners = RunnersFact(target.node, self.runners, now, "runner --list")
        return ProbeReport(
            node=target.node,
            endpoint="127.0.0.1:22",
            started_at=now,
            finished_at=now,
            ready=ready,
            runners=runners if self.ready else None,
        )

    async def forget(self, node: str) -> None:
        return None


def side_node() -> Mapping[str, Any]:
    return {
        "metadata": {
            "name": NODE,
            "namespace": NS,
            "resourceVersion": "1",
            "labels": {DISPATCHER_LABEL: ME},
        },
        "spec": {
            "nodeType": "SideNode",
            "controlMethod": "Redfish",
            "capacity": {"vcpus": 4, "ram": "8Gi"},
            "ssh": {"address": "127.0.0.1"},
        },
    }


def side_pool(
    clock: FakeClock, prober: Prober, on_change: Callable[[], None] = lambda: None
) -> WorkerPool:
    """The real worker pool with the fake prober and credential resolver (no cloud)."""
    return WorkerPool(
        kube=None,  # type: ignore[arg-type]
        cloud=None,
        prober=prober,  # type: ignore[arg-type]
        namespace=NS,
        dispatcher_id=ME,
        settings=DispatchSettings(),
        client_key=None,
        master=None,
        takeover_after=lambda: timedelta(hours=1),
        default_policy=None,
        clock=clock,
        on_change=on_change,
        credentials=Resolver(),  # type: ignore[arg-type]
    )


async def test_idle_seconds_count_from_the_last_runner_or_from_ready() -> None:
    clock = FakeClock()
    prober = Prober(clock)
    pool = side_pool(clock, prober)
    dispatcher = Dispatcher(
        namespace=NS,
        dispatcher_id=ME,
        settings=DispatchSettings(),
        queue=FakeQueue(FakeApi()),
        policies=PolicyBook(namespace=NS, default_name="default"),
        pool=pool,
        cloud=None,
        prober=None,
        clock=clock,
    )
    pool.observe_node(side_node())
    await pool.close()  # no probe loop: this test probes when it wants to
    worker = pool.workers[NODE]

    def idle() -> float:
        (node,) = dispatcher.snapshot()["instances"]
        assert node["workerNode"] == NODE
        return float(node["idleSeconds"])

    async def probe(after: float) -> None:
        clock.advance(after)
        await pool.probe_once(worker)

    await probe(0)  # booting: no runner listing yet
    clock.advance(20)
    assert idle() == 0
    prober.ready = True
    await probe(0)  # ready with no runner: idle from now
    clock.advance(30)
    assert idle() == 30
    await probe(10)  # still no runner: still idle since it came up
    assert idle() == 40
    prober.runners = (RunnerProcess(pid=7, uuid="zzzzz-dz642-000000000000001"),)
    await probe(5)
    assert idle() == 0  # a runner runs
    clock.advance(100)
    assert idle() == 0
    prober.runners = ()
    await probe(15)  # its runner ended: idle from this listing
    clock.advance(25)
    assert idle() == 25
