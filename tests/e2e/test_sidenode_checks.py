"""The e2e side-node cycle's judgements (`dataplane.sidenodes`), on records shaped like the
ones `make e2e` reads: each accepts a good transition and names what is wrong otherwise."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

from dataplane import sidenodes

T0 = datetime(2026, 11, 30, 22, 51, 38, tzinfo=UTC)
BMC = "https://192.0.2.3:40001"
RESET_AT = 1000.0  # the BMC's monotonic clock when it accepted the reset (T0 + 0.05 s)


def iso(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


def wall(monotonic: float) -> datetime:
    return T0 + timedelta(seconds=monotonic - RESET_AT + 0.05)


def shutdown_intent(off_read: float) -> dict[str, Any]:
    gates = [{"gate": g, "verdict": "PASS"} for g in ("demand", "work", "telemetry", "timing")]
    return {
        "metadata": {"name": "gpu-side-01-shutdown-1"},
        "spec": {"nodeName": sidenodes.NODE, "action": "Shutdown", "source": "Policy"},
        "status": {
            "phase": "Succeeded",
            "reasons": ["POWER_OFF_CONFIRMED"],
            "requestRecord": {"decision": "SHUTDOWN", "reasons": ["GATES_PASSED"], "gates": gates},
            "safetyRecord": {
                "policy": {"name": sidenodes.POLICY},
                "confirmation": {
                    "requested": "Off",
                    "observed": "Off",
                    "confirmed": True,
                    "source": f"redfish:{BMC}/redfish/v1/Systems/1",
                    "observedAt": iso(off_read),
                },
            },
        },
    }


RESETS = [
    {"system_id": "1", "reset_type": "GracefulShutdown", "at": RESET_AT, "outcome": "scheduled"}
]


def test_a_shutdown_confirmed_by_a_read_after_the_bmc_switched_off_passes() -> None:
    off_read = 0.05 + sidenodes.TRANSITION_SECONDS + 0.5
    problems, summary = sidenodes.check_shutdown(shutdown_intent(off_read), RESETS, BMC, wall)
    assert problems == []
    assert summary["off_read_at"] > summary["bmc_off_at"]


def test_off_recorded_when_the_request_was_accepted_is_caught() -> None:
    problems, _ = sidenodes.check_shutdown(shutdown_intent(0.3), RESETS, BMC, wall)
    assert len(problems) == 1 and "before the BMC switched Off" in problems[0]


def test_shutdown_faults_are_each_named() -> None:
    good = shutdown_intent(0.05 + sidenodes.TRANSITION_SECONDS + 0.5)
    cases: list[tuple[str, Any]] = []
    two = [*RESETS, {**RESETS[0], "at": RESET_AT + 1}]
    cases.append(("not one GracefulShutdown", (good, two, BMC)))
    other_bmc = copy.deepcopy(good)
    other_bmc["status"]["safetyRecord"]["confirmation"]["source"] = "redfish:https://127.0.0.1:1"
    cases.append(("not an Off read from", (other_bmc, RESETS, BMC)))
    failed_gate = copy.deepcopy(good)
    failed_gate["status"]["requestRecord"]["gates"][1]["verdict"] = "FAIL"
    cases.append(("request gates", (failed_gate, RESETS, BMC)))
    manual = copy.deepcopy(good)
    manual["spec"]["source"] = "Manual"
    cases.append(("not Policy", (manual, RESETS, BMC)))
    default_policy = copy.deepcopy(good)
    default_policy["status"]["safetyRecord"]["policy"]["name"] = "default"
    cases.append((f"not {sidenodes.POLICY}", (default_policy, RESETS, BMC)))
    for expected, (intent, resets, bmc) in cases:
        problems, _ = sidenodes.check_shutdown(intent, resets, bmc, wall)
        assert len(problems) == 1 and expected in problems[0], (expected, problems)


def wake_intent(on_read: float, ready: float, opened: float) -> dict[str, Any]:
    return {
        "metadata": {"name": "gpu-side-01-wake-1"},
        "spec": {"nodeName": sidenodes.NODE, "action": "Wake", "source": "Policy"},
        "status": {
            "phase": "Succeeded",
            "reasons": ["POWER_ON_CONFIRMED", "READY_CONFIRMED"],
            "safetyRecord": {
                "readiness": "Ready",
                "confirmation": {"observed": "On", "confirmed": True, "observedAt": iso(on_read)},
                "readyProbe": {"observedAt": iso(ready)},
                "drain": {"admissionSince": iso(opened)},
            },
        },
    }


def container(started: float) -> dict[str, Any]:
    return {"status": {"phase": "Complete", "startedAt": iso(started)}}


TOOK_OVER = T0 + timedelta(seconds=19)  # the new leader's Lease acquireTime


def test_a_wake_confirmed_after_the_takeover_with_admission_after_on_and_ready_passes() -> None:
    problems, summary = sidenodes.check_wake(
        wake_intent(20, 20.2, 20.4), container(20.7), TOOK_OVER
    )
    assert problems == [] and summary["reasons"] == ["POWER_ON_CONFIRMED", "READY_CONFIRMED"]


def test_wake_faults_are_each_named() -> None:
    cases = [
        ("before On", wake_intent(20, 20.2, 20.1), container(20.7)),  # admission before ready
        ("before the new leader took over", wake_intent(9, 9.2, 9.4), container(9.7)),
        ("before admission opened", wake_intent(20, 20.2, 20.4), container(20.3)),
    ]
    not_ready = wake_intent(20, 20.2, 20.4)
    not_ready["status"]["reasons"] = ["POWER_ON_CONFIRMED"]
    cases.append(("reasons", not_ready, container(20.7)))
    for expected, intent, cd in cases:
        problems, _ = sidenodes.check_wake(intent, cd, TOOK_OVER)
        assert len(problems) == 1 and expected in problems[0], (expected, problems)
