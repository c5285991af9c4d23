"""The stub cloud: a libcloud driver ("nodewarden-stub") whose VMs are real SSH servers.

Used by tests and `make demo`::

    with StubCloud("demo", faults=StubFaults(boot_delay=5), catalogue=types) as cloud:
        driver = get_driver(STUB_PROVIDER)("key", "secret", cloud="demo")

`nodewarden.cloud.build_cloud` registers the provider itself when `driver` is
"nodewarden-stub"; call `register_stub_provider()` before using `get_driver` directly.
"""

from __future__ import annotations

from typing import Any

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


def register_stub_provider() -> None:
    """Register "nodewarden-stub" with libcloud's compute providers (idempotent)."""
    from libcloud.compute.providers import DRIVERS, set_driver

    if STUB_PROVIDER not in DRIVERS:
        # libcloud's annotations say module/class objects; it stores and imports names.
        register: Any = set_driver
        register(STUB_PROVIDER, "nodewarden.cloud.stub.driver", "StubNodeDriver")


__all__ = [
    "STUB_PROVIDER",
    "StubAddressResolver",
    "StubCloud",
    "StubFaults",
    "StubNodeDriver",
    "StubVMView",
    "WorkerFactory",
    "WorkerHandle",
    "WorkerSpec",
    "register_stub_provider",
]
