"""The calibration figure and the deadlines scaled by it (e2e/calibration.py)."""

from __future__ import annotations

import pytest

import calibration


def test_a_slower_machine_stretches_deadlines_and_a_faster_one_never_shrinks_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(calibration.ENV, str(calibration.REFERENCE_SECONDS * 2))
    assert calibration.scaled(10.0) == pytest.approx(20.0)
    monkeypatch.setenv(calibration.ENV, str(calibration.REFERENCE_SECONDS / 2))
    assert calibration.scaled(10.0) == 10.0


def test_the_summary_names_the_figure_and_the_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(calibration.ENV, "3.51")
    line = calibration.summary()
    assert "calibration: 3.51 s CPU" in line and "x1.50" in line and "load average" in line


def test_a_bad_override_is_refused_with_the_variable_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(calibration.ENV, "fast")
    with pytest.raises(SystemExit, match="NODEWARDEN_CALIBRATION"):
        calibration.figure()
