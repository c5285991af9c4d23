"""Issue 5 acceptance: SIGKILL and restart; two dispatchers side by side; takeover."""

from __future__ import annotations

import signal
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from clusterkit import ClusterHandle, wait_for
from dispatchkit import DispatchEnv, apply_many, container

pytestmark = pytest.mark.cluster


@pytest.fixture
def env(cluster: ClusterHandle, namespace: str, tmp_path: Path) -> Iterator[DispatchEnv]:
    e = DispatchEnv.create(cluster, namespace, tmp_path, policy={"maxNodes": 6})
    yield e
    e.close()


def test_sigkill_mid_run_then_restart_runs_nothing_twice_and_loses_nothing(
    env: DispatchEnv,
) -> None:
    first = env.start_operator(name="first")
    objs = [container(f"r{i}", 500 + i, vcpus=2, duration=4 + (i % 5)) for i in range(20)]
    apply_many(env, objs)

    def running_enough() -> bool:
        phases = env.phases()
        return sum(p == "Running" for p in phases.values()) >= 4

    wait_for(running_enough, timeout=120, interval=0.5, what="several containers running")
    first.stop(signal.SIGKILL)
    time.sleep(3)  # runners keep going (and some finish) while no operator watches
    second = env.start_operator(name="second")
    env.wait_phases({o["metadata"]["name"]: "Complete" for o in objs}, timeout=240)
    runs = env.stub.admin.runs()
    counts = Counter(r["uuid"] for r in runs)
    assert len(counts) == 20, "a container never ran"
    assert set(counts.values()) == {1}, {u: n for u, n in counts.items() if n > 1}
    for c in env.containers():
        assert c["status"]["attempts"] == 1, c["status"]
    assert "dispatcher recovered" in second.logs()
    env.wait_no_nodes(timeout=120)


def test_two_dispatchers_share_a_cloud_and_one_takes_over_the_other(
    cluster: ClusterHandle, namespace: str, tmp_path: Path
) -> None:
    other_ns = f"t-{uuid.uuid4().hex[:10]}"
    cluster.kubectl("create", "namespace", other_ns)
    alpha = DispatchEnv.create(
        cluster,
        namespace,
        tmp_path / "alpha",
        dispatcher_id="alpha",
        policy={
            "dispatch": {
                "maxAttempts": 3,
                "lameAfter": "60s",
                "lameMinProbes": 3,
                "takeoverAfter": "15s",
            }
        },
    )
    beta = DispatchEnv.create(
        cluster,
        other_ns,
        tmp_path / "beta",
        stub=alpha.stub,
        dispatcher_id="beta",
        ssh_key=alpha.ssh_key,
        policy={"idleThreshold": "1h"},
    )
    try:
        alpha.start_operator()
        beta_op = beta.start_operator()
        apply_many(alpha, [container(f"a{i}", 600 + i, duration=2) for i in range(4)])
        apply_many(beta, [container(f"b{i}", 700 + i, duration=2) for i in range(4)])
        alpha.wait_phases({f"a{i}": "Complete" for i in range(4)}, timeout=120)
        beta.wait_phases({f"b{i}": "Complete" for i in range(4)}, timeout=120)
        # each ran only on its own dispatcher's VMs
        runs = alpha.stub.admin.runs()
        vms = {vm.id: vm for vm in alpha.stub.admin.vms()}
        beta_vms = {vm.id for vm in beta.ours()}
        assert beta_vms, "beta keeps its idle nodes (idle threshold 1h)"
        for r in runs:
            owner_tag = (
                "beta"
                if r["uuid"].endswith(tuple(f"{700 + i:015d}" for i in range(4)))
                else "alpha"
            )
            if owner_tag == "beta":
                assert r["instanceId"] in beta_vms
        # alpha never claimed beta's live instances
        assert "claiming instance" not in alpha.operators[0].logs()
        assert all(vms[v].tags.get("nodewarden-dispatcher") == "beta" for v in beta_vms)
        # stop beta: after the takeover time alpha claims its instances and (idle) shuts them down
        beta_op.stop()
        wait_for(
            lambda: "claiming instance" in alpha.operators[0].logs(),
            timeout=90,
            interval=1,
            what="alpha claims beta's instances",
        )
        wait_for(
            lambda: (
                not [
                    vm
                    for vm in alpha.stub.admin.vms()
                    if vm.tags.get("nodewarden-dispatcher") == "beta" and vm.state != "terminated"
                ]
            ),
            timeout=90,
            interval=1,
            what="no instance left with beta's tag",
        )
        alpha.wait_no_nodes(timeout=120)
    finally:
        beta.close(stop_stub=False)
        alpha.close()
        cluster.kubectl("delete", "namespace", other_ns, "--wait=false", check=False)
