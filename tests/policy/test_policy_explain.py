"""Scenario files and `nodewarden explain`: one test per SPEC example, output formats, bad files."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from nodewarden.explain import main
from nodewarden.policy.reasons import Decision, ReasonCode
from nodewarden.policy.scenario import ScenarioResult, load_scenario, run_scenario
from nodewarden.policy.state import AdmissionState, PowerState

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "scenarios"
R = ReasonCode


def result_of(name: str) -> ScenarioResult:
    data = yaml.safe_load((EXAMPLES / name).read_text())
    scenario, pol = load_scenario(data)
    return run_scenario(scenario, pol)


def explain(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(args), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


# -- one test per SPEC example ----------------------------------------------------------------


def test_spec_example_baseline_shutdown() -> None:
    r = result_of("baseline-shutdown.yaml")
    assert r.decision is Decision.SHUTDOWN and r.reasons == (R.GATES_PASSED,)
    assert r.state.state is PowerState.SHUTTING_DOWN
    assert [h.decision for h in r.history] == [Decision.DRAIN, Decision.DRAIN, Decision.SHUTDOWN]
    requests = [a for a in r.history[-1].actions if a.type == "RequestPower"]
    assert [a.action for a in requests] == ["GracefulShutdown"]
    assert r.record.demand_reread and r.record.drain.drain_complete


def test_spec_example_baseline_shutdown_confirmed_only_on_observed_off() -> None:
    r = result_of("baseline-shutdown-confirmed.yaml")
    assert [h.state_after for h in r.history] == [PowerState.SHUTTING_DOWN] * 2 + [PowerState.OFF]
    assert r.decision is Decision.NONE and R.POWER_OFF_CONFIRMED in r.reasons
    assert r.record.confirmation.confirmed and r.record.request is not None
    assert r.record.request.result.value == "Accepted"


def test_spec_example_baseline_wake() -> None:
    r = result_of("baseline-wake.yaml")
    assert r.history[0].decision is Decision.START and r.history[0].state_after is PowerState.WAKING
    assert all(h.admission is AdmissionState.CLOSED for h in r.history[:-1])
    assert r.decision is Decision.START and R.READY_CONFIRMED in r.reasons
    assert r.state.admission is AdmissionState.OPEN


def test_spec_example_stale_telemetry_defers() -> None:
    r = result_of("stale-telemetry-defer.yaml")
    assert r.decision is Decision.DEFER and r.reasons[0] is R.TELEMETRY_STALE
    assert set(r.record.telemetry.stale) == {"work", "inhibitors"}


def test_spec_example_active_inhibitor_blocks() -> None:
    r = result_of("inhibitor-block.yaml")
    assert r.decision is Decision.BLOCK and r.reasons[0] is R.INHIBITOR_ACTIVE
    assert r.record.inhibitors is not None and len(r.record.inhibitors.blocking) == 1


def test_spec_example_unsupported_control_blocks() -> None:
    r = result_of("unsupported-control-block.yaml")
    assert r.decision is Decision.BLOCK and r.reasons[0] is R.POWER_CONTROL_UNAVAILABLE
    assert r.evaluation is not None and r.evaluation.action is None


def test_spec_example_wake_acknowledged_without_ready_probe_is_not_start() -> None:
    r = result_of("wake-ack-without-ready.yaml")
    assert r.decision is Decision.DEFER and R.READY_PROBE_FAILED in r.reasons
    assert all(h.decision is not Decision.START for h in r.history[1:])
    assert r.state.state is PowerState.WAKING and r.state.admission is AdmissionState.CLOSED


def test_spec_example_min_on_defers() -> None:
    r = result_of("min-on-defer.yaml")
    assert r.decision is Decision.DEFER and r.reasons[0] is R.MIN_ON_NOT_MET
    measures = {m.name: m for m in r.record.timing}
    assert measures["idleThreshold"].met and measures["minOn"].measured == 22 * 60
    assert measures["minOn"].required == 30 * 60


def test_spec_example_new_demand_during_draining_races() -> None:
    r = result_of("race-demand-during-draining.yaml")
    first = r.history[0]
    assert first.state_after is PowerState.UNKNOWN and R.RACE_DEMAND_ARRIVED in first.reasons
    assert "CancelPendingShutdown" in [a.type for a in first.actions]
    assert [h.admission for h in r.history] == [
        AdmissionState.CLOSED,
        AdmissionState.CLOSED,
        AdmissionState.OPEN,
    ]
    assert r.decision is Decision.START and r.state.race and r.record.race


def test_spec_example_wake_ready_failing_past_deadline_never_binds() -> None:
    r = result_of("wake-ready-deadline.yaml")
    assert r.decision is Decision.BLOCK and R.DEADLINE_EXCEEDED in r.reasons
    assert all(h.decision is not Decision.START for h in r.history[1:])
    assert all(h.admission is not AdmissionState.OPEN for h in r.history)
    assert not any(a.type == "OpenAdmission" for h in r.history for a in h.actions)


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_example_scenario_meets_its_expectation(path: Path) -> None:
    code, out, err = explain("--scenario", str(path), "-o", "json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["expectation"]["met"] is True


# -- output formats -------------------------------------------------------------------------


def test_json_output_has_decision_and_reasons_at_top_level() -> None:
    code, out, _ = explain("--scenario", str(EXAMPLES / "min-on-defer.yaml"), "-o", "json")
    doc = json.loads(out)
    assert code == 0 and list(doc)[:2] == ["decision", "reasons"]
    assert doc["decision"] == "DEFER" and doc["reasons"][0] == "MIN_ON_NOT_MET"
    rows = {row["gate"]: row for row in doc["gates"]["rows"]}
    assert rows["timing"]["verdict"] == "FAIL"
    evidence = rows["timing"]["evidence"][1]
    assert {"name", "value", "source", "observedAt", "age"} <= set(evidence)
    assert doc["safetyRecord"]["decision"] == "DEFER"


def test_yaml_output_parses_with_same_document() -> None:
    path = str(EXAMPLES / "inhibitor-block.yaml")
    _, as_json, _ = explain("--scenario", path, "-o", "json")
    code, as_yaml, _ = explain("--scenario", path, "-o", "yaml")
    assert code == 0 and yaml.safe_load(as_yaml) == json.loads(as_json)


def test_table_output_shows_gate_table_and_record() -> None:
    code, out, _ = explain("--scenario", str(EXAMPLES / "inhibitor-block.yaml"))
    assert code == 0
    assert "Decision: BLOCK" in out
    header = next(line for line in out.splitlines() if line.startswith("GATE"))
    assert header.split() == ["GATE", "VERDICT", "REASONS", "EVIDENCE", "SOURCE", "AGE"]
    assert "restic-backup" in out and "ssh:gpu-03/busctl ListInhibitors" in out
    assert "Safety Record:" in out and "Expectation met." in out


def test_module_runs_as_a_program() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "nodewarden.explain",
            "--scenario",
            str(EXAMPLES / "baseline-wake.yaml"),
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["decision"] == "START"


# -- bad files --------------------------------------------------------------------------------

BASE: dict[str, Any] = yaml.safe_load((EXAMPLES / "min-on-defer.yaml").read_text())


def write(tmp_path: Path, doc: Any) -> str:
    path = tmp_path / "scenario.yaml"
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc))
    return str(path)


def mutated(path: list[Any], value: Any) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(json.dumps(BASE, default=str))
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return doc


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        (mutated(["facts", "demand", "queueed"], 1), "facts.demand.queueed"),
        (mutated(["facts", "work", "activeJobs"], "many"), "facts.work.activeJobs"),
        (mutated(["facts", "demand", "queued"], -1), "facts.demand.queued"),
        (mutated(["facts", "power", "power"], "Sideways"), "facts.power.power"),
        (mutated(["facts", "work", "idleSince"], "now+1h"), "facts.work"),
        (
            mutated(["facts", "power", "observedAt"], "2026-11-30T11:00:00"),
            "facts.power.observedAt",
        ),
        (mutated(["facts", "power", "observedAt"], "now-5parsecs"), "facts.power.observedAt"),
        (mutated(["policy", "spec"], {"minOn": "ten minutes"}), "policy.spec.minOn"),
        (mutated(["policy", "spec"], {"idleTreshold": "5m"}), "policy.spec.idleTreshold"),
        (
            mutated(
                ["policy", "spec"],
                {"billing": {"period": "1h", "windowStart": "50m", "windowEnd": "40m"}},
            ),
            "policy.spec.billing.windowStart",
        ),
        (mutated(["state", "node"], "someone-else"), "state.node"),
        (mutated(["expect", "decision"], "MAYBE"), "expect.decision"),
        (mutated(["now"], "yesterday"), "now"),
        (mutated(["surprise"], True), "surprise"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_bad_file_exits_2_naming_the_field(tmp_path: Path, doc: Any, field: str) -> None:
    code, out, err = explain("--scenario", write(tmp_path, doc))
    assert code == 2 and out == ""
    assert field in err, err


def test_events_out_of_order_are_impossible(tmp_path: Path) -> None:
    doc = json.loads(json.dumps(BASE, default=str))
    doc["events"] = [
        {"time": "now-1m", "event": {"type": "Evaluate"}},
        {"time": "now-2m", "event": {"type": "Evaluate"}},
    ]
    code, _, err = explain("--scenario", write(tmp_path, doc))
    assert code == 2 and "events[1].time" in err


def test_unknown_event_type_names_the_event(tmp_path: Path) -> None:
    doc = json.loads(json.dumps(BASE, default=str))
    doc["events"] = [{"time": "now", "event": {"type": "Explode"}}]
    code, _, err = explain("--scenario", write(tmp_path, doc))
    assert code == 2 and "events[0].event" in err


@pytest.mark.parametrize("text", ["facts: [unclosed", "- just\n- a list\n", ""])
def test_unparseable_or_non_mapping_file_exits_2(tmp_path: Path, text: str) -> None:
    code, _, err = explain("--scenario", write(tmp_path, text))
    assert code == 2 and "nodewarden explain" in err


def test_missing_file_exits_2(tmp_path: Path) -> None:
    code, _, err = explain("--scenario", str(tmp_path / "nope.yaml"))
    assert code == 2 and "cannot read" in err


def test_unmet_expectation_exits_1(tmp_path: Path) -> None:
    doc = mutated(["expect", "decision"], "SHUTDOWN")
    code, out, err = explain("--scenario", write(tmp_path, doc), "-o", "json")
    assert code == 1 and "expect.decision: wanted SHUTDOWN, got DEFER" in err
    assert json.loads(out)["expectation"]["met"] is False
