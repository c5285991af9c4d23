"""`nodewarden explain workernode NAME`: the live answer to "why is my node not off?".

One side node whose policy wants it idle for 10 minutes: the controller keeps it on and
says why. The CLI reads the cluster through the kubeconfig and the leader's live view
through the status API -- found on the Lease, or given with --operator-url, and also
through a standby (which relays to the leader) -- and prints the facts with their
sources and ages, the gate table and the decision the core makes now, the recent
decisions and the node's PowerIntents and Events. Bad input is one line and exit 2.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from clusterkit import ClusterHandle, OperatorProcess, wait_for
from localcluster import REPO
from powerkit import PowerEnv, side_node_entry

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

TOKEN = "explain-status-token-5b1f0c"


@pytest.fixture
def env(
    cluster: ClusterHandle, namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[PowerEnv]:
    monkeypatch.setenv("NODEWARDEN_POD_IP", "127.0.0.1")  # what the chart sets: the Lease URL
    env = PowerEnv.create(
        cluster,
        namespace,
        tmp_path,
        [side_node_entry("slowpoke")],
        policy={"idleThreshold": "10m"},
        config={"management": {"token_secret_name": "nodewarden-status"}},
    )
    env.apply(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "nodewarden-status"},
            "stringData": {"token": TOKEN},
        }
    )
    try:
        yield env
    finally:
        env.close()


def explain(env: PowerEnv, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "nodewarden",
            "explain",
            "workernode",
            *args,
            "-n",
            env.namespace,
            f"--kubeconfig={env.cluster.kubeconfig}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={k: v for k, v in os.environ.items() if k != "NODEWARDEN_STATUS_TOKEN"},
        check=False,
    )


def url(op: OperatorProcess) -> str:
    return f"http://127.0.0.1:{op.port}"


def test_explain_workernode_prints_facts_gates_decision_and_records(env: PowerEnv) -> None:
    leader = env.start_operator("leader")
    env.wait_state("slowpoke", "Idle", timeout=60)

    def live_idle() -> dict[str, Any] | None:
        out = explain(env, "slowpoke", "-o", "json")
        if out.returncode != 0:
            return None
        doc: dict[str, Any] = json.loads(out.stdout)
        live = doc.get("live") or {}
        return doc if (live.get("evaluation") or {}).get("decision") == "DEFER" else None

    # no --operator-url: the CLI finds the leader's status API on its Lease
    doc = wait_for(live_idle, timeout=60, interval=1, what="a live DEFER decision")
    live = doc["live"]
    evaluation = live["evaluation"]
    assert "IDLE_WINDOW_NOT_MET" in evaluation["reasons"], evaluation
    idle_gate = next(g for g in evaluation["gates"] if g["gate"] == "timing")
    assert idle_gate["verdict"] == "FAIL"
    # every fact with its source and real observation time
    assert live["facts"]["power"]["power"] == "On"
    assert live["facts"]["power"]["source"].startswith("redfish:https://127.0.0.1")
    assert live["facts"]["ready"]["passed"] is True
    assert 0 <= live["facts"]["work"]["ageSeconds"] < 60
    assert live["policy"]["name"] == "default" and live["policy"]["valid"] is True
    assert live["history"] and live["history"][-1]["decision"] in ("DEFER", "NONE")
    # the cluster part: status and conditions as kubectl sees them
    assert doc["status"]["state"] == "Idle" and doc["status"]["admission"] == "Open"

    table = explain(env, "slowpoke", f"--operator-url={url(leader)}")
    assert table.returncode == 0, table.stderr
    text = table.stdout
    assert "decision now: DEFER [" in text and "IDLE_WINDOW_NOT_MET" in text
    assert "held by: " in text and "eligible at: " in text, text  # as status.eligibility
    for heading in ("Gates:", "Facts:", "Recent decisions:", "PowerIntents (newest first):"):
        assert heading in text, text
    assert "redfish:https://127.0.0.1" in text and "idleThreshold" in text
    assert TOKEN not in text and TOKEN not in table.stderr

    # a standby answers too (it relays to the leader)
    standby = env.start_operator("standby")
    wait_for(lambda: standby.get("/readyz")[0] == 200, timeout=30, what="standby ready")
    relayed = explain(env, "slowpoke", f"--operator-url={url(standby)}", "-o", "json")
    assert relayed.returncode == 0, relayed.stderr
    assert json.loads(relayed.stdout)["live"]["evaluation"]["decision"] == "DEFER"

    # a wrong token: the cluster part is printed, the live part says why it is missing
    bad = env.workdir / "bad-token"
    bad.write_text("not-the-token\n")
    wrong = explain(env, "slowpoke", f"--operator-url={url(leader)}", f"--token-file={bad}")
    assert wrong.returncode == 0
    assert "Live view: unavailable" in wrong.stdout and "HTTP 401" in wrong.stdout
    assert "state Idle" in wrong.stdout

    # bad input: one line, exit 2, no traceback
    missing = explain(env, "no-such-node")
    assert missing.returncode == 2
    assert "WorkerNode 'no-such-node' not found in namespace" in missing.stderr
    assert "Traceback" not in missing.stderr and len(missing.stderr.splitlines()) == 1
