"""The power path's alert rules, rendered by the chart for one release, under promtool.

Each rule fires when it should (with its labels and the annotations an operator reads)
and stays silent when it should not: below its threshold, for a transition the
controller keeps acting on, for a blip shorter than its `for`, and for another release
(`b` in `ns2`) whose metrics would fire it.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcluster import REPO, binaries_dir

pytestmark = pytest.mark.cluster  # helm comes with the control plane binaries

CHART = REPO / "helm" / "nodewarden"
A = 'namespace="ns1", job="a-nodewarden-metrics"'
B = 'namespace="ns2", job="b-nodewarden-metrics"'


def _series(selector: str, name: str, values: str, **labels: str) -> dict[str, str]:
    extra = "".join(f', {k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{selector}{extra}}}", "values": values}


def _alert(labels: dict[str, str], summary: str, description: str) -> dict[str, Any]:
    return {
        "exp_labels": {"namespace": "ns1", "release": "a", "team": "t", **labels},
        "exp_annotations": {"summary": summary, "description": description},
    }


def _case(eval_time: str, alertname: str, *alerts: dict[str, Any]) -> dict[str, Any]:
    return {"eval_time": eval_time, "alertname": alertname, "exp_alerts": list(alerts)}


def _group(series: list[dict[str, str]], *cases: dict[str, Any]) -> dict[str, Any]:
    return {"interval": "1m", "input_series": series, "alert_rule_test": list(cases)}


BLOCKED = _group(
    [
        _series(
            A,
            "nodewarden_power_blocked_nodes",
            "0 0 2x20",
            state="BLOCKED",
            reason="DEADLINE_EXCEEDED",
        ),
        _series(
            A,
            "nodewarden_power_blocked_nodes",
            "1 1 1 stale",
            state="ON_IDLE",
            reason="INHIBITOR_ACTIVE",
        ),  # a blip shorter than 5 minutes
        _series(
            B,
            "nodewarden_power_blocked_nodes",
            "3x20",
            state="BLOCKED",
            reason="CREDENTIALS_REFUSED",
        ),
    ],
    _case("6m", "NodewardenPowerBlocked"),
    _case(
        "8m",
        "NodewardenPowerBlocked",
        _alert(
            {"severity": "warning", "state": "BLOCKED", "reason": "DEADLINE_EXCEEDED"},
            "2 WorkerNode(s) in BLOCKED blocked by DEADLINE_EXCEEDED",
            "nodewarden will not switch these nodes on or off until a person (or a policy "
            "change) acts. List them: kubectl -n ns1 get wn -o custom-columns=NAME:"
            ".metadata.name,STATE:.status.state,REASONS:.status.lastSafetyRecord.reasons; "
            "then kubectl describe wn NAME and nodewarden explain workernode NAME for the gate "
            "and its evidence. docs/reason-codes.md says what to do about DEADLINE_EXCEEDED.",
        ),
    ),
)

STUCK = _group(
    [
        # entered WAKING at t=0, entered DRAINING at t=0
        _series(
            A,
            "nodewarden_power_transition_state_since_seconds",
            "0x40",
            kind="Wake",
            state="WAKING",
            node="gpu-a",
        ),
        _series(
            A,
            "nodewarden_power_transition_state_since_seconds",
            "0x40",
            kind="Shutdown",
            state="DRAINING",
            node="gpu-d",
        ),
        _series(
            B,
            "nodewarden_power_transition_state_since_seconds",
            "0x40",
            kind="Wake",
            state="WAKING",
            node="gpu-x",
        ),
        # a deadline 10 minutes in; a deadline the controller keeps moving (re-sends)
        _series(
            A,
            "nodewarden_power_transition_deadline_seconds",
            "600x40",
            kind="Shutdown",
            state="SHUTTING_DOWN",
            node="gpu-s",
        ),
        _series(
            A,
            "nodewarden_power_transition_deadline_seconds",
            "60+60x40",
            kind="Wake",
            state="WAKING",
            node="gpu-a",
        ),
        _series(
            B,
            "nodewarden_power_transition_deadline_seconds",
            "0x40",
            kind="Wake",
            state="WAKING",
            node="gpu-x",
        ),
    ],
    _case("29m", "NodewardenPowerNodeStuckWaking"),
    _case(
        "31m",
        "NodewardenPowerNodeStuckWaking",
        _alert(
            {"severity": "warning", "node": "gpu-a"},
            "WorkerNode gpu-a has been WAKING for 31m 0s",
            "It was asked to power on and has not passed its ready probe; containers waiting "
            "for it keep waiting (nothing is bound before ready). kubectl -n ns1 describe wn "
            "gpu-a (observed power, lastProbe, last record); nodewarden explain workernode "
            "gpu-a -n ns1. Check its BMC or Wake-on-LAN path and its ready command. Other "
            "nodes may be waking too: kubectl get wn.",
        ),
    ),
    _case("14m", "NodewardenPowerTransitionOverdue"),
    _case(
        "16m",
        "NodewardenPowerTransitionOverdue",
        _alert(
            {"severity": "warning", "kind": "Shutdown", "state": "SHUTTING_DOWN", "node": "gpu-s"},
            "Shutdown of WorkerNode gpu-s is 6m 0s past its deadline in SHUTTING_DOWN",
            "At a transition's deadline nodewarden re-sends, aborts or blocks it; this one was "
            "not acted on, so the power controller makes no progress on the node (while "
            "DRAINING or SHUTTING_DOWN its admission stays closed and it serves nothing). Look "
            "in the operator log for failing power controller rounds or status write "
            "conflicts; kubectl -n ns1 describe wn gpu-s; nodewarden explain workernode gpu-s "
            "-n ns1.",
        ),
    ),
)

UNRECORDED = _group(
    [
        _series(A, "nodewarden_power_unrecorded_transitions", "0 0 1x20"),
        _series(B, "nodewarden_power_unrecorded_transitions", "1 1 1 1 0x20"),
    ],
    _case("6m", "NodewardenPowerTransitionWithoutRecord"),
    _case(
        "8m",
        "NodewardenPowerTransitionWithoutRecord",
        _alert(
            {"severity": "critical"},
            "1 power transition(s) in progress without a Safety Record",
            "A shutdown or wake is under way whose evidence was not recorded: nodewarden "
            "promises a Safety Record for every power decision. kubectl -n ns1 get pi (an "
            "InProgress intent without decision and reasons) and kubectl get wn -o wide find "
            "the node; the operator log shows why the PowerIntent write failed (RBAC, API "
            "errors). Keep the log and report it.",
        ),
    ),
)

STALE = _group(
    [
        _series(A, "nodewarden_power_stale_telemetry_since_seconds", "60x30", node="gpu-t"),
        _series(A, "nodewarden_power_stale_telemetry_nodes", "2x30"),
        _series(B, "nodewarden_power_stale_telemetry_since_seconds", "0x30", node="gpu-x"),
    ],
    _case("15m", "NodewardenPowerStaleTelemetry"),
    _case(
        "17m",
        "NodewardenPowerStaleTelemetry",
        _alert(
            {"severity": "warning", "node": "gpu-t"},
            "WorkerNode gpu-t has waited 16m 0s for fresh telemetry",
            "A decisive reading (SSH probe, BMC power state, queue) is stale or missing, so its "
            "power decisions are deferred (stale evidence never counts as all fine); "
            "nodewarden_power_stale_telemetry_nodes counts every node in that state. nodewarden "
            "explain workernode gpu-t -n ns1 names the stale reading and its source; kubectl "
            "describe wn gpu-t shows lastProbe. Check SSH reachability and the BMC.",
        ),
    ),
)

BMC = _group(
    [
        _series(A, "nodewarden_bmc_errors_total", "0+4x40", **{"class": "timeout"}),
        _series(
            A, "nodewarden_bmc_errors_total", "0+0.5x40", **{"class": "auth"}
        ),  # one error every 2 minutes: below the threshold
        _series(B, "nodewarden_bmc_errors_total", "0+10x40", **{"class": "connection"}),
    ],
    _case("9m", "NodewardenBmcErrors"),
    _case(
        "15m",
        "NodewardenBmcErrors",
        _alert(
            {"severity": "warning", "class": "timeout"},
            "4 BMC errors of class timeout per minute",
            "Power readings from these BMCs go stale and power requests to them fail. The "
            "operator log names each node (WorkerNode NAME: BMC ... failed (class)). auth: the "
            "BMC credentials Secret; tls: the CA bundle; timeout or connection: the endpoint "
            "and the network; rejected: the BMC refused the action (kubectl describe wn NAME); "
            "protocol, http, discovery: the BMC's firmware or spec.bmc.systemId.",
        ),
    ),
)

CLAIMED = _group(
    [
        _series(A, "nodewarden_bmc_claimed_twice", "0 0 1 1"),
        _series(B, "nodewarden_bmc_claimed_twice", "2 2 2 2"),
    ],
    _case("1m", "NodewardenBmcClaimedTwice"),
    _case(
        "2m",
        "NodewardenBmcClaimedTwice",
        _alert(
            {"severity": "critical"},
            "1 WorkerNode(s) name a BMC another WorkerNode holds",
            "One machine, one BMC: a newcomer naming the BMC (endpoint and system, or its UUID) "
            "of an enrolled node is refused its credentials and never powered; the node that "
            "holds it keeps serving. A mistake, or someone aiming a node at a machine that is "
            "not theirs. kubectl -n ns1 get wn -o custom-columns=NAME:.metadata.name,"
            'VALID:.status.conditions[?(@.type=="Valid")].reason | grep BmcClaimed; the Valid '
            "message names the holder (docs/security.md).",
        ),
    ),
)

REQUESTS = "nodewarden_power_requests_total"
RESENDS = _group(
    [
        # On: one first attempt and one re-send a minute (half are re-sends)
        _series(A, REQUESTS, "0+1x70", action="On", result="accepted", resend="true"),
        _series(A, REQUESTS, "0+1x70", action="On", result="accepted", resend="false"),
        # GracefulShutdown: many requests, few re-sends (under one in five)
        _series(A, REQUESTS, "0+1x70", action="GracefulShutdown", result="accepted", resend="true"),
        _series(
            A, REQUESTS, "0+10x70", action="GracefulShutdown", result="accepted", resend="false"
        ),
        _series(B, REQUESTS, "0+5x70", action="On", result="errored", resend="true"),
    ],
    _case("4m", "NodewardenPowerResends"),
    _case(
        "65m",
        "NodewardenPowerResends",
        _alert(
            {"severity": "warning", "action": "On"},
            "60 On power requests re-sent in the last hour",
            "More than one On request in five had to be sent again (rejected, failed, or not "
            "confirmed by its deadline): the BMCs accept requests without acting on them, or "
            "the way to them fails. Each re-send is in its transition's Safety Record (kubectl "
            "-n ns1 get pi); a node that uses up its retry budget goes BLOCKED. See "
            "nodewarden_bmc_errors_total and kubectl describe wn for the nodes concerned.",
        ),
    ),
)

POWER_RULES = {
    "NodewardenPowerBlocked",
    "NodewardenPowerNodeStuckWaking",
    "NodewardenPowerTransitionOverdue",
    "NodewardenPowerTransitionWithoutRecord",
    "NodewardenPowerStaleTelemetry",
    "NodewardenBmcErrors",
    "NodewardenBmcClaimedTwice",
    "NodewardenPowerResends",
}


def _rules(release: str, namespace: str) -> dict[str, Any]:
    out = subprocess.run(
        [str(binaries_dir() / "helm"), "template", release, str(CHART), "--namespace",
         namespace, "--set", "image.repository=registry.example.org/nodewarden", "--set",
         "alerts.enabled=true", "--set", "alerts.alertLabels.team=t"],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d and d["kind"] == "PrometheusRule"]
    assert len(docs) == 1
    spec: dict[str, Any] = docs[0]["spec"]
    return spec


def test_power_alerts_fire_when_they_should_and_only_then(tmp_path: Path) -> None:
    rules = _rules("a", "ns1")
    names = {r["alert"] for g in rules["groups"] for r in g["rules"]}
    assert names >= POWER_RULES
    groups = [BLOCKED, STUCK, UNRECORDED, STALE, BMC, CLAIMED, RESENDS]
    tested = {case["alertname"] for g in groups for case in g["alert_rule_test"]}
    assert tested == POWER_RULES, "every power rule has a promtool test"
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules))
    tests = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": groups}
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests, width=1000))
    for args in (["check", "rules", "rules.yaml"], ["test", "rules", "tests.yaml"]):
        out = subprocess.run(
            ["promtool", *args], capture_output=True, text=True, check=False, cwd=tmp_path
        )
        assert out.returncode == 0, out.stdout + out.stderr
