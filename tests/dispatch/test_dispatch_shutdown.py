"""Issue 14 item 6: SIGTERM during a burst of runner starts and status writes.

kopf cancels every task it did not start 5 s after it begins to stop. The service now
stops the dispatcher and the power controller first (`nodewarden.drain`): nothing new
begins, what is under way finishes within `shutdown_grace`, and kopf stops after them.
Each runner start here takes 6 s (the stub node answers every command 6 s late), so a
start cut at kopf's 5 s would leave a Locked container and a runner nobody recorded.
"""

from __future__ import annotations

import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from clusterkit import ClusterHandle, wait_for
from dispatchkit import DispatchEnv, apply_many, container

pytestmark = pytest.mark.cluster

COMMAND_DELAY = 6.0


@pytest.fixture
def env(cluster: ClusterHandle, namespace: str, tmp_path: Path) -> Iterator[DispatchEnv]:
    e = DispatchEnv.create(cluster, namespace, tmp_path, policy={"maxNodes": 1})
    yield e
    e.close()


def test_sigterm_during_runner_starts_leaves_every_runner_recorded(env: DispatchEnv) -> None:
    first = env.start_operator(name="first")
    # one "medium" node (16 GiB): room for the anchor and the burst, 4 GiB each
    apply_many(env, [container("anchor", 900, ram="4Gi", duration=600)])
    env.wait_phases({"anchor": "Running"}, timeout=120)
    (vm,) = env.ours()
    env.stub.admin.set_worker_faults(vm.id, command_delay=COMMAND_DELAY)
    burst = [container(f"b{i}", 910 + i, ram="4Gi", duration=600) for i in range(2)]
    apply_many(env, burst)
    wait_for(
        lambda: any(p == "Locked" for p in env.phases().values()),
        timeout=60,
        interval=0.2,
        what="a runner start under way (a container Locked)",
    )

    assert first.stop(signal.SIGTERM, timeout=60) == 0, first.logs()[-4000:]

    by_uuid = {c["spec"]["uuid"]: c for c in env.containers()}
    locked = [n for n, p in env.phases().items() if p == "Locked"]
    assert not locked, f"starts cut short by the stop: {locked}\n{first.logs()[-4000:]}"
    for run in env.stub.admin.runs():
        status = by_uuid[run["uuid"]].get("status") or {}
        assert status.get("phase") == "Running", (run, status)
        assert status.get("runnerPid") == run["pid"], (run, status)
        assert status.get("node"), status
    assert "dispatcher stopped:" in first.logs()
    assert ", 0 cancelled" in first.logs(), first.logs()[-4000:]

    # the next operator adopts the runners and starts what was not started: once each
    env.start_operator(name="second")
    env.wait_phases({o["metadata"]["name"]: "Running" for o in burst}, timeout=180)
    counts = Counter(r["uuid"] for r in env.stub.admin.runs())
    assert set(counts.values()) == {1}, counts
