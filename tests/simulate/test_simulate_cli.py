"""`nodewarden simulate` / `nodewarden trace generate`: determinism, bad input, --plot, formats."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from sim_builders import ROOT, simulate, trace_cmd

from nodewarden.cli import main as nodewarden_main
from nodewarden.simulate.generate import PRESETS, generate
from nodewarden.simulate.peers import PEERS
from nodewarden.simulate.presets import BUILTIN_FLEET_DOCUMENT, builtin_fleet
from nodewarden.simulate.report import compare, render_table
from nodewarden.simulate.trace import dump_trace, parse_trace

DEMO_POLICY = str(ROOT / "e2e" / "demo" / "policy-default.yaml")
SMOKE = ("--trace", "builtin:smoke", "--policy", "builtin:default", "--policy", DEMO_POLICY)


def test_same_seed_gives_byte_identical_output_and_another_seed_does_not() -> None:
    first = simulate(*SMOKE, "--seed", "7", "-o", "json")
    second = simulate(*SMOKE, "--seed", "7", "-o", "json")
    assert first[0] == 0, first[2]
    assert first[1] == second[1]
    other = simulate(*SMOKE, "--seed", "8", "-o", "json")
    assert other[0] == 0 and other[1] != first[1]
    table = simulate(*SMOKE, "--seed", "7")
    assert table == simulate(*SMOKE, "--seed", "7")


def test_table_has_every_column_baselines_and_oracle() -> None:
    code, out, err = simulate(*SMOKE)
    assert code == 0, err
    header = next(line for line in out.splitlines() if line.startswith("POLICY"))
    for column in (
        "COST",
        "/ORACLE",
        "NODE-H",
        "IDLE-H",
        "IDLE%",
        "WAIT-P50",
        "P95",
        "P99",
        "MAX",
        "CYCLES",
        "/NODE",
        "P-UTIL",
        "NOT-RUN",
        "PLACEMENT",
    ):
        assert column in header
    for row in ("never-off (baseline)", "fixed-timeout-1m (baseline)", "oracle (lower bound)"):
        assert row in out
    assert "Decisions by reason code" in out and "SHUTDOWN GATES_PASSED" in out


def test_json_document_lists_policies_and_an_oracle_below_each() -> None:
    _code, out, _ = simulate(*SMOKE, "-o", "json")
    doc = json.loads(out)
    names = [r["policy"] for r in doc["results"]]
    assert names[-2:] == ["never-off", "fixed-timeout-1m"] and len(names) == 4
    for result in doc["results"]:
        assert result["notRun"] == 0
        assert result["cost"] >= doc["oracle"]["cost"]
        assert set(result["waitSeconds"]) == {"p50", "p95", "p99", "max"}


def _bad(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    ("name", "text", "wanted"),
    [
        ("t.csv", "arrival,runtime,ram\n0,60,1Gi\n5,60,lots\n", ":3: ram"),
        ("t.csv", "arrival,runtime\n0,60\n-5,60\n", ":3: arrival"),
        ("t.csv", "arrival,runtime,colour\n0,60,red\n", ":1: unknown column 'colour'"),
        ("t.csv", "arrival,runtime\n0,60\n10\n", ":3: 1 fields"),
        (
            "t.jsonl",
            '{"arrival": 0, "runtime": 60}\n{"arrival": 1, "runtime": \n',
            ":2: not valid JSON",
        ),
        ("t.jsonl", '{"arrival": 0, "runtime": 60, "gpus": -1}\n', ":1: gpus"),
        ("t.jsonl", '{"arrival": 0, "runtime": "soon"}\n', ":1: runtime"),
    ],
)
def test_malformed_trace_line_exits_2_naming_line_and_field(
    tmp_path: Path, name: str, text: str, wanted: str
) -> None:
    code, out, err = simulate("--trace", _bad(tmp_path, name, text), "--policy", "builtin:default")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and wanted in err, err


@pytest.mark.parametrize(
    ("text", "wanted"),
    [
        (
            "apiVersion: nodewarden.io/v1alpha1\nkind: PowerPolicy\nmetadata: {name: x}\n"
            "spec: {idleThreshold: 10 minutes}\n",
            "spec.idleThreshold",
        ),
        ("idleTreshold: 5m\n", "idleTreshold"),
        ("minOn: 2h\nmaxOn: 1h\n", "minOn must not exceed maxOn"),
        ("billing: {period: 1h, windowStart: 55m, windowEnd: 50m}\n", "billing.windowStart"),
        ("- not a mapping\n", "mapping"),
        ("spec: {minOn: [\n", "not valid YAML"),
    ],
)
def test_bad_policy_file_exits_2_naming_the_field(tmp_path: Path, text: str, wanted: str) -> None:
    policy = _bad(tmp_path, "p.yaml", text)
    code, out, err = simulate("--trace", "builtin:smoke", "--policy", policy)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and wanted in err and "p.yaml" in err, err


@pytest.mark.parametrize(
    ("text", "wanted"),
    [
        (
            "cloud: {instanceTypes: [{name: a, vcpus: 0, ram: 1Gi, price: 1}]}\n",
            "cloud.instanceTypes[0].vcpus",
        ),
        (
            "cloud: {boot: {lognormal: {median: 0s, sigma: 1}}, instanceTypes: [{name: a, vcpus: 1, ram: 1Gi, price: 1}]}\n",
            "cloud.boot",
        ),
        (
            "sideNodes: [{name: a, capacity: {vcpus: 4, ram: 8Gi}, controlMethod: Telepathy}]\n",
            "sideNodes[0].controlMethod",
        ),
        ("cloud: {billing: {period: hourly}}\n", "cloud.billing.period"),
        (
            "cloud: {listInterval: 0s, instanceTypes: [{name: a, vcpus: 1, ram: 1Gi, price: 1}]}\n",
            "cloud.listInterval",
        ),
        ("{}\n", "no instance types and no side nodes"),
    ],
)
def test_bad_fleet_file_exits_2_naming_the_field(tmp_path: Path, text: str, wanted: str) -> None:
    fleet = _bad(tmp_path, "f.yaml", text)
    code, out, err = simulate(
        "--trace", "builtin:smoke", "--policy", "builtin:default", "--fleet", fleet
    )
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and wanted in err and "f.yaml" in err, err


def test_usage_errors_exit_2_in_one_line() -> None:
    for args in (
        ("--policy", "builtin:default"),
        ("--trace", "builtin:nope", "--policy", "builtin:default"),
    ):
        code, out, err = simulate(*args)
        assert code == 2 and out == "" and err.count("\n") == 1, err


def test_plot_writes_a_png(tmp_path: Path) -> None:
    target = tmp_path / "plot.png"
    code, _out, err = simulate(*SMOKE, "--plot", str(target))
    assert code == 0, err
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert target.stat().st_size > 10_000


def test_generated_trace_round_trips_and_simulates_like_the_builtin(tmp_path: Path) -> None:
    for fmt in ("csv", "jsonl"):
        target = tmp_path / f"smoke.{fmt}"
        code, _, err = trace_cmd("generate", "--preset", "smoke", "--seed", "3", "-o", str(target))
        assert code == 0 and "wrote" in err
        parsed = parse_trace(target.read_text(), fmt, name="smoke")
        original = generate(PRESETS["smoke"], 3)
        assert parsed.containers == tuple(c for c in original.containers)
        assert dump_trace(parsed, fmt) == target.read_text()


def test_builtin_bursty_week_is_big_and_mixed() -> None:
    trace = generate(PRESETS["bursty-week"], 1)
    assert len(trace.containers) >= 5000
    assert trace.end >= 6.5 * 86_400 * 1_000_000
    gpus = [c for c in trace.containers if c.resources.gpus]
    assert 20 <= len(gpus) < len(trace.containers) // 10
    assert any(c.resources.preemptible for c in trace.containers)


def test_example_fleet_file_is_the_builtin_fleet() -> None:
    example = yaml.safe_load((ROOT / "examples" / "simulate" / "fleet.yaml").read_text())
    assert example == BUILTIN_FLEET_DOCUMENT
    assert builtin_fleet().side_node_count() == 12


def test_registered_in_the_nodewarden_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert nodewarden_main(["--help"]) == 0
    listed = capsys.readouterr().out
    assert "nodewarden simulate --trace" in listed and "nodewarden trace generate" in listed
    assert nodewarden_main(["simulate", "--policy", "builtin:default"]) == 2
    assert "--trace" in capsys.readouterr().err
    assert nodewarden_main(["trace", "generate"]) == 2


def test_peers_and_prophets_add_rows_naming_their_placement() -> None:
    code, out, err = simulate(
        "--trace",
        "builtin:smoke",
        "--policy",
        "builtin:default",
        "--peers",
        "--prophet",
        "-o",
        "json",
    )
    assert code == 0, err
    doc = json.loads(out)
    placements = {p["name"].split()[0]: p["placement"] for p in doc["peers"]}
    assert placements == {
        "arvados": "arvados",
        "karpenter": "karpenter",
        "cluster-autoscaler": "kube-scheduler + autoscaler",
        "slurm": "slurm",
    }
    assert len(doc["peers"]) == 6
    rows = {r["policy"]: r for r in doc["results"]} | {p["name"]: p for p in doc["peers"]}
    assert len(doc["prophets"]) == len(rows)
    for prophet in doc["prophets"]:
        run = rows[prophet["name"].removeprefix("prophet [").removesuffix("]")]
        assert prophet["cost"] <= run["cost"] and prophet["cost"] >= doc["oracle"]["cost"]
        assert prophet["waitSeconds"]["p95"] <= run["waitSeconds"]["p95"]
        assert prophet["placement"] == run.get("placement", "nodewarden")
    peers = [spec.build(spec.default) for spec in PEERS]
    table = render_table(
        compare(
            generate(PRESETS["smoke"], 1), builtin_fleet(), [], 1, with_baselines=False, peers=peers
        )
    )
    karpenter = next(line for line in table.splitlines() if line.startswith("karpenter WhenEmpty "))
    assert karpenter.endswith("karpenter") and "(peer)" in karpenter


def test_dense_day_preset_is_the_documented_trace() -> None:
    trace = generate(PRESETS["dense-day"], 1)
    gpu = [c for c in trace.containers if c.resources.gpus]
    assert 5500 <= len(trace.containers) <= 6800
    assert 0.07 <= len(gpu) / len(trace.containers) <= 0.10
    assert all(c.resources.gpus == 1 and 1800e6 <= c.runtime <= 6 * 3600e6 for c in gpu)
    assert 27 * 3600e6 <= trace.end <= 29 * 3600e6
    bursts = [c for c in trace.containers if c.priority == 300]
    assert bursts and all(c.resources.vcpus <= 2 for c in bursts)
