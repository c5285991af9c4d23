"""Issue 5 acceptance: cancel, runner crash, never-ready VMs, create errors, instance quota."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from clusterkit import ClusterHandle, wait_for
from dispatchkit import DispatchEnv, apply_many, container

pytestmark = pytest.mark.cluster


@pytest.fixture
def make_env(cluster: ClusterHandle, namespace: str, tmp_path: Path) -> Iterator[Any]:
    envs: list[DispatchEnv] = []

    def make(**kw: Any) -> DispatchEnv:
        e = DispatchEnv.create(cluster, namespace, tmp_path, **kw)
        envs.append(e)
        return e

    yield make
    for e in envs:
        e.close()


def _status(env: DispatchEnv, name: str) -> dict[str, Any]:
    return env.cluster.get_json(env.namespace, "cd", name).get("status") or {}


def test_cancel_mid_run_stops_the_runner(make_env: Any) -> None:
    env = make_env()
    env.start_operator()
    apply_many(env, [container("long", 1, duration=600), container("short", 2, duration=1)])
    env.wait_phases({"long": "Running", "short": "Complete"}, timeout=90)
    node = _status(env, "long")["node"]
    env.cluster.kubectl(
        "-n",
        env.namespace,
        "patch",
        "cd",
        "long",
        "--type=merge",
        "-p",
        json.dumps({"spec": {"cancel": True}}),
    )
    env.wait_phases({"long": "Cancelled"}, timeout=60)
    status = _status(env, "long")
    assert status["reason"] == "Cancelled"
    # the runner is really gone on the VM
    vm = next(v for v in env.ours() if v.tags.get("nodewarden-node") == node)
    detail = env.stub.admin.vm(vm.id)
    assert detail is not None and not detail.running_containers
    # and the node went back to idle (then away)
    env.wait_no_nodes(timeout=90)


def _running_on(env: DispatchEnv, node: str) -> list[str]:
    vm = next(v for v in env.ours() if v.tags.get("nodewarden-node") == node)
    detail = env.stub.admin.vm(vm.id)
    assert detail is not None
    return list(detail.running_containers)


def _gone(env: DispatchEnv, name: str) -> bool:
    cmd = env.cluster.kubectl("-n", env.namespace, "get", "cd", name, check=False)
    return cmd.returncode != 0


def test_deleting_a_container_kills_its_runner_now_or_after_a_restart(make_env: Any) -> None:
    """No finalizer: a deleted ContainerDispatch is gone at once; its runner is killed on
    the DELETED event, or, if the operator was down, by the first probe round after its
    restart. Objects of earlier releases lose the old finalizer (terminal or deleting)."""
    env = make_env()
    first = env.start_operator(name="first")
    apply_many(
        env,
        [
            container("doomed", 3, duration=600),
            container("orphan", 4, duration=600),
            container("legacy", 5, duration=600),
            container("done", 6, duration=1),
        ],
    )
    env.wait_phases(
        {"doomed": "Running", "orphan": "Running", "legacy": "Running", "done": "Complete"},
        timeout=90,
    )
    objs = {c["metadata"]["name"]: c for c in env.containers()}
    assert not [n for n, c in objs.items() if c["metadata"].get("finalizers")]
    node = {n: c["status"]["node"] for n, c in objs.items()}
    uuid = {n: c["spec"]["uuid"] for n, c in objs.items()}

    # deleted while the operator runs: gone at once, runner killed on the DELETED event
    env.cluster.kubectl("-n", env.namespace, "delete", "cd", "doomed", "--wait=true")
    wait_for(
        lambda: uuid["doomed"] not in _running_on(env, node["doomed"]),
        timeout=30,
        what="runner of the deleted container killed",
    )
    assert uuid["orphan"] in _running_on(env, node["orphan"])

    # deleted while the operator is down; two objects carry the finalizer of earlier releases
    first.stop()
    legacy = json.dumps({"metadata": {"finalizers": ["nodewarden.io/runner-cleanup"]}})
    for name in ("legacy", "done"):
        env.cluster.kubectl("-n", env.namespace, "patch", "cd", name, "--type=merge", "-p", legacy)
    env.cluster.kubectl("-n", env.namespace, "delete", "cd", "orphan", "--wait=true")
    env.cluster.kubectl("-n", env.namespace, "delete", "cd", "legacy", "--wait=false")
    assert uuid["orphan"] in _running_on(env, node["orphan"])
    env.start_operator(name="second")
    wait_for(
        lambda: uuid["orphan"] not in _running_on(env, node["orphan"]),
        timeout=60,
        what="runner of the container deleted during the outage killed after the restart",
    )
    # the old finalizer holds a deleting container until its runner is stopped
    wait_for(lambda: _gone(env, "legacy"), timeout=60, what="legacy container released")
    assert uuid["legacy"] not in _running_on(env, node["legacy"])
    # and leaves a finished one (one write)
    wait_for(
        lambda: not env.cluster.get_json(env.namespace, "cd", "done")["metadata"].get("finalizers"),
        timeout=30,
        what="old finalizer removed from a Complete container",
    )


def test_runner_crashes_requeue_then_fail_at_the_attempts_cap(make_env: Any) -> None:
    env = make_env(faults={"runner_crash_rate": 1.0, "seed": 3})
    env.start_operator()
    apply_many(env, [container("crashy", 4, duration=3)])
    env.wait_phases({"crashy": "Failed"}, timeout=120)
    status = _status(env, "crashy")
    assert status["reason"] == "MaxAttemptsExceeded"
    assert status["attempts"] == 3  # maxAttempts in the test policy
    assert "ended without finishing" in status["schedulingStatus"]
    runs = [r for r in env.stub.admin.runs() if r["uuid"] == "zzzzz-dz642-000000000000004"]
    assert len(runs) == 3


def test_vm_that_never_becomes_ready_is_shut_down_and_work_moves_on(make_env: Any) -> None:
    env = make_env(faults={"broken_rate": 1.0}, policy={"bootGrace": "8s"})
    env.start_operator()
    apply_many(env, [container("patient", 5, duration=1)])

    def shut_down_for_boot_grace() -> bool:
        events = env.cluster.get_json(env.namespace, "events")["items"]
        return any("BOOT_GRACE_EXCEEDED" in (e.get("message") or "") for e in events)

    wait_for(shut_down_for_boot_grace, timeout=90, interval=1, what="unready VM shut down")
    assert _status(env, "patient").get("phase") == "Queued"
    assert "waiting" in _status(env, "patient")["schedulingStatus"]
    env.stub.admin.set_faults(broken_rate=0.0)
    env.wait_phases({"patient": "Complete"}, timeout=120)


def test_create_errors_are_retried(make_env: Any) -> None:
    env = make_env(faults={"create_error_rate": 0.6, "seed": 11})
    env.start_operator()
    apply_many(env, [container(f"c{i}", 10 + i, vcpus=2, duration=1) for i in range(6)])
    env.wait_phases({f"c{i}": "Complete" for i in range(6)}, timeout=180)
    assert env.stub.admin.stats()["api_calls"].get("create", 0) > 0


def test_instance_quota_of_five_with_twenty_waiting(make_env: Any) -> None:
    env = make_env(
        faults={"instance_quota": 5},
        # the quota reason replaces "waiting for a new ... to boot" in the scheduling status
        # within this interval (30 s by default: longer than this test's whole queue)
        dispatch={"scheduling_status_interval": 1},
        policy={
            "dispatch": {
                "maxAttempts": 3,
                "maxLockFlaps": 3,
                "lameAfter": "60s",
                "lameMinProbes": 3,
                "takeoverAfter": "20s",
            }
        },
    )
    op = env.start_operator()
    apply_many(
        env, [container(f"q{i}", 40 + i, vcpus=7, ram="20Gi", duration=6) for i in range(20)]
    )

    seen_quota_reason = False
    max_vms = 0

    def progress() -> bool:
        nonlocal seen_quota_reason, max_vms
        max_vms = max(max_vms, len(env.ours()))
        for c in env.containers():
            text = (c.get("status") or {}).get("schedulingStatus") or ""
            if "quota" in text:
                seen_quota_reason = True
        return all(p == "Complete" for p in env.phases().values())

    wait_for(progress, timeout=240, interval=1, what="20 containers complete under a quota of 5")
    assert max_vms <= 5
    assert seen_quota_reason
    for c in env.containers():
        status = c["status"]
        assert status["attempts"] == 1
        assert status.get("lockFlaps", 0) == 0, status  # never flapped Locked -> Queued
    _, text = op.get("/metrics")
    assert 'nodewarden_cloud_errors_total{class="quota"}' in text


def test_a_copy_of_another_users_uuid_with_cancel_leaves_the_victim_to_complete(
    make_env: Any,
) -> None:
    """Issue 20, item 4: a user who may write ContainerDispatches (not read Secrets) copies a
    running container's uuid with cancel: true. Before: the copy won the queue's uuid index
    and its cancel TERMed the victim's runner, which then stayed Running for good."""
    env = make_env()
    ns = env.namespace
    env.cluster.kubectl("-n", ns, "create", "serviceaccount", "batch-user")
    env.cluster.kubectl(
        "-n", ns, "create", "role", "cd-author", "--verb=get,list,watch,create,patch",
        "--resource=containerdispatches.nodewarden.io",
    )  # fmt: skip
    env.cluster.kubectl(
        "-n", ns, "create", "rolebinding", "cd-author", "--role=cd-author",
        f"--serviceaccount={ns}:batch-user",
    )  # fmt: skip
    user = f"--as=system:serviceaccount:{ns}:batch-user"
    assert env.cluster.kubectl("-n", ns, user, "get", "secrets", check=False).returncode != 0
    env.start_operator()
    apply_many(env, [container("victim", 7, duration=8)])
    env.wait_phases({"victim": "Running"}, timeout=90)
    copy = container("copy", 7, duration=1)
    copy["spec"]["cancel"] = True
    env.cluster.kubectl("-n", ns, user, "create", "-f", "-", input=json.dumps(copy))

    def marked() -> dict[str, Any] | None:
        conds = _status(env, "copy").get("conditions") or []
        return next((c for c in conds if c["type"] == "Valid" and c["status"] == "False"), None)

    mark = wait_for(marked, timeout=30, what="the copy marked DuplicateUuid")
    assert mark["reason"] == "DuplicateUuid" and "'victim'" in mark["message"]
    env.wait_phases({"victim": "Complete"}, timeout=90)
    assert _status(env, "victim").get("exitCode") == 0
    assert _status(env, "copy").get("phase") is None  # never queued, locked or cancelled
