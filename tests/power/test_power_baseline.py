"""The baseline side-node flows end to end: shutdown when idle, wake for a GPU container.

Real control plane, the operator as a process, side nodes behind the project's fake BMC
(an SSH stub worker that is up only while its BMC says On). Each flow asserts the Safety
Record in the PowerIntent's status: every gate with its evidence, the request proof kept
apart from the actual-state proof, OFF only on an observed Off, admission only after On
and a passing ready probe. (The shutdown's own Safety Record, gate by gate, is asserted in
process: `tests/power/inproc/test_inproc_shutdown.py`; here the policy switches gpu-a off
through the real BMC on the way to the wake.)
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
