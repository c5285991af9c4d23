"""CRDs missing, old, then current: `nodewarden check` and the operator on a bare control plane.

The session cluster has nodewarden's CRDs and other tests use them, so this module starts
its own local control plane without CRDs (a few seconds). Against it:

1. `check` fails the crds line with the command that installs them; the operator logs one
   ERROR line naming the missing CRDs and that command, and answers /readyz 503 saying
   what it waits for;
2. with an old PowerPolicy CRD (a field the current schema has is missing) `check` fails
   with "differ" and the upgrade command, while the operator, whose kinds are now all
   served, becomes ready;
3. with the current CRDs the crds line passes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from clusterkit import ClusterHandle, start_operator, wait_for
from localcluster import CRD_DIR, LocalCluster
from nodewarden.check.result import Report, Status
from nodewarden.check.runner import CheckOptions, run_checks

pytestmark = pytest.mark.cluster


class BareCluster(LocalCluster):
    """A local control plane without nodewarden's CRDs: what a user has before installing."""

    def install_crds(self) -> None:
        return None


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterHandle]:
    local = BareCluster(state_dir=tmp_path_factory.mktemp("bare-cluster"))
    local.up()
    try:
        yield ClusterHandle(local.kubeconfig, local)
    finally:
        local.down()


def _crd_lines(cluster: ClusterHandle, namespace: str) -> tuple[Report, list[str], list[str]]:
    report = asyncio.run(
        run_checks(CheckOptions(kubeconfig=cluster.kubeconfig, namespace=namespace))
    )
    lines = [r for r in report.results if r.check == "crds"]
    return (
        report,
        [r.line() for r in lines if r.status is Status.FAIL],
        [r.line() for r in lines if r.status is Status.PASS],
    )


def _old_powerpolicy_crd(path: Path) -> Path:
    crd = yaml.safe_load((CRD_DIR / "nodewarden.io_powerpolicies.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    del schema["properties"]["spec"]["properties"]["maxHourlySpend"]
    path.write_text(yaml.safe_dump(crd))
    return path


def _ready(op: object) -> tuple[int, dict[str, object]]:
    status, body = op.get("/readyz")  # type: ignore[attr-defined]
    return status, json.loads(body)


def test_missing_then_old_then_current_crds(bare: ClusterHandle, tmp_path: Path) -> None:
    bare.kubectl("create", "namespace", "nw")
    op = start_operator(bare, "nw", tmp_path)
    try:
        # 1. no CRDs
        report, failures, _ = _crd_lines(bare, "nw")
        assert report.exit_code == 1
        assert len(failures) == 1 and "CRDs are not installed" in failures[0], failures
        assert "fix: kubectl apply --server-side -f crds/" in failures[0]
        wait_for(lambda: "CRDs not installed" in op.logs(), timeout=30, what="the log line")
        status, body = _ready(op)
        assert status == 503 and body["role"] == "starting"
        assert "workernodes.nodewarden.io" in str(body["waitingFor"])
        line = next(x for x in op.logs().splitlines() if "CRDs not installed" in x)
        for crd in ("workernodes", "containerdispatches", "powerintents", "powerpolicies"):
            assert f"{crd}.nodewarden.io" in line
        assert "kubectl apply --server-side -f crds/" in line

        # 2. an old PowerPolicy CRD beside the current others
        others = [p for p in sorted(CRD_DIR.glob("*.yaml")) if "powerpolicies" not in p.name]
        old = _old_powerpolicy_crd(tmp_path / "old-powerpolicies.yaml")
        for path in [*others, old]:
            bare.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
        bare.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")
        report, failures, _ = _crd_lines(bare, "nw")
        assert len(failures) == 1, failures
        assert "differ" in failures[0] and "powerpolicies.nodewarden.io" in failures[0]
        assert "workernodes" not in failures[0]
        assert "fix: kubectl apply --server-side -f crds/ of this nodewarden release" in failures[0]
        wait_for(lambda: _ready(op)[0] == 200, timeout=60, what="operator ready once served")
        assert op.logs().count("CRDs not installed") == 1, "the missing CRDs were logged again"

        # 3. the current CRDs
        bare.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_DIR))
        report, failures, passes = _crd_lines(bare, "nw")
        assert failures == [] and len(passes) == 1, report.results
        assert "schemas match" in passes[0]
    finally:
        op.stop()
