"""`make test` must not mistake "no tests collected" for success."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from localcluster import REPO


def test_exit_code_5_becomes_failure(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    out = subprocess.run(
        [sys.executable, str(REPO / "e2e" / "run_pytest.py"), str(empty), "-p", "no:cacheprovider"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert out.returncode == 1
    assert "collected no tests" in out.stderr


def test_passing_run_keeps_exit_code_0(tmp_path: Path) -> None:
    (tmp_path / "test_ok.py").write_text("def test_ok():\n    assert 1 + 1 == 2\n")
    out = subprocess.run(
        [
            sys.executable,
            str(REPO / "e2e" / "run_pytest.py"),
            str(tmp_path),
            "-p",
            "no:cacheprovider",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
