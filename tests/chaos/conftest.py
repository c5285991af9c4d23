"""The CI variant's option: `--report FILE.json` (as `make chaos` has it).

    .venv/bin/python -m pytest tests/chaos --report chaos-ci.json

Under `make test` (no option given) the report goes to the test's tmp_path.
"""

from __future__ import annotations

import pytest

from chaos.scenario import add_report_option


def pytest_addoption(parser: pytest.Parser) -> None:
    add_report_option(parser)
