"""`nodewarden trace export` against the real local control plane."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sim_builders import trace_cmd

from clusterkit import ClusterHandle
from nodewarden.simulate.trace import parse_trace

pytestmark = pytest.mark.cluster


def _dispatch(
    name: str, uuid: str, priority: int, resources: dict[str, object]
) -> dict[str, object]:
    return {
        "apiVersion": "nodewarden.io/v1alpha1",
        "kind": "ContainerDispatch",
        "metadata": {"name": name},
        "spec": {"uuid": uuid, "priority": priority, "resources": resources},
    }


def test_export_writes_finished_containers_with_resources_and_run_times(
    cluster: ClusterHandle, namespace: str, tmp_path: Path
) -> None:
    items = [
        _dispatch("done-cpu", "zzzzz-dz642-000000000000001", 500, {"vcpus": 2, "ram": "4Gi"}),
        _dispatch(
            "done-gpu",
            "zzzzz-dz642-000000000000002",
            800,
            {"vcpus": 8, "ram": "32Gi", "scratch": "100Gi", "gpus": 1, "gpuModel": "a10g"},
        ),
        _dispatch("running", "zzzzz-dz642-000000000000003", 500, {"vcpus": 1, "ram": "1Gi"}),
        _dispatch("queued", "zzzzz-dz642-000000000000004", 500, {"vcpus": 1, "ram": "1Gi"}),
    ]
    cluster.kubectl(
        "-n",
        namespace,
        "apply",
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}),
    )
    statuses = {
        "done-cpu": {
            "phase": "Complete",
            "startedAt": "2026-11-30T10:00:00Z",
            "finishedAt": "2026-11-30T10:05:30Z",
        },
        "done-gpu": {
            "phase": "Failed",
            "startedAt": "2026-11-30T10:01:00Z",
            "finishedAt": "2026-11-30T12:01:00Z",
        },
        "running": {"phase": "Running", "startedAt": "2026-11-30T10:02:00Z"},
    }
    for name, status in statuses.items():
        cluster.kubectl(
            "-n",
            namespace,
            "patch",
            "containerdispatch",
            name,
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps({"status": status}),
        )
    target = tmp_path / "site.jsonl"
    code, _, err = trace_cmd(
        "export",
        "--kubeconfig",
        str(cluster.kubeconfig),
        "-n",
        namespace,
        "--since",
        "1h",
        "-o",
        str(target),
    )
    assert code == 0, err
    assert "wrote 2 containers" in err and "1 never started" in err and "1 not finished" in err
    trace = parse_trace(target.read_text(), "jsonl", name="site")
    by_uuid = {c.uuid: c for c in trace.containers}
    cpu, gpu = by_uuid["zzzzz-dz642-000000000000001"], by_uuid["zzzzz-dz642-000000000000002"]
    assert cpu.runtime == 330 * 10**6 and gpu.runtime == 7200 * 10**6
    assert (cpu.resources.vcpus, cpu.resources.ram, cpu.priority) == (2, "4Gi", 500)
    assert (gpu.resources.gpus, gpu.resources.gpu_model, gpu.resources.scratch) == (
        1,
        "a10g",
        "100Gi",
    )
    assert gpu.priority == 800 and trace.absolute
    lines = target.read_text().splitlines()
    assert all(json.loads(line)["arrival"].endswith("Z") for line in lines)


def test_export_of_an_unreachable_cluster_fails_in_one_line(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\n"
        "current-context: x\n"
    )
    code, out, err = trace_cmd(
        "export", "--kubeconfig", str(kubeconfig), "-o", str(tmp_path / "t.csv")
    )
    assert code == 1 and out == ""
    assert (
        err.startswith("nodewarden trace export: cannot list ContainerDispatches")
        and err.count("\n") == 1
    )
