"""The trimmed `make e2e` inside `make test`: the chart's image as 2 Pods on a real kubelet.

Runs `e2e/dataplane/run.py --trimmed` (its own control plane, node and network namespaces;
see `dataplane.scenario` for the steps and assertions) and checks its report. Needs root
(network namespaces, containerd, kubelet), as CI has.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from localcluster import REPO

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


@pytest.mark.skipif(os.geteuid() != 0, reason="the e2e data plane needs root")
def test_trimmed_e2e_on_a_real_kubelet(tmp_path: Path) -> None:
    report_path = tmp_path / "report.json"
    log_path = tmp_path / "e2e.log"
    started = time.monotonic()
    with log_path.open("w") as log:
        code = subprocess.call(
            # state in the default temp dir (short paths: unix sockets live there); kept
            # there only if the run fails, for its logs
            [sys.executable, str(REPO / "e2e" / "dataplane" / "run.py"), "--trimmed",
             f"--report={report_path}"],
            stdout=log, stderr=subprocess.STDOUT, cwd=REPO, timeout=1200,
        )  # fmt: skip
    output = log_path.read_text(errors="replace")
    # the failed step's own line first: the diagnostics after it (Pod logs) fill any tail
    failed = [line for line in output.splitlines() if line.startswith(">>") and "FAILED:" in line]
    assert code == 0, "\n".join(failed) + "\n...\n" + output[-6000:]
    report = json.loads(report_path.read_text())
    assert report["passed"] is True and report["trimmed"] is True
    assert len({p["ip"] for p in report["pods"]}) == 2  # two ordinary Pods, own addresses
    assert report["handover_seconds"] is not None and report["handover_seconds"] <= 20
    assert all(b["started_once_each"] for b in report["batches"].values())
    assert report["monitoring"]["all_return_data"] and len(report["monitoring"]["targets"]) == 2
    assert set(report["status_api"]["through_service"]) == {200}
    side = report["side_node_power_cycle"]  # off when idle, woken by a GPU container
    assert side["shutdown"]["reasons"] == ["POWER_OFF_CONFIRMED"]
    assert side["leader_killed_while"] == "Waking" and side["handover_seconds"] <= 20
    assert {"POWER_ON_CONFIRMED", "READY_CONFIRMED"} <= set(side["wake"]["reasons"])
    assert side["bmc_resets"][:2] == ["GracefulShutdown", "On"]
    assert side["bmc_resets"].count("On") == 1
    # its fake BMC reports a draw and a kWh counter: the off period is counted (docs/energy.md)
    assert side["energy"]["method"] == "Cumulative" and side["energy"]["offSeconds"] > 0
    print(f"trimmed e2e: {time.monotonic() - started:.0f}s, report {json.dumps(report['seconds'])}")
