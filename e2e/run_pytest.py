#!/usr/bin/env python3
"""Run the test suite; exit code 5 ("no tests collected") is reported and counted as a failure.

`make test` and `.ci/run` call this, so an empty or mis-collected suite can never pass
silently. Arguments are passed through to pytest.
"""

from __future__ import annotations

import subprocess
import sys

NO_TESTS_COLLECTED = 5


def main(argv: list[str]) -> int:
    code = subprocess.call([sys.executable, "-m", "pytest", *argv])
    if code == NO_TESTS_COLLECTED:
        print(
            "run_pytest: pytest collected no tests (exit 5); treating this as a FAILURE. "
            "Check the path/-k filter, or the test discovery settings in pyproject.toml.",
            file=sys.stderr,
        )
        return 1
    return code


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
