"""The stub node's in-memory runner: lifetimes, kills, crash and start-failure faults."""

from __future__ import annotations

import json
import random

import pytest

from nodewarden_doubles.stubworker import FakeRunner, RunnerRefused

UUID_1 = "zzzzz-dz642-000000000000001"
UUID_2 = "zzzzz-dz642-000000000000002"


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def make_runner(clock: Clock, crash: float = 0.0, fail: float = 0.0, seed: int = 1) -> FakeRunner:
    return FakeRunner(random.Random(seed), clock, lambda: crash, lambda: fail)


def config(uuid: str, duration: float | None = None, exit_code: int | None = None) -> str:
    runtime: dict[str, object] = {}
    if duration is not None:
        runtime["durationHintSeconds"] = duration
    if exit_code is not None:
        runtime["exitCodeHint"] = exit_code
    return json.dumps({"uuid": uuid, "runtime": runtime})


def test_container_runs_for_its_duration_then_exits_with_its_code() -> None:
    clock = Clock()
    runner = make_runner(clock)
    pid = runner.start(config(UUID_1, duration=5, exit_code=7))
    assert [c.uuid for c in runner.running()] == [UUID_1]
    assert runner.status(UUID_1) == {
        "uuid": UUID_1,
        "state": "running",
        "pid": pid,
        "exitCode": None,
        "signal": None,
        "dispatcherId": None,
        "uid": None,
        "fence": None,
    }
    clock.now += 4.9
    assert runner.status(UUID_1)["state"] == "running"
    clock.now += 0.2
    assert runner.status(UUID_1)["state"] == "exited"
    assert runner.status(UUID_1)["exitCode"] == 7
    assert runner.running() == []


def test_start_is_idempotent_while_running_and_pids_are_distinct() -> None:
    clock = Clock()
    runner = make_runner(clock)
    first = runner.start(config(UUID_1, duration=10))
    assert runner.start(config(UUID_1, duration=10)) == first
    second = runner.start(config(UUID_2))
    assert second != first
    clock.now += 11
    assert runner.start(config(UUID_1, duration=10)) not in (first, second)  # a new run


def test_kill_ends_a_running_container_and_is_idempotent() -> None:
    clock = Clock()
    runner = make_runner(clock)
    runner.start(config(UUID_1))  # no duration: runs until killed
    clock.now += 3600
    assert runner.status(UUID_1)["state"] == "running"
    runner.kill(UUID_1, "TERM")
    runner.kill(UUID_1, "KILL")
    runner.kill(UUID_2, "TERM")  # unknown uuid: nothing to do
    status = runner.status(UUID_1)
    assert (status["state"], status["signal"], status["exitCode"]) == ("killed", "TERM", None)
    with pytest.raises(RunnerRefused):
        runner.kill(UUID_1, "STOP")


def test_crash_fault_loses_the_container_before_it_finishes() -> None:
    clock = Clock()
    runner = make_runner(clock, crash=1.0, seed=3)
    runner.start(config(UUID_1, duration=100, exit_code=0))
    container = runner.get(UUID_1)
    assert container is not None and container.crash_at is not None
    assert clock.now <= container.crash_at < clock.now + 100
    clock.now = container.crash_at
    assert runner.status(UUID_1)["state"] == "lost"
    clock.now += 1000
    assert runner.status(UUID_1)["state"] == "lost"  # never 'exited' after a crash


def test_crash_rate_is_a_seeded_probability() -> None:
    def crashed(seed: int) -> int:
        clock = Clock()
        runner = make_runner(clock, crash=0.3, seed=seed)
        for i in range(200):
            runner.start(config(f"zzzzz-dz642-{i:015d}", duration=1))
        clock.now += 2
        return sum(runner.status(f"zzzzz-dz642-{i:015d}")["state"] == "lost" for i in range(200))

    assert crashed(11) == crashed(11)  # same seed, same faults
    assert 30 <= crashed(11) <= 90  # about 30 % of 200


def test_start_failure_fault_and_bad_configs_are_refused() -> None:
    clock = Clock()
    failing = make_runner(clock, fail=1.0)
    with pytest.raises(RunnerRefused) as info:
        failing.start(config(UUID_1))
    assert info.value.exit_status == 1
    runner = make_runner(clock)
    for bad in (
        "not json",
        "[]",
        json.dumps({"uuid": "nope"}),
        json.dumps({"uuid": UUID_1, "runtime": 5}),
    ):
        with pytest.raises(RunnerRefused) as info:
            runner.start(bad)
        assert info.value.exit_status == 2
    assert runner.running() == []


def test_unknown_uuid_and_reboot() -> None:
    clock = Clock()
    runner = make_runner(clock)
    assert runner.status(UUID_1)["state"] == "unknown"
    runner.start(config(UUID_1))
    runner.reboot()
    assert runner.status(UUID_1)["state"] == "unknown"
    assert runner.running() == []
