"""Peers and helpers shared by the cloud tests (imported by conftest and the test modules).

`ec2_namespace_filter` is a small WSGI response filter of this test harness placed in
front of moto (see its docstring for exactly what it changes and why).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import asyncssh
from pydantic import SecretStr

from nodewarden.cloud import CloudConfig, CloudCredentials, CloudFacade, CloudInstance, build_cloud
from nodewarden.cloud.protocol import CloudMetricsHook
from nodewarden.scheduling.instancetypes import InstanceType
from nodewarden.ssh.addressing import Endpoint, ResolutionRefused
from nodewarden_doubles.stubcloud import StubCloud
from nodewarden_doubles.stubcloud.process import StubCloudProcess

T = TypeVar("T")

SERVER_CREDENTIALS = ("AKIASTUBSERVERKEY001", "stub-server-secret-5f4e3d2c1b0a")
"""Key and secret the module-scoped stub cloud server (`stub_server`) accepts."""

StubCloudFactory = Callable[..., StubCloud]
"""The `stub_cloud_factory` fixture: call with StubFaults (and credentials/types) to start one."""


@dataclass(frozen=True)
class OperatorKey:
    private: asyncssh.SSHKey
    public_line: str
    private_pem: str


def make_catalogue() -> list[InstanceType]:
    return [
        InstanceType(
            name="small", provider_type="t3.small", vcpus=2, ram="2Gi", price=0.02,
            quota_group="standard",
        ),
        InstanceType(
            name="medium", provider_type="m5.large", vcpus=2, ram="8Gi", scratch="32Gi",
            price=0.096, quota_group="standard",
        ),
        InstanceType(
            name="large", provider_type="m5.2xlarge", vcpus=8, ram="32Gi", scratch="100Gi",
            price=0.384, quota_group="standard",
        ),
        InstanceType(
            name="gpu", provider_type="g4dn.xlarge", vcpus=4, ram="16Gi", gpus=1,
            gpu_model="nvidia-t4", price=0.526, quota_group="g",
        ),
    ]  # fmt: skip


# ---- moto ---------------------------------------------------------------------------------

_MOTO_EC2_NAMESPACE = re.compile(rb'xmlns="http://ec2\.amazonaws\.com/doc/[0-9-]+/?"')
_REAL_EC2_NAMESPACE = b'xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"'
_ERROR_ROOT = re.compile(rb'<Response xmlns="[^"]*">')


def ec2_namespace_filter(app: Any) -> Any:
    """TEST HARNESS RESPONSE FILTER (not part of nodewarden).

    moto answers EC2 calls with xmlns "http://ec2.amazonaws.com/doc/2016-11-15" (no
    trailing slash), while real EC2 -- and libcloud, which matches it exactly -- use
    "http://ec2.amazonaws.com/doc/2016-11-15/". Without this filter libcloud parses no
    element of moto's answers. The filter rewrites that namespace to the real one and
    drops the namespace moto puts on error documents (`<Response xmlns=...>`), which real
    EC2 sends without a namespace (libcloud's `EC2Response.parse_error` looks up
    `Errors/Error` unqualified). Nothing else is changed.
    """

    def filtered(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        captured: dict[str, Any] = {}

        def capture(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            captured["status"] = status
            captured["headers"] = headers
            return lambda _data: None

        result = app(environ, capture)
        try:
            body = b"".join(result)
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()
        body = _ERROR_ROOT.sub(b"<Response>", body)
        body = _MOTO_EC2_NAMESPACE.sub(_REAL_EC2_NAMESPACE, body)
        headers = [(k, v) for k, v in captured["headers"] if k.lower() != "content-length"]
        headers.append(("Content-Length", str(len(body))))
        start_response(captured["status"], headers)
        return [body]

    return filtered


@dataclass(frozen=True)
class MotoEndpoint:
    host: str
    port: int


class MutableClock:
    """A wall clock the test moves by hand (timezone-aware UTC)."""

    def __init__(self, start: datetime | None = None) -> None:
        self.now = start or datetime.now(tz=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


async def ssh_run(
    endpoint: Endpoint,
    key: asyncssh.SSHKey,
    host_public_key: str,
    command: str,
    *,
    timeout: float = 10.0,  # noqa: ASYNC109 - passed to asyncssh as its timeouts
) -> asyncssh.SSHCompletedProcess:
    """Run one command over real SSH, verifying the host key (never accept-any)."""
    known = asyncssh.import_known_hosts(f"[{endpoint.host}]:{endpoint.port} {host_public_key}\n")
    async with asyncssh.connect(
        endpoint.host,
        endpoint.port,
        username="root",
        client_keys=[key],
        known_hosts=known,
        login_timeout=timeout,
        connect_timeout=timeout,
    ) as conn:
        return await conn.run(command, timeout=timeout)


async def poll_until(
    predicate: Callable[[], Awaitable[T | None]],
    *,
    timeout: float,  # noqa: ASYNC109 - a polling deadline, not a cancellation scope
    interval: float = 0.05,
) -> T:
    """Await `predicate` until it returns something not None, or fail after `timeout`."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = await predicate()
        if value is not None:
            return value
        if asyncio.get_running_loop().time() >= deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        await asyncio.sleep(interval)


def stub_facade(
    cloud: StubCloud,
    catalogue: list[InstanceType],
    *,
    dispatcher: str = "disp-a",
    credentials: CloudCredentials | None = None,
    clock: Any = None,
    metrics: CloudMetricsHook | None = None,
    fence: Any = None,
    **config: Any,
) -> CloudFacade:
    """A facade over a running stub cloud (no rate limits unless configured)."""
    settings: dict[str, Any] = {
        "driver": "nodewarden-stub",
        "driver_plugin": "nodewarden_doubles.stubcloud:plugin",
        "driver_params": {"cloud": cloud.name},
        "image": "stub-image",
        "ops_per_second": 0,
        "max_concurrent_creates": 0,
        "instance_types": catalogue,
    }
    settings.update(config)
    kwargs: dict[str, Any] = {"clock": clock} if clock is not None else {}
    return build_cloud(
        CloudConfig(**settings), credentials, dispatcher, metrics=metrics, fence=fence, **kwargs
    )


def remote_facade(
    stub: StubCloudProcess,
    *,
    dispatcher: str = "disp-a",
    credentials: CloudCredentials | str | None = "server",
    clock: Any = None,
    **config: Any,
) -> CloudFacade:
    """A facade over a stub cloud server (no rate limits unless configured).

    `credentials="server"` (default) uses the ones the server accepts.
    """
    settings: dict[str, Any] = {"ops_per_second": 0, "max_concurrent_creates": 0}
    settings.update(config)
    creds = stub.cloud_credentials() if credentials == "server" else credentials
    assert not isinstance(creds, str)
    kwargs: dict[str, Any] = {"clock": clock} if clock is not None else {}
    return build_cloud(stub.cloud_config(**settings), creds, dispatcher, **kwargs)


async def create(
    facade: CloudFacade, type_name: str, key: OperatorKey, name: str = "wn"
) -> tuple[CloudInstance, SecretStr]:
    itype = facade.instance_type(type_name)
    assert itype is not None
    request, secret = facade.create_request(
        name=name, instance_type=itype, ssh_public_key=key.public_line
    )
    return await facade.create(request), secret


async def wait_for_ssh(facade: CloudFacade, instance: CloudInstance) -> Endpoint:
    async def resolved() -> Endpoint | None:
        try:
            return facade.ssh_endpoint(instance)
        except ResolutionRefused:
            return None

    return await poll_until(resolved, timeout=20)
