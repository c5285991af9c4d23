"""Cross-process admission through the live code paths (docs/sharding.md section 2), on
only when switched on (`Dispatcher(admission=...)`, `ControllerSettings.
cross_process_admission`):

- the dispatcher's start (`dispatch.runners`, the in-process rig of tests/dispatch/inproc:
  fake cloud, pool and SSH, the real `Dispatcher`): after its lock write, the node's
  admission is read from the **real API server** (`dispatch.admitting.ApiAdmission`).
  The in-memory board says Open, the WorkerNode on the API server says Closed (a shard
  owner in another process closed it): nothing starts, the container is requeued counting
  no attempt; once the API server says Open, it starts. Switched off, the same start goes
  ahead on the board's word alone -- what the switch is for.
- the power controller's shutdown (`power.round` -> `power.admitting.ShutdownGate`, the
  in-process harness of tests/power/inproc on the in-memory API): a ContainerDispatch
  locked on the node by a leader in another process (this process's ledger never saw
  it) holds the shutdown request back for as long as it holds the node; switched off, the
  request is sent over it.
"""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
for room in ("dispatch/inproc", "power/inproc"):
    if str(TESTS / room) not in sys.path:
        sys.path.insert(0, str(TESTS / room))

import pytest  # noqa: E402
from fakes import Rig, container  # noqa: E402
from harness import PowerHarness  # noqa: E402
from powerfakes import NS  # noqa: E402

from clusterkit import ClusterHandle  # noqa: E402
from nodewarden.api.kinds import CONTAINER_DISPATCH, WORKER_NODE  # noqa: E402
from nodewarden.dispatch.admitting import ApiAdmission  # noqa: E402
from nodewarden.kube.client import Kube, api_client_from  # noqa: E402
from nodewarden.power.admitting import ApiShutdown  # noqa: E402
from nodewarden.power.runtime import ControllerSettings  # noqa: E402


@pytest.mark.cluster
async def test_a_start_reads_the_nodes_admission_from_the_api_server_after_its_lock(
    cluster: ClusterHandle, namespace: str
) -> None:
    api = await api_client_from(cluster.kubeconfig)
    kube = Kube(api)
    try:
        spec = {"nodeType": "CloudVM", "instanceType": "small"}
        await kube.create(WORKER_NODE, namespace, {"metadata": {"name": "vm-a"}, "spec": spec})
        await kube.patch_status(WORKER_NODE, namespace, "vm-a", {"admission": "Closed"})
        reader = ApiAdmission(kube, namespace)

        off = Rig()  # the switch off: the in-memory board alone
        off.vm("vm-a")
        await off.start()
        off.api.create(container("c1"))
        await off.rounds(2)
        assert off.runners() == {"c1": "vm-a"}

        on = Rig()
        on.dispatcher.ctx.admission = reader
        on.vm("vm-a")
        await on.start()
        on.api.create(container("c1"))
        await on.rounds(3)
        assert on.starts() == []
        assert reader.reads >= 1
        status = on.api.status("c1")
        assert (status["phase"], status["reason"]) == ("Queued", "AdmissionClosed"), status
        assert status.get("attempts", 0) == 0 and status["lockFlaps"] == 3  # one a round
        assert "closed after the lock" in status["schedulingStatus"]
        await on.rounds(20)  # held back after policy maxLockFlaps (3): no lock meanwhile
        assert on.api.status("c1")["lockFlaps"] == 3

        await kube.patch_status(WORKER_NODE, namespace, "vm-a", {"admission": "Open"})
        for _ in range(30):  # until the hold-back (30 s after the last lock) ends
            await on.round()
            if on.runners():
                break
        assert on.runners() == {"c1": "vm-a"}
        assert on.api.status("c1")["attempts"] == 1
    finally:
        await api.close()


def locked_elsewhere(h: PowerHarness, node: str) -> None:
    """A ContainerDispatch the leader (another process) locked on `node`."""
    body = {
        "metadata": {"name": "c-remote"},
        "spec": {"uuid": "c-remote", "resources": {"vcpus": 1, "ram": "1Gi"}},
        "status": {"phase": "Locked", "node": node, "lockedBy": "leader"},
    }
    h.kube.put(CONTAINER_DISPATCH, NS, body)


async def test_a_shutdown_is_held_while_the_api_server_shows_a_container_locked_on_the_node() -> (
    None
):
    settings = ControllerSettings(cross_process_admission=True)
    async with PowerHarness(settings=settings) as h:
        h.side_node("n1")
        await h.start()
        locked_elsewhere(h, "n1")
        await h.run_for(300, tick=2.0)
        assert not h.control.sent("n1", "GracefulShutdown"), h.dump()
        gate = h.ctrl._ctx.admission
        assert gate is not None and gate.held >= 1
        decisions = [d for d, _ in h.history("n1")]
        assert decisions.index("DRAIN") < decisions.index("NONE")  # held: aborted, reopens
        assert h.state("n1") != "Off"
        # the runner is seen gone (the leader requeued it): the node goes
        h.kube.objects.pop((CONTAINER_DISPATCH.kind, NS, "c-remote"))
        port = gate.port
        assert isinstance(port, ApiShutdown)
        before = port.requests
        await h.run_until(lambda: h.state("n1") == "Off", within=400, what="n1 Off")
        (sent,) = h.control.sent("n1")
        assert sent.action == "GracefulShutdown" and sent.persisted == "SHUTTING_DOWN"
        # what the switch costs a shutdown: a GET (admission already Closed by the state
        # machine's status write) and a LIST
        assert port.requests - before == 2


async def test_switched_off_the_shutdown_goes_over_a_container_it_cannot_see() -> None:
    async with PowerHarness() as h:
        h.side_node("n1")
        await h.start()
        locked_elsewhere(h, "n1")
        await h.run_until(lambda: bool(h.control.sent("n1")), within=400, what="a request")
        assert h.control.sent("n1", "GracefulShutdown")
        assert h.ctrl._ctx.admission is None
