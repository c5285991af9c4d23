"""The chaos suite's exactly-once check (e2e/chaos/invariants.py): a second run after a run
whose end the operator could observe is a violation; a re-run after a run whose host died
before (or just after) its end is not (the node was the only record of that end)."""

from __future__ import annotations

from typing import Any

from chaos.invariants import containers_exactly_once


def _evidence(runs: list[tuple[float, str]], deaths: dict[str, float]) -> Any:
    return {
        "containers": [
            {
                "metadata": {"name": "c1"},
                "spec": {"uuid": "u1", "runtime": {"durationHintSeconds": 2.5}},
                "status": {"phase": "Complete", "reason": "Exited"},
            }
        ],
        "cloud_runs": [{"uuid": "u1", "instanceId": vm, "startedAt": t} for t, vm in runs],
        "side_runs": {},
        "side_events": {},
        "vm_deaths": deaths,
    }


def test_a_second_run_after_an_observable_end_is_a_violation() -> None:
    ev = _evidence([(100.0, "i-1"), (120.0, "i-2")], {})
    assert containers_exactly_once(ev)


def test_a_rerun_after_the_host_died_just_after_the_end_is_not() -> None:
    # ran 100.0-102.5 on i-1, which died at 103.3: the end could not be seen
    ev = _evidence([(100.0, "i-1"), (106.8, "i-2")], {"i-1": 103.3})
    assert containers_exactly_once(ev) == []


def test_one_run_that_finished_is_fine_and_none_is_not() -> None:
    assert containers_exactly_once(_evidence([(100.0, "i-1")], {})) == []
    assert containers_exactly_once(_evidence([(100.0, "i-1")], {"i-1": 101.0}))
