"""Shared fixtures: the real local control plane (once per session), namespaces, the operator.

`cluster` starts etcd + kube-apiserver + kube-controller-manager from the cached upstream
binaries (building them on the first run on a machine) in a temporary directory and
stops them at the end of the session. Set NODEWARDEN_TEST_KUBECONFIG to run the cluster
tests against an already running cluster instead (e.g. one from `make cluster-up`).
Helpers (kubectl wrapper, polling, operator processes) are in tests/clusterkit.py.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from calibration import summary
from clusterkit import ClusterHandle, OperatorProcess, start_operator
from localcluster import LocalCluster


def pytest_report_header() -> str:
    """The machine's calibration figure first: test deadlines are scaled by it."""
    return summary()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked `audit_last` (the RBAC audit of the whole run) run after all others."""
    last = [item for item in items if item.get_closest_marker("audit_last")]
    if last:
        items[:] = [item for item in items if item not in last] + last


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterHandle]:
    existing = os.environ.get("NODEWARDEN_TEST_KUBECONFIG")
    if existing:
        yield ClusterHandle(Path(existing), None)
        return
    state = tmp_path_factory.mktemp("cluster")
    local = LocalCluster(state_dir=state)
    local.up()
    try:
        yield ClusterHandle(local.kubeconfig, local)
    finally:
        local.down()


@pytest.fixture
def namespace(cluster: ClusterHandle) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:10]}"
    cluster.kubectl("create", "namespace", name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def operator(cluster: ClusterHandle, namespace: str, tmp_path: Path) -> Iterator[OperatorProcess]:
    op = start_operator(cluster, namespace, tmp_path)
    yield op
    op.stop()
