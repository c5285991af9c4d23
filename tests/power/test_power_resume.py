"""Restarts and failover in the middle of an irreversible transition: the replica that
takes over resumes from `WorkerNode.status.powerState` and never sends a second request.

The fake BMCs take `TRANSITION` seconds to apply a reset, so a node stays SHUTTING_DOWN
or WAKING long after its request was sent:

1. operator A sends a shutdown (`down1`) and a wake (`wake1`, for a container that fits
   only it), and is SIGKILLed while both are in flight; operator B (a new process) and C
   (a standby) start; B takes the Lease once A's expires, resumes both transitions while
   the BMCs are still applying them, confirms them, and the container runs on `wake1`
   exactly once;
2. B wakes `down1` for a second container and is stopped (SIGTERM: a clean handover)
   while it is WAKING; C takes over and finishes the wake.

Each BMC's reset log (what the operator really sent) holds exactly one request per
transition, and every transition's PowerIntent ends Succeeded with its Safety Record.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from clusterkit import ClusterHandle, wait_for
from dispatchkit import apply_many
from powerkit import PowerEnv, side_node_entry

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

TRANSITION = 25.0
"""Seconds a fake BMC takes to apply a reset: longer than a Lease handover (8 s lease)."""


def gpu(model: str) -> dict[str, Any]:
    return {"capacity": {"vcpus": 8, "ram": "32Gi", "gpus": 1, "gpuModel": model}}


def job(name: str, index: int, model: str) -> dict[str, Any]:
    return {
        "apiVersion": "nodewarden.io/v1alpha1",
        "kind": "ContainerDispatch",
        "metadata": {"name": name},
        "spec": {
            "uuid": f"zzzzz-dz642-{index:015d}",
            "priority": 500,
            "resources": {"vcpus": 1, "ram": "1Gi", "gpus": 1, "gpuModel": model},
            "command": ["sleep", "1"],
            "runtime": {"durationHintSeconds": 1},
        },
    }


@pytest.fixture
def env(cluster: ClusterHandle, namespace: str, tmp_path: Path) -> Iterator[PowerEnv]:
    slow = {"transition_seconds": TRANSITION}
    env = PowerEnv.create(
        cluster,
        namespace,
        tmp_path,
        [
            side_node_entry("down1", fakebmc=slow),
            side_node_entry("wake1", initial_power="Off", fakebmc=slow),
        ],
        # long deadlines: the resumed replica waits for the confirmation, no re-send
        policy={
            "idleThreshold": "2s",
            "deadlines": {"shutdown": "90s", "wake": "90s", "ready": "30s", "drain": "60s"},
        },
        node_specs={"down1": gpu("model-down1"), "wake1": gpu("model-wake1")},
        config={"power": {"keep_finished_intents": 1}},
    )
    try:
        yield env
    finally:
        env.close()


def holder(env: PowerEnv) -> str:
    lease = env.cluster.get_json(env.namespace, "lease", "nodewarden-power")
    return str((lease.get("spec") or {}).get("holderIdentity") or "")


def requests(env: PowerEnv, node: str) -> list[str]:
    return [r["reset_type"] for r in env.resets(node)]


def wait_requested(env: PowerEnv, node: str, reset: str) -> None:
    wait_for(
        lambda: reset in requests(env, node),
        timeout=90,
        interval=0.5,
        what=f"{node}: {reset} sent to its BMC",
    )


def assert_succeeded_once(env: PowerEnv, node: str, action: str, count: int = 1) -> None:
    mine = [i for i in env.intents(node) if i["spec"]["action"] == action]
    assert len(mine) == count, [i["metadata"]["name"] for i in mine]
    for intent in mine:
        status = intent["status"]
        assert status["phase"] == "Succeeded", status
        assert status["safetyRecord"]["confirmation"]["confirmed"] is True


def test_a_replica_that_takes_over_mid_transition_never_sends_a_second_request(
    env: PowerEnv,
) -> None:
    a = env.start_operator("operator-a")
    wait_for(lambda: holder(env), timeout=30, what="operator-a holds the Lease")
    # B stands by from the start: a standby counts the Lease's duration from when it saw
    # the record change, so one started only after the SIGKILL would first watch it that
    # long (and a loaded machine takes seconds to start a replica)
    b = env.start_operator("operator-b")
    apply_many(env, [job("first", 1, "model-wake1")])  # type: ignore[arg-type]
    wait_requested(env, "down1", "GracefulShutdown")
    wait_requested(env, "wake1", "On")
    env.wait_state("down1", "ShuttingDown", timeout=5)
    env.wait_state("wake1", "Waking", timeout=5)
    killed_holder = holder(env)
    a.stop(signal.SIGKILL)
    b_identity = wait_for(
        lambda: (h := holder(env)) != killed_holder and h,
        timeout=30,
        interval=0.3,
        what="a new Lease holder after the SIGKILL",
    )
    c = env.start_operator("operator-c")  # the standby of step 2
    # B resumes while the BMCs are still applying the requests A sent
    assert env.status("down1")["state"] == "ShuttingDown"
    assert env.status("wake1")["state"] == "Waking"

    env.wait_state("down1", "Off", timeout=90)
    done = wait_for(
        lambda: (
            (env.cluster.get_json(env.namespace, "cd", "first").get("status") or {}).get("phase")
            == "Complete"
        ),
        timeout=120,
        interval=1,
        what="the first container Complete",
    )
    assert done
    first = env.cluster.get_json(env.namespace, "cd", "first")["status"]
    assert first["node"] == "wake1"
    assert [r["uuid"] for r in env.side.admin.runs("wake1")].count(
        "zzzzz-dz642-000000000000001"
    ) == 1
    assert requests(env, "down1") == ["GracefulShutdown"]
    # wake1 goes idle after its container and may already be switched off again
    assert requests(env, "wake1")[:1] == ["On"] and requests(env, "wake1").count("On") == 1
    assert_succeeded_once(env, "down1", "Shutdown")
    assert_succeeded_once(env, "wake1", "Wake")

    # step 2: B wakes down1 for a second container; B stops cleanly while it is WAKING
    apply_many(env, [job("second", 2, "model-down1")])  # type: ignore[arg-type]
    wait_for(
        lambda: requests(env, "down1").count("On") == 1,
        timeout=90,
        interval=0.5,
        what="down1: On sent to its BMC",
    )
    env.wait_state("down1", "Waking", timeout=5)
    assert holder(env) == b_identity
    b.stop(signal.SIGTERM)
    wait_for(
        lambda: holder(env) not in ("", b_identity),
        timeout=30,
        interval=0.3,
        what="operator C holds the Lease",
    )
    assert env.status("down1")["state"] == "Waking"
    wait_for(
        lambda: (
            (env.cluster.get_json(env.namespace, "cd", "second").get("status") or {}).get("phase")
            == "Complete"
        ),
        timeout=120,
        interval=1,
        what="the second container Complete",
    )
    assert env.cluster.get_json(env.namespace, "cd", "second")["status"]["node"] == "down1"
    sent = requests(env, "down1")
    assert sent[:2] == ["GracefulShutdown", "On"] and sent.count("On") == 1, sent
    assert_succeeded_once(env, "down1", "Wake")
    # one finished policy-made intent is kept per node here: the shutdown's goes
    wait_for(
        lambda: not [i for i in env.intents("down1") if i["spec"]["action"] == "Shutdown"
                     and (i.get("status") or {}).get("phase") == "Succeeded"],
        timeout=30,
        what="down1's finished Shutdown intent deleted (keep_finished_intents: 1)",
    )  # fmt: skip
    assert requests(env, "wake1").count("GracefulShutdown") <= 1
    assert c.proc.poll() is None
