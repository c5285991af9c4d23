"""GPU work first on GPU capacity, the power half (issue 25 item 4), in process with a fake
clock: a GPU side node running only CPU work, its GPUs idle, turns GPUOnly (status
admission, the board the dispatcher reads, a Safety Record with the GPU evidence and
`GPU_IDLE_CPU_DRAIN`); the dispatcher's plan then starts GPU work there and no CPU-only
work; it is never switched off while a CPU container runs; once that ends it takes the
usual idle path. With `spec.placement.gpuIdle: Off` it stays Open."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from harness import POLICY, PowerHarness

from nodewarden.api.containerdispatch import ContainerResources
from nodewarden.dispatch.views import NodeViews
from nodewarden.pool.worker import Worker
from nodewarden.scheduling.instancetypes import Catalogue, InstanceType, InstanceTypePolicy
from nodewarden.scheduling.scheduler import plan
from nodewarden.scheduling.views import CloudState, ContainerView, Limits, NodeView, Phase

CPU_TYPE = InstanceType(name="small", provider_type="s1", vcpus=2, ram="8Gi", price=0.10)


def gpu_evidence(h: PowerHarness, node: str) -> dict[str, Any]:
    """The GPU evidence of the work gate in the node's last Safety Record."""
    record = h.ctrl.nodes[node].record
    assert record is not None
    status = record.to_status()
    work = [g for g in status["gates"] if g["gate"] == "work"]
    assert work, status["gates"]
    return {e["name"]: e["value"] for e in work[0]["evidence"] if e["name"].startswith("gpu")}


def side_view(h: PowerHarness, node: str) -> NodeView:
    """The dispatcher's view of side node `node` from the board the controller wrote."""
    body = h.kube.objects[("WorkerNode", "ns", node)]
    worker = Worker(node, None, h.clock(), body=body, side=True)
    return NodeViews._side_view(worker, h.board.view(node), (None, None))


def queued(name: str, gpus: int = 0) -> ContainerView:
    return ContainerView(
        name, Phase.QUEUED, 500, datetime(2026, 1, 1, tzinfo=UTC),
        ContainerResources(vcpus=1, ram="1Gi", gpus=gpus),
    )  # fmt: skip


def relock(name: str, node: str) -> ContainerView:
    """A CPU-only container Locked on `node` whose runner the node said never ran."""
    return replace(queued(name), phase=Phase.LOCKED, node=node, runner_absent=True)


def planned(
    h: PowerHarness, node: str, containers: list[ContainerView], types: tuple[InstanceType, ...]
) -> tuple[dict[str, str], dict[str, str]]:
    """The real scheduler's starts (container -> node or 'new <type>') and unlocks, with
    the node's view from the board the controller wrote and the catalogue `types`."""
    p = plan(
        containers,
        [side_view(h, node)],
        Catalogue(types=types),
        InstanceTypePolicy(),
        Limits(),
        CloudState(),
        h.clock(),
    )
    out = {s.uuid: s.node for s in p.starts}
    for create in p.creates:
        out.update({u: f"new {create.instance_type}" for u in create.for_containers})
    return out, dict(p.unlocks)


def admitted(h: PowerHarness, node: str) -> dict[str, str]:
    """Where a GPU job, a CPU-only job (a CPU type fits it), a CPU-only job nothing
    without GPUs fits (no catalogue), and a CPU-only relock on the node go."""
    fits_elsewhere, _ = planned(h, node, [queued("g", 1), queued("c")], (CPU_TYPE,))
    only_here, _ = planned(h, node, [queued("c-only")], ())
    relocked, unlocked = planned(h, node, [relock("r", node)], (CPU_TYPE,))
    return {
        **fits_elsewhere,
        **only_here,
        **relocked,
        **{u: "unlocked: " + why for u, why in unlocked.items()},
    }


