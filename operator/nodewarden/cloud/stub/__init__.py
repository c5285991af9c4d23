"""The stub cloud: a libcloud driver ("nodewarden-stub") whose VMs are real SSH servers.

In-process (one `StubCloud` per name, living as long as the process that starts it)::

    with StubCloud("demo", faults=StubFaults(boot_delay=5), catalogue=types) as cloud:
        driver = get_driver(STUB_PROVIDER)("key", "secret", cloud="demo")

Or as its own process, reached over loopback HTTP like a real cloud API (VMs outlive
their clients; several operator processes share one cloud)::

    with StubCloudProcess(StubServerConfig(instance_types=types)) as stub:
        driver = get_driver(STUB_PROVIDER)("key", "secret", cloud=stub.url)

Modules: `cloud` (the in-memory cloud and its VMs), `faults`, `worker` (the SSH worker
behind each VM), `driver` (libcloud driver), `wire` (HTTP protocol), `server` (the
process), `remote` (driver + address resolver over HTTP), `process` (subprocess and
admin client for tests and demos), `serverconfig` (the server's config file).

`nodewarden.cloud.build_cloud` registers the provider itself when `driver` is
"nodewarden-stub" and picks the address resolver with `stub_resolver`; call
`register_stub_provider()` before using `get_driver` directly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nodewarden.cloud.stub.cloud import (
    StubAddressResolver,
    StubCloud,
    StubVMView,
    WorkerFactory,
    WorkerHandle,
    WorkerSpec,
)
from nodewarden.cloud.stub.driver import STUB_PROVIDER, StubNodeDriver
from nodewarden.cloud.stub.faults import StubFaults
from nodewarden.cloud.stub.remote import RemoteStubNodeDriver, RemoteStubResolver
from nodewarden.cloud.stub.serverconfig import StubServerConfig, StubServerCredentials
from nodewarden.cloud.stub.wire import is_stub_url

if TYPE_CHECKING:
    from nodewarden.cloud.config import CloudCredentials
    from nodewarden.ssh.addressing import AddressResolver


def register_stub_provider() -> None:
    """Register "nodewarden-stub" with libcloud's compute providers (idempotent)."""
    from libcloud.compute.providers import DRIVERS, set_driver

    if STUB_PROVIDER not in DRIVERS:
        # libcloud's annotations say module/class objects; it stores and imports names.
        register: Any = set_driver
        register(STUB_PROVIDER, "nodewarden.cloud.stub.driver", "StubNodeDriver")


def stub_resolver(cloud: object, credentials: CloudCredentials | None = None) -> AddressResolver:
    """The address resolver for the stub cloud named by a driver's `cloud` parameter.

    A URL -> `RemoteStubResolver` asking that server (signed with `credentials`);
    a name -> the resolver of the running in-process `StubCloud` of that name.
    """
    if is_stub_url(cloud):
        key = credentials.key.get_secret_value() if credentials is not None else ""
        secret = (
            credentials.secret.get_secret_value()
            if credentials is not None and credentials.secret is not None
            else None
        )
        return RemoteStubResolver(str(cloud), key, secret)
    return StubCloud.get(str(cloud)).resolver


__all__ = [
    "STUB_PROVIDER",
    "RemoteStubNodeDriver",
    "RemoteStubResolver",
    "StubAddressResolver",
    "StubCloud",
    "StubFaults",
    "StubNodeDriver",
    "StubServerConfig",
    "StubServerCredentials",
    "StubVMView",
    "WorkerFactory",
    "WorkerHandle",
    "WorkerSpec",
    "is_stub_url",
    "register_stub_provider",
    "stub_resolver",
]
