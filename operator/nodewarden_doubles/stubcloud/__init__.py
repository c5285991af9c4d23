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

The operator finds this driver through its configuration, never by name:
``cloud: {driver: nodewarden-stub, driver_plugin: "nodewarden_doubles.stubcloud:plugin"}``
(`plugin` registers the provider and picks the address resolver with `stub_resolver`).
Call `register_stub_provider()` before using `get_driver` directly.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from nodewarden_doubles.stubcloud.cloud import (
    StubAddressResolver,
    StubCloud,
    StubVMView,
    WorkerFactory,
    WorkerHandle,
    WorkerSpec,
)
from nodewarden_doubles.stubcloud.driver import STUB_PROVIDER, StubNodeDriver
from nodewarden_doubles.stubcloud.faults import StubFaults
from nodewarden_doubles.stubcloud.remote import RemoteStubNodeDriver, RemoteStubResolver
from nodewarden_doubles.stubcloud.serverconfig import StubServerConfig, StubServerCredentials
from nodewarden_doubles.stubcloud.wire import is_stub_url

if TYPE_CHECKING:
    from nodewarden.cloud.config import CloudCredentials
    from nodewarden.ssh.addressing import AddressResolver


def register_stub_provider() -> None:
    """Register "nodewarden-stub" with libcloud's compute providers (idempotent)."""
    from libcloud.compute.providers import DRIVERS, set_driver

    if STUB_PROVIDER not in DRIVERS:
        # libcloud's annotations say module/class objects; it stores and imports names.
        register: Any = set_driver
        register(STUB_PROVIDER, "nodewarden_doubles.stubcloud.driver", "StubNodeDriver")


class StubPlugin:
    """The cloud adapter's driver plugin for the stub cloud (`nodewarden.cloud.plugins`)."""

    provider = STUB_PROVIDER

    def register(self) -> None:
        register_stub_provider()

    def resolver(
        self, driver_params: Mapping[str, object], credentials: CloudCredentials | None
    ) -> AddressResolver:
        # In-process stub (cloud=<name>) or a stub cloud server (cloud=http://127.0.0.1:P).
        return stub_resolver(driver_params.get("cloud", "default"), credentials)


plugin = StubPlugin()
"""Name it in the operator config: ``driver_plugin: nodewarden_doubles.stubcloud:plugin``."""


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
    "StubPlugin",
    "StubServerConfig",
    "StubServerCredentials",
    "StubVMView",
    "WorkerFactory",
    "WorkerHandle",
    "WorkerSpec",
    "is_stub_url",
    "plugin",
    "register_stub_provider",
    "stub_resolver",
]