async def test_a_gpu_node_with_idle_gpus_drains_its_cpu_work_and_still_takes_gpu_work() -> None:
    async with PowerHarness() as h:  # idle threshold 60 s
        host = h.side_node("n1")
        await h.start()
        h.queue("cpu-job")
        h.place("cpu-job", "n1")
        host.runners = 1
        await h.run_until(lambda: h.status("n1").get("admission") == "Open", within=60)
        assert h.board.view("n1").gpu_only is False  # type: ignore[union-attr]
        opened = h.clock()
        # Open: GPU work, CPU work nothing else fits, a relock of CPU work (GPU capacity
        # last: CPU work that a CPU type fits never goes to a GPU node)
        assert admitted(h, "n1") == {"g": "n1", "c": "new small", "c-only": "n1", "r": "n1"}

        await h.run_until(lambda: h.status("n1").get("admission") == "GPUOnly", within=120)
        # the GPUs idle since the first reading of its work: the idle threshold (60 s) on
        assert 45 <= (h.clock() - opened).total_seconds() <= 75
        assert "GPU_IDLE_CPU_DRAIN" in h.reasons("n1"), h.history("n1")
        assert h.decision("n1") == "NONE"
        evidence = gpu_evidence(h, "n1")
        assert evidence["gpus"] == 1 and evidence["gpuJobs"] == 0
        assert evidence["gpuOnly"] is True and evidence["gpuIdleSince"] != "busy"
        assert evidence["gpuUtilisation"] == "none read"
        assert h.board.view("n1").gpu_only is True  # type: ignore[union-attr]
        assert h.board.view("n1").admission_open is True  # type: ignore[union-attr]
        # GPUOnly: GPU work still starts there, and CPU work nothing else could ever fit;
        # no other CPU work (the relock is unlocked and placed again elsewhere)
        assert admitted(h, "n1") == {
            "g": "n1",
            "c": "new small",
            "c-only": "n1",
            "r": "unlocked: node n1 takes only GPU work now (admission GPUOnly: its GPUs are idle)",
        }

        # never switched off while the CPU container runs, however long
        await h.run_for(600, tick=5.0)
        assert not h.control.requests
        assert h.state("n1") not in ("Draining", "ShuttingDown", "Off")
        assert h.status("n1")["admission"] == "GPUOnly"

        # the CPU work ends: the usual idle path (idle threshold, drain, observed Off)
        host.runners = 0
        h.finish("cpu-job")
        ended = h.clock()
        await h.run_until(lambda: h.state("n1") == "Off", within=300)
        assert [r.action for r in h.control.requests] == ["GracefulShutdown"]
        shutdown = [i for i in h.intents("n1") if i["spec"]["action"] == "Shutdown"]
        assert shutdown and shutdown[0]["status"]["phase"] == "Succeeded"
        requested = h.control.requests[0].at
        assert (requested - ended).total_seconds() >= 60  # the idle threshold, from the end


async def test_a_gpu_job_arriving_reopens_the_node_to_all_work() -> None:
    async with PowerHarness() as h:
        host = h.side_node("n1")
        await h.start()
        h.queue("cpu-job")
        h.place("cpu-job", "n1")
        host.runners = 1
        await h.run_until(lambda: h.status("n1").get("admission") == "GPUOnly", within=200)
        h.queue("gpu-job", gpus=1)
        h.place("gpu-job", "n1")
        host.runners = 2
        await h.run_until(lambda: h.status("n1").get("admission") == "Open", within=30)
        assert gpu_evidence(h, "n1")["gpuJobs"] == 1
        assert "GPU_IDLE_CPU_DRAIN" not in h.reasons("n1")


async def test_the_lever_off_keeps_a_gpu_node_running_cpu_work_open() -> None:
    policy = {**POLICY, "placement": {"gpuIdle": "Off"}}
    async with PowerHarness(policy=policy) as h:
        host = h.side_node("n1")
        await h.start()
        h.queue("cpu-job")
        h.place("cpu-job", "n1")
        host.runners = 1
        await h.run_for(300, tick=5.0)
        assert h.status("n1")["admission"] == "Open"
        assert "GPU_IDLE_CPU_DRAIN" not in {c for _, cs in h.history("n1") for c in cs}
        assert gpu_evidence(h, "n1")["gpuOnly"] is False
        assert not h.control.requests


async def test_a_restart_never_makes_gpus_look_idle_longer_than_observed() -> None:
    """The GPU idle timer lives in memory: a restart starts it again, from the
    dispatcher's first plan (the ledger that says no container holds a GPU), never from
    before -- not from a runner list read while the dispatcher recovered, nor from the
    time before the restart."""
    async with PowerHarness() as h:  # idle threshold 60 s
        host = h.side_node("n1")
        await h.start()
        h.queue("cpu-job")
        h.place("cpu-job", "n1")
        host.runners = 1
        await h.run_until(lambda: h.status("n1").get("admission") == "GPUOnly", within=120)
        await h.ctrl.stop()
        await h.settle()
    h.clock.advance(30)
    b = PowerHarness(kube=h.kube, hosts=h.hosts, clock=h.clock)
    b.containers.update(h.containers)
    async with b:
        b.recovering = True  # the dispatcher recovers for 2 min; the node answers once
        b.ctrl.await_ledger()
        await b.start()
        b.silent.add("n1")
        await b.run_for(120, tick=5)
        b.recovering = False
        shown: list[str] = []

        def admission() -> str:
            shown.append(str(b.status("n1").get("admission")))
            return shown[-1]

        ledger = b.clock()
        await b.round()  # the first plan, with the runner list of 2 min ago
        admission()
        b.silent.clear()
        await b.run_until(lambda: admission() == "GPUOnly", within=200)
        assert (b.clock() - ledger).total_seconds() >= 60, shown  # the whole threshold again
        assert shown[0] != "GPUOnly"
        since = gpu_evidence(b, "n1")["gpuIdleSince"]
        assert datetime.fromisoformat(since.replace("Z", "+00:00")) >= ledger, since
