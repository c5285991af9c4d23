"""The watch command's line format (pure): state and heartbeat lines round-trip, other
versions and malformed fields are errors, unknown v1 kinds are skipped."""

from __future__ import annotations

import pytest

from nodewarden.ssh.parsing import OutputError
from nodewarden.ssh.watchlines import (
    HEARTBEAT,
    WatchState,
    heartbeat_line,
    parse_watch_line,
    state_line,
    watch_command,
)

UUID = "zzzzz-dz642-000000000000001"


def test_a_state_line_round_trips_with_the_runner_owners() -> None:
    line = state_line(True, "running", False, [f"2001 {UUID} dispatcher=d1 uid=u-1 fence=3"])
    parsed = parse_watch_line(line)
    assert isinstance(parsed, WatchState) and parsed.ready and not parsed.broken
    (runner,) = parsed.runners
    assert (runner.pid, runner.uuid, runner.dispatcher_id, runner.fence) == (2001, UUID, "d1", 3)


def test_heartbeats_in_either_spelling() -> None:
    assert parse_watch_line(heartbeat_line()) is HEARTBEAT
    assert parse_watch_line('{"kind": "heartbeat", "v": 1}') is HEARTBEAT


@pytest.mark.parametrize(
    "line",
    [
        "usage: runner run --detach ...",
        '{"v":2,"kind":"heartbeat"}',
        '{"v":1,"kind":"state","ready":"yes","runners":[]}',
        '{"v":1,"kind":"state","ready":true}',
        '{"v":1,"kind":"state","ready":true,"runners":["not a runner"]}',
        "[1]",
    ],
)
def test_other_versions_and_malformed_lines_are_errors(line: str) -> None:
    with pytest.raises(OutputError):
        parse_watch_line(line)


def test_an_unknown_v1_kind_is_skipped() -> None:
    assert parse_watch_line('{"v":1,"kind":"inhibitors","data":[]}') is None


def test_the_watch_command_carries_the_heartbeat() -> None:
    assert watch_command("sudo crunch-run", 10.0) == "sudo crunch-run --watch --heartbeat 10"
    assert watch_command("nodewarden-runner", 2.5).endswith("--heartbeat 2.5")
