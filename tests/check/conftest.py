"""Fixtures of the `nodewarden check` tests: a BMC CA and the peers (tests/check/checkpeers.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import trustme
from checkpeers import Peers


@pytest.fixture(scope="session")
def bmc_ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def peers(bmc_ca: trustme.CA) -> Iterator[Peers]:
    running = Peers(bmc_ca)
    yield running
    running.close()
