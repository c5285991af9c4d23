"""Issue 5 acceptance: 60 mixed containers on the real control plane with the stub cloud."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from clusterkit import ClusterHandle, wait_for
from dispatchkit import DispatchEnv, apply_many, container

pytestmark = pytest.mark.cluster


@pytest.fixture
def env(cluster: ClusterHandle, namespace: str, tmp_path: Path) -> Iterator[DispatchEnv]:
    e = DispatchEnv.create(cluster, namespace, tmp_path, policy={"maxNodes": 12})
    yield e
    e.close()


def test_sixty_mixed_containers_complete_exactly_once(env: DispatchEnv) -> None:
    rng = random.Random(60)
    objs = []
    kinds: dict[str, str] = {}

    def add_cpu(name: str, uid: int, vcpus: int, ram: str) -> None:
        objs.append(
            container(
                name,
                uid,
                vcpus=vcpus,
                ram=ram,
                priority=rng.randint(1, 1000),
                duration=rng.uniform(1, 3),
            )
        )
        kinds[name] = "cpu"

    for i in range(40):
        add_cpu(f"small-{i}", i, rng.choice([1, 2]), rng.choice(["1Gi", "2Gi"]))
    for i in range(10):
        add_cpu(f"medium-{i}", 100 + i, 3, "8Gi")
    for i in range(6):
        add_cpu(f"large-{i}", 200 + i, 7, "20Gi")
    for i in range(3):
        objs.append(
            container(f"gpu-{i}", 300 + i, vcpus=2, ram="8Gi", gpus=1, priority=900, duration=2)
        )
        kinds[f"gpu-{i}"] = "gpu"
    objs.append(container("huge", 999, vcpus=64, ram="500Gi", duration=1))
    assert len(objs) == 60
    op = env.start_operator()
    apply_many(env, objs)

    want = {name: "Complete" for name in kinds} | {"huge": "Failed"}
    env.wait_phases(want, timeout=240)
    statuses = {c["metadata"]["name"]: c["status"] for c in env.containers()}
    huge = statuses["huge"]
    assert huge["reason"] == "NoInstanceTypeFits"
    assert "vCPUs" in huge["schedulingStatus"] and "64" in huge["schedulingStatus"]
    for name in kinds:
        assert statuses[name]["attempts"] == 1, (name, statuses[name])

    # ground truth from the cloud: every container started exactly once, GPU work on GPU VMs
    runs = env.stub.admin.runs()
    counts = Counter(r["uuid"] for r in runs)
    assert len(counts) == 59
    assert set(counts.values()) == {1}, [u for u, n in counts.items() if n != 1]
    vm_sizes = {vm.id: vm.size for vm in env.stub.admin.vms()}
    uuid_of = {o["metadata"]["name"]: o["spec"]["uuid"] for o in objs}
    runs_by_uuid = {r["uuid"]: r for r in runs}
    for name, kind in kinds.items():
        if kind == "gpu":
            vm = runs_by_uuid[uuid_of[name]]["instanceId"]
            assert vm_sizes.get(vm, "g5.xlarge") == "g5.xlarge"
    # reused and packed: far fewer VMs than containers, several containers per VM
    per_vm = Counter(r["instanceId"] for r in runs)
    assert len(per_vm) < 40, per_vm  # maxNodes 12 at a time; idle ones are replaced over time
    assert max(per_vm.values()) >= 3
    packed = False
    by_vm: dict[str, list[float]] = {}
    for r in runs:
        by_vm.setdefault(r["instanceId"], []).append(float(r["startedAt"]))
    for starts in by_vm.values():
        starts.sort()
        if any(b - a < 0.5 for a, b in itertools.pairwise(starts)):
            packed = True
    assert packed, "no VM ever ran two containers at once"

    # the management status endpoint shows the live view (token required)
    code, _ = op.get("/api/v1/status")
    assert code == 401
    # idle nodes are shut down by the matrix; nothing is left
    env.wait_no_nodes(timeout=120)
    wait_for(
        lambda: (
            not env.stub.admin.vms() or all(v.state == "terminated" for v in env.stub.admin.vms())
        ),
        timeout=30,
    )
