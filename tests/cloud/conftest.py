"""Fixtures of the cloud tests: the operator's SSH key, a catalogue, stub clouds, a moto EC2.

`stub_server` is a stub cloud server subprocess (`nodewarden_doubles.stubcloud.process`) shared
by a test module, with `SERVER_CREDENTIALS` and the test catalogue; its faults and forced
rate limits are reset after every test.

The moto server runs in-process on 127.0.0.1 behind `cloud_peers.ec2_namespace_filter`,
a small WSGI response filter of this test harness (see its docstring).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterable, Iterator

import asyncssh
import pytest

from cloud.cloud_peers import (
    SERVER_CREDENTIALS,
    MotoEndpoint,
    OperatorKey,
    StubCloudFactory,
    ec2_namespace_filter,
    make_catalogue,
)
from nodewarden.scheduling.instancetypes import InstanceType
from nodewarden_doubles.stubcloud import StubCloud, StubFaults, StubServerConfig
from nodewarden_doubles.stubcloud.process import StubCloudProcess

_names = itertools.count(1)


@pytest.fixture(scope="session")
def operator_key() -> OperatorKey:
    key = asyncssh.generate_private_key("ssh-ed25519", comment="nodewarden-test")
    return OperatorKey(
        private=key,
        public_line=key.export_public_key().decode().strip(),
        private_pem=key.export_private_key().decode(),
    )


@pytest.fixture
def catalogue() -> list[InstanceType]:
    return make_catalogue()


@pytest.fixture
def stub_cloud_factory(catalogue: list[InstanceType]) -> Iterator[StubCloudFactory]:
    """Start stub clouds with unique names; all are closed at the end of the test."""
    started: list[StubCloud] = []

    def start(
        faults: StubFaults | None = None,
        *,
        credentials: tuple[str, str | None] | None = None,
        types: Iterable[InstanceType] | None = None,
    ) -> StubCloud:
        cloud = StubCloud(
            f"test-{next(_names)}",
            faults=faults,
            catalogue=list(types) if types is not None else catalogue,
            credentials=credentials,
        ).start()
        started.append(cloud)
        return cloud

    yield start
    for cloud in started:
        cloud.close()


@pytest.fixture(scope="module")
def moto_ec2() -> Iterator[MotoEndpoint]:
    """A moto server (all backends, EC2 used) on 127.0.0.1:<free port>, filtered as above."""
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    app = ec2_namespace_filter(DomainDispatcherApplication(create_backend_app))
    server = make_server("127.0.0.1", 0, app, threaded=True, request_handler=MotoRequestHandler)
    thread = threading.Thread(target=server.serve_forever, name="moto", daemon=True)
    thread.start()
    try:
        yield MotoEndpoint("127.0.0.1", int(server.server_address[1]))
    finally:
        server.shutdown()
        thread.join(10)


@pytest.fixture(scope="module")
def stub_server_process(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[StubCloudProcess]:
    config = StubServerConfig(
        name="tests",
        credentials={"key": SERVER_CREDENTIALS[0], "secret": SERVER_CREDENTIALS[1]},
        instance_types=make_catalogue(),
    )
    stub = StubCloudProcess(config, workdir=tmp_path_factory.mktemp("stub-server")).start()
    try:
        yield stub
    finally:
        stub.stop()


@pytest.fixture
def stub_server(stub_server_process: StubCloudProcess) -> Iterator[StubCloudProcess]:
    """The module's stub cloud server, with default faults again after the test."""
    yield stub_server_process
    if stub_server_process.running:
        stub_server_process.admin.force_rate_limit(0)
        stub_server_process.admin.set_faults(**StubFaults().model_dump())
