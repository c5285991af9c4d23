"""`e2e/chaos/recheck.py` over small handcrafted reports: the capacity invariant flags an
overcommitted host and only that; exactly-once flags a second run after an exit the host
could report, not a re-run after the host died just after the exit; overlapping runs of
one container and interleaved replicas are flagged; the script's exit status says so."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from chaos import recheck

SCRIPT = Path(__file__).resolve().parents[2] / "e2e" / "chaos" / "recheck.py"
GPU_NODE = {
    "kind": "side",
    "name": "side-a",
    "owner": "a",
    "size": None,
    "capacity": {"vcpus": 16, "ram": 64 << 30, "gpus": 1},
}


def _run(host: str, start: float, end: float | None, how: str | None = "exited") -> dict[str, Any]:
    return {"host": host, "startedAt": start, "endedAt": end, "end": how if end else None}


def _container(name: str, runs: list[dict[str, Any]], gpus: int = 1) -> dict[str, Any]:
    return {
        "name": name,
        "uuid": f"u-{name}",
        "phase": "Complete",
        "reason": "Exited",
        "node": "side-a",
        "resources": {"vcpus": 2, "ram": 8 << 30, "gpus": gpus},
        "runs": runs,
    }


def _report(
    containers: list[dict[str, Any]], deaths: dict[str, list[float]] | None = None
) -> dict[str, Any]:
    return {
        "format": recheck.FORMAT,
        "seed": 1,
        "readAt": 200.0,
        "observeWindow": 5.0,
        "nodes": {"side:side-a": GPU_NODE},
        "containers": containers,
        "strayRuns": [],
        "hostDeaths": deaths or {},
        "powerRequests": [],
    }


def test_two_gpu_runs_at_once_on_a_one_gpu_node_is_an_overcommit() -> None:
    report = _report(
        [
            _container("a", [_run("side:side-a", 100.0, 104.0)]),
            _container("b", [_run("side:side-a", 102.0, 106.0)]),
        ]
    )
    (violation,) = recheck.capacity(report)
    assert "side:side-a" in violation and "gpus 2/1" in violation
    assert "from 102.00 to 104.00" in violation and "['a', 'b']" in violation


def test_back_to_back_runs_and_cpu_only_work_beside_a_gpu_run_fit() -> None:
    report = _report(
        [
            _container("a", [_run("side:side-a", 100.0, 104.0)]),
            _container("b", [_run("side:side-a", 104.0, 108.0)]),  # starts as a ends
            _container("c", [_run("side:side-a", 101.0, 107.0)], gpus=0),
        ]
    )
    assert recheck.capacity(report) == []


def test_a_run_still_going_counts_until_the_report_was_read() -> None:
    report = _report(
        [
            _container("a", [_run("side:side-a", 100.0, None)]),
            _container("b", [_run("side:side-a", 190.0, 195.0)]),
        ]
    )
    assert recheck.capacity(report)


def test_runs_on_a_host_of_unknown_capacity_are_flagged() -> None:
    report = _report([_container("a", [_run("vm:i-9", 100.0, 101.0)])])
    assert recheck.capacity(report) == ["vm:i-9: runs recorded but no capacity known for it"]


def test_a_second_run_after_an_observable_exit_is_a_violation() -> None:
    runs = [_run("side:side-a", 100.0, 102.5), _run("side:side-a", 120.0, 122.5)]
    assert recheck.exactly_once(_report([_container("c1", runs)]))


def test_a_rerun_after_the_host_died_just_after_the_exit_is_not() -> None:
    # ran 100.0-102.5, the host died at 103.3: nobody could see that exit
    runs = [_run("side:side-a", 100.0, 102.5), _run("side:side-a", 106.8, 109.3)]
    assert recheck.exactly_once(_report([_container("c1", runs)], {"side:side-a": [103.3]})) == []


def test_complete_needs_a_run_that_exited() -> None:
    assert (
        recheck.exactly_once(_report([_container("c1", [_run("side:side-a", 100.0, 102.5)])])) == []
    )
    lost = [_run("side:side-a", 100.0, 101.0, "powerLoss")]
    assert recheck.exactly_once(_report([_container("c1", lost)]))


def test_overlapping_runs_of_one_container_are_two_runners() -> None:
    runs = [_run("side:side-a", 100.0, 104.0, "killed"), _run("vm:i-1", 103.0, 106.0)]
    (violation,) = recheck.never_two_runners(_report([_container("c1", runs, gpus=0)]))
    assert "started at 103.00" in violation


def test_interleaved_replicas_of_one_dispatcher_are_two_actors() -> None:
    report = _report([])
    report["powerRequests"] = [
        {"node": "side-a", "at": 10.0, "dispatcher": "d", "replica": "r1"},
        {"node": "side-b", "at": 12.0, "dispatcher": "d", "replica": "r2"},
        {"node": "side-a", "at": 14.0, "dispatcher": "d", "replica": "r1"},
        {"node": "side-c", "at": 13.0, "dispatcher": "other", "replica": "x"},
    ]
    (violation,) = recheck.one_actor_at_a_time(report)
    assert "dispatcher d" in violation and "r2" in violation
    report["powerRequests"] = report["powerRequests"][:2]
    assert recheck.one_actor_at_a_time(report) == []


def test_the_script_alone_exits_1_on_an_overcommit_and_0_on_a_clean_report(tmp_path: Path) -> None:
    over = _report(
        [
            _container("a", [_run("side:side-a", 100.0, 104.0)]),
            _container("b", [_run("side:side-a", 102.0, 106.0)]),
        ]
    )
    clean = _report([_container("a", [_run("side:side-a", 100.0, 104.0)])])
    for name, report, status in (("over", over, 1), ("clean", clean, 0)):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(report))
        # -I: isolated, only the standard library and the script itself
        done = subprocess.run(
            [sys.executable, "-I", str(SCRIPT), str(path)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == status, done.stdout + done.stderr
        capacity_line = next(line for line in done.stdout.splitlines() if "capacity" in line)
        assert capacity_line.split()[0] == str(status)


def test_a_run_or_a_power_request_of_another_install_on_a_node_is_flagged() -> None:
    mine = _run("side:side-a", 100.0, 101.0) | {"dispatcherId": "a"}
    theirs = _run("side:side-a", 102.0, 103.0) | {"dispatcherId": "b"}
    harness = _run("side:side-a", 104.0, 105.0)  # started by the harness: no owner
    report = _report([_container("c1", [mine, harness]), _container("c2", [theirs])])
    report["powerRequests"] = [
        {"node": "side-a", "at": 10.0, "resetType": "On", "dispatcher": "a"},
        {"node": "side-a", "at": 11.0, "resetType": "ForceOff", "dispatcher": "b"},
    ]
    violations = recheck.installs_apart(report)
    assert len(violations) == 2
    assert "install b ran it on side:side-a" in violations[0]
    assert "ForceOff" in violations[1]
