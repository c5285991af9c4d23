"""Fixtures of the Redfish adapter tests: test CAs, the sushy-tools emulator, fake BMCs.

sushy-tools is started once per session (it takes ~1.3 s to answer); each test that
changes power uses its own system, so tests do not disturb each other.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from typing import Any

import pytest
import trustme
from redfish_peers import FAKE_PASSWORD, FakeBmcRunning, StartFakeBmc, SushyEmulator, start_sushy

from nodewarden_doubles.fakebmc import FakeBmc, FakeBmcOptions


@pytest.fixture(scope="session")
def test_ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="session")
def other_ca() -> trustme.CA:
    """A CA that signed nothing the servers use: trusting it must not trust them."""
    return trustme.CA()


@pytest.fixture(scope="session")
def ca_pem(test_ca: trustme.CA) -> str:
    return test_ca.cert_pem.bytes().decode()


@pytest.fixture(scope="session")
def sushy(tmp_path_factory: pytest.TempPathFactory, test_ca: trustme.CA) -> Iterator[SushyEmulator]:
    emulator = start_sushy(tmp_path_factory.mktemp("sushy"), test_ca)
    try:
        yield emulator
    finally:
        emulator.stop()


@pytest.fixture(scope="session")
def server_ssl_context(test_ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    test_ca.issue_cert("127.0.0.1").configure_cert(context)
    return context


@pytest.fixture
async def fake_bmc(server_ssl_context: ssl.SSLContext, ca_pem: str) -> AsyncIterator[StartFakeBmc]:
    """Start fake BMCs with the given FakeBmcOptions fields; all are stopped afterwards."""
    started: list[FakeBmc] = []

    async def start(base: FakeBmcOptions | None = None, **options: Any) -> FakeBmcRunning:
        """`base`: a named variant (e.g. `task_monitor_never_finishing()`), `options`
        override its fields."""
        options.setdefault("password", FAKE_PASSWORD)
        chosen = replace(base, **options) if base is not None else FakeBmcOptions(**options)
        bmc = FakeBmc(chosen, ssl_context=server_ssl_context)
        await bmc.start()
        started.append(bmc)
        return FakeBmcRunning(bmc, ca_pem)

    yield start
    for bmc in started:
        await bmc.stop()
