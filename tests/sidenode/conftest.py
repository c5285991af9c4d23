"""Fixtures of the side-node tests: a client key, a loopback TLS certificate, the real prober."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from sidenode_helpers import LoopbackTls, fast_settings

from nodewarden.ssh import ProbeThrottle, SshClientKey, SshProber
from nodewarden_doubles.fakebmc import write_loopback_certificate


@pytest.fixture
def client_key() -> SshClientKey:
    return SshClientKey.generate()


@pytest.fixture(scope="session")
def tls(tmp_path_factory: pytest.TempPathFactory) -> LoopbackTls:
    directory = tmp_path_factory.mktemp("sidenode-tls")
    context, ca_pem = write_loopback_certificate(directory)
    return LoopbackTls(context, ca_pem, directory)


@pytest.fixture
async def prober() -> AsyncIterator[SshProber]:
    p = SshProber(fast_settings(), throttle=ProbeThrottle(0))
    yield p
    await p.aclose()
