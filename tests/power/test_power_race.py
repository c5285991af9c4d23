"""Demand that arrives while a node is DRAINING: the shutdown is abandoned before its
irreversible step (Aborted, with the race flag), nothing is sent to the BMC, and the
node takes work again only after it was verified On and ready.

The node's SSH commands are slowed down once it is idle, so the drain -- which waits for
a fresh look at the node's work after admission closed -- lasts long enough for a
container to arrive in the middle of it.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from clusterkit import ClusterHandle, wait_for
from dispatchkit import apply_many
from powerkit import PowerEnv, side_node_entry

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

SLOW_COMMANDS = 10.0
"""Seconds each SSH command takes during the drain (the command timeout is 30 s)."""


@pytest.fixture
def env(cluster: ClusterHandle, namespace: str, tmp_path: Path) -> Iterator[PowerEnv]:
    env = PowerEnv.create(
        cluster,
        namespace,
        tmp_path,
        [side_node_entry("racy")],
        policy={"idleThreshold": "8s", "telemetryMaxAge": "60s"},
        node_specs={"racy": {"capacity": {"vcpus": 8, "ram": "32Gi", "gpus": 1, "gpuModel": "rx"}}},
    )
    try:
        yield env
    finally:
        env.close()


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def job() -> dict[str, Any]:
    return {
        "apiVersion": "nodewarden.io/v1alpha1",
        "kind": "ContainerDispatch",
        "metadata": {"name": "late-arrival"},
        "spec": {
            "uuid": "zzzzz-dz642-000000000000077",
            "priority": 500,
            "resources": {"vcpus": 1, "ram": "1Gi", "gpus": 1, "gpuModel": "rx"},
            "command": ["sleep", "1"],
            "runtime": {"durationHintSeconds": 1},
        },
    }


def test_demand_during_draining_aborts_the_shutdown_and_reverifies(env: PowerEnv) -> None:
    env.start_operator()
    env.wait_state("racy", "Idle", timeout=60)
    env.side.admin.set_worker_faults("racy", command_delay=SLOW_COMMANDS)
    env.wait_state("racy", "Draining", timeout=60)
    apply_many(env, [job()])  # type: ignore[arg-type]

    aborted = env.wait_intent("racy", "Aborted", "Shutdown", timeout=60)
    reasons = aborted["status"]["reasons"]
    assert "RACE_DEMAND_ARRIVED" in reasons and "TRANSITION_ABORTED" in reasons, reasons
    assert "DEMAND_PRESENT" in reasons
    assert aborted["status"]["safetyRecord"]["race"] is True
    assert env.resets("racy") == []  # abandoned before the irreversible step

    # re-verification waits for a passing ready probe (still slow): no work is bound yet
    status = env.status("racy")
    assert status["admission"] == "Closed", status
    cd = env.cluster.get_json(env.namespace, "cd", "late-arrival")
    assert (cd.get("status") or {}).get("phase") in (None, "Queued"), cd.get("status")

    env.side.admin.set_worker_faults("racy", command_delay=0.0)

    def complete() -> dict[str, Any] | None:
        c = env.cluster.get_json(env.namespace, "cd", "late-arrival")
        return c if (c.get("status") or {}).get("phase") == "Complete" else None

    done = wait_for(complete, timeout=120, interval=1, what="late-arrival Complete")
    assert done["status"]["node"] == "racy"
    assert _time(done["status"]["startedAt"]) >= _time(aborted["status"]["finishedAt"])
    runs = [r for r in env.side.admin.runs("racy") if r["uuid"] == "zzzzz-dz642-000000000000077"]
    assert len(runs) == 1
    assert [i["status"]["phase"] for i in env.intents("racy")][:1] == ["Aborted"]


@pytest.fixture
def slow_probes(cluster: ClusterHandle, namespace: str, tmp_path: Path) -> Iterator[PowerEnv]:
    env = PowerEnv.create(
        cluster,
        namespace,
        tmp_path,
        [side_node_entry("busy", initial_power="Off")],
        policy={"idleThreshold": "2s"},
        node_specs={"busy": {"capacity": {"vcpus": 8, "ram": "32Gi", "gpus": 1, "gpuModel": "rx"}}},
        # SSH probes far apart: between two of them only the dispatcher knows the work
        config={"dispatch": {"probe_interval": 8}},
    )
    try:
        yield env
    finally:
        env.close()


def test_a_node_is_not_drained_while_the_dispatcher_runs_work_on_it(
    slow_probes: PowerEnv,
) -> None:
    env = slow_probes
    env.start_operator()
    env.wait_state("busy", "Off", timeout=60)
    long_job = job()
    long_job["spec"]["command"] = ["sleep", "6"]
    long_job["spec"]["runtime"] = {"durationHintSeconds": 6}
    apply_many(env, [long_job])  # type: ignore[arg-type]

    def complete() -> dict[str, Any] | None:
        c = env.cluster.get_json(env.namespace, "cd", "late-arrival")
        return c if (c.get("status") or {}).get("phase") == "Complete" else None

    done = wait_for(complete, timeout=120, interval=1, what="the job Complete")
    assert done["status"]["node"] == "busy"
    finished = _time(done["status"]["finishedAt"])
    # no shutdown began while the job ran: the first one after the wake came after it
    later = [
        i
        for i in env.intents("busy")
        if i["spec"]["action"] == "Shutdown"
        and _time(i["metadata"]["creationTimestamp"]) > _time(done["status"]["startedAt"])
    ]
    for intent in later:
        started = _time(
            intent["status"].get("startedAt") or intent["metadata"]["creationTimestamp"]
        )
        assert started >= finished.replace(microsecond=0), (intent["status"], done["status"])
