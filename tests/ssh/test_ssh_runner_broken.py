"""The runner's `broken` report in `--list` (node contract) is parsed and surfaced."""

from __future__ import annotations

import pytest

from nodewarden.ssh.parsing import OutputError, parse_runner_list, runner_list_says_broken

UUID = "zzzzz-dz642-000000000000001"


def test_broken_marker_is_not_a_runner_and_is_reported() -> None:
    text = f"2001 {UUID}\nbroken\n"
    assert [r.uuid for r in parse_runner_list(text)] == [UUID]
    assert runner_list_says_broken(text)


def test_no_marker_means_not_broken() -> None:
    assert not runner_list_says_broken(f"2001 {UUID}\n")
    assert not runner_list_says_broken("")


def test_other_words_are_still_errors() -> None:
    with pytest.raises(OutputError):
        parse_runner_list("brokenish\n")
