"""The baseline side-node flows end to end: shutdown when idle, wake for a GPU container.

Real control plane, the operator as a process, side nodes behind the project's fake BMC
(an SSH stub worker that is up only while its BMC says On). Each flow asserts the Safety
Record in the PowerIntent's status: every gate with its evidence, the request proof kept
apart from the actual-state proof, OFF only on an observed Off, admission only after On
and a passing ready probe.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from clusterkit import ClusterHandle, wait_for
from dispatchkit import apply_many, container
from powerkit import PowerEnv, side_node_entry

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


@pytest.fixture
def env(cluster: ClusterHandle, namespace: str, tmp_path: Path) -> Iterator[PowerEnv]:
    # gpu-a: on and idle; gpu-b: off. gpu-c: on but held (takes no work, stays on).
    env = PowerEnv.create(
        cluster,
        namespace,
        tmp_path,
        [
            side_node_entry("gpu-a"),
            side_node_entry("gpu-b", initial_power="Off"),
            side_node_entry("gpu-c"),
        ],
        node_specs={"gpu-c": {"idleBehavior": "hold"}},
    )
    try:
        yield env
    finally:
        env.close()


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _gate(record: dict[str, Any], name: str) -> dict[str, Any]:
    return next(g for g in record["gates"] if g["gate"] == name)


def test_an_idle_side_node_is_drained_and_switched_off_only_on_observed_off(
    env: PowerEnv,
) -> None:
    env.start_operator()
    intent = env.wait_intent("gpu-a", "Succeeded", "Shutdown", timeout=90)
    status = intent["status"]
    record = status["safetyRecord"]
    assert status["decision"] == "NONE" and "POWER_OFF_CONFIRMED" in status["reasons"]
    assert intent["spec"]["source"] == "Policy"
    # the request and the actual state are proved by different evidence
    proof = record["proof"]
    assert [e["name"] for e in proof["request"]] == ["requested", "result"]
    assert any(e["name"] == "power" and e["value"] == "Off" for e in proof["actualState"])
    assert record["confirmation"]["confirmed"] is True
    assert record["confirmation"]["observed"] == "Off"
    assert "redfish:https://127.0.0.1" in record["confirmation"]["source"]
    assert record["request"]["action"] == "GracefulShutdown"
    assert record["policy"]["name"] == "default"
    # the record of the decision that sent the request stays beside the confirmation
    sent = status["requestRecord"]
    assert sent["decision"] == "SHUTDOWN" and "GATES_PASSED" in sent["reasons"], sent
    assert {g["gate"] for g in sent["gates"]} >= {"work", "telemetry", "inhibitors", "timing"}
    assert all(g["verdict"] != "FAIL" for g in sent["gates"])
    # the node is OFF, its admission closed, and the BMC got exactly one shutdown
    status_wn = env.wait_state("gpu-a", "Off")
    assert status_wn["admission"] == "Closed" and status_wn["observedPower"] == "Off"
    assert [r["reset_type"] for r in env.resets("gpu-a")] == ["GracefulShutdown"]
    # the decision that sent the request: every gate passed on fresh evidence
    shutdown_events = [
        e
        for e in env.cluster.get_json(env.namespace, "events")["items"]
        if e["involvedObject"]["name"] == "gpu-a" and e["reason"] == "PowerShutdown"
    ]
    assert shutdown_events and "GATES_PASSED" in shutdown_events[0]["message"]


def test_a_gpu_container_that_fits_only_the_off_side_node_wakes_it_and_runs_there_once(
    env: PowerEnv,
) -> None:
    op = env.start_operator()
    env.wait_state("gpu-b", "Off", timeout=60)
    env.wait_state("gpu-a", "Off", timeout=90)  # idle: switched off by the policy
    apply_many(env, [container("train", 1, gpus=1, duration=2)])  # type: ignore[arg-type]

    def complete() -> dict[str, Any] | None:
        c = env.cluster.get_json(env.namespace, "cd", "train")
        return c if (c.get("status") or {}).get("phase") == "Complete" else None

    done = wait_for(complete, timeout=120, interval=1, what="container Complete")
    node = done["status"]["node"]
    assert node in ("gpu-a", "gpu-b")  # woken; never the held gpu-c
    wakes = [i for i in env.intents(node) if i["spec"]["action"] == "Wake"]
    assert len(wakes) == 1
    for wake in wakes:
        record = wake["status"]["safetyRecord"]
        assert wake["status"]["phase"] == "Succeeded"
        assert {"POWER_ON_CONFIRMED", "READY_CONFIRMED"} <= set(wake["status"]["reasons"])
        assert record["readiness"] == "Ready"
        # admission opened only after observed On and a passing ready probe
        opened = _time(record["drain"]["admissionSince"])
        assert opened >= _time(record["observed"]["observedAt"]) or opened >= _time(
            record["readyProbe"]["observedAt"]
        )
        assert _time(done["status"]["startedAt"]) >= opened
        assert [r["reset_type"] for r in env.resets(node)].count("On") == 1
    other = "gpu-b" if node == "gpu-a" else "gpu-a"
    assert not [i for i in env.intents(other) if i["spec"]["action"] == "Wake"]
    runs = [r for r in env.side.admin.runs(node) if r["uuid"] == "zzzzz-dz642-000000000000001"]
    assert len(runs) == 1
    # the wake's latency to ready and to confirmed On were observed once each
    metrics = op.get("/metrics")[1]
    assert 'nodewarden_power_ready_seconds_count{action="On"} 1.0' in metrics
    assert 'nodewarden_power_confirm_seconds_count{kind="Wake"} 1.0' in metrics
