"""Out-of-tree cloud drivers: found by a `module:attribute` entry in the config, never by name.

A libcloud provider that is not built into libcloud (the project's stub cloud, a site's
own driver) is named in `CloudConfig.driver_plugin` as ``package.module:attribute``.
That attribute is a `DriverPlugin`: it registers its provider with libcloud (so
`get_driver(config.driver)` works) and says where to dial the addresses its instances
report. nodewarden itself imports no such package by name: the installed operator
runs without the test doubles (a sibling package of `operator/`), which `make demo` and the tests
name in their configuration.

A plugin may also provide the nodes' wires (`WirePlugin`: an SSH dialer and a BMC
transport), as the hollow fleet of the benchmarks does; `compose` then builds the prober
and the power control on them (`wire_plugin`), and nothing above them changes.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Protocol, runtime_checkable

from nodewarden.cloud.config import CloudConfig, CloudCredentials
from nodewarden.redfish.transport import BmcTransportFactory
from nodewarden.ssh.addressing import AddressResolver
from nodewarden.ssh.connection import DialerPort


@runtime_checkable
class DriverPlugin(Protocol):
    """What an out-of-tree driver package offers the cloud adapter."""

    provider: str
    """The libcloud provider name it registers (must equal `CloudConfig.driver`)."""

    def register(self) -> None:
        """Register the provider with libcloud (idempotent)."""

    def resolver(
        self, driver_params: Mapping[str, object], credentials: CloudCredentials | None
    ) -> AddressResolver:
        """Where to dial the addresses this driver's instances report."""


@runtime_checkable
class WirePlugin(Protocol):
    """A driver plugin that also stands in for the nodes' wires: how SSH connections are
    opened and what a BMC client talks to (a hollow fleet: `nodewarden_doubles.hollow`).
    Optional: a plugin without these methods leaves SSH and HTTPS as they are."""

    def dialer(self, driver_params: Mapping[str, object], replica: str | None) -> DialerPort:
        """Opens every node's connection for the prober."""

    def bmc_transport(self, driver_params: Mapping[str, object]) -> BmcTransportFactory:
        """Makes each BMC client's wire."""


class PluginError(ValueError):
    """The configured driver plugin cannot be loaded; the message names the fix."""


def load_plugin(spec: str, provider: str) -> DriverPlugin:
    """Import ``module:attribute`` and check it is a DriverPlugin for `provider`."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise PluginError(f"cloud.driver_plugin {spec!r}: expected 'package.module:attribute'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise PluginError(
            f"cloud.driver_plugin {spec!r}: cannot import {module_name!r} ({exc}); "
            "install the package that provides it"
        ) from exc
    except Exception as exc:  # a plugin module that fails while importing
        raise PluginError(
            f"cloud.driver_plugin {spec!r}: importing {module_name!r} failed "
            f"({type(exc).__name__}: {exc}); fix or replace that module"
        ) from exc
    plugin = getattr(module, attribute, None)
    if not isinstance(plugin, DriverPlugin):
        raise PluginError(
            f"cloud.driver_plugin {spec!r}: {attribute!r} is not a driver plugin "
            "(needs provider, register() and resolver())"
        )
    if plugin.provider != provider:
        raise PluginError(
            f"cloud.driver_plugin {spec!r} provides {plugin.provider!r}, but cloud.driver "
            f"is {provider!r}; make them agree"
        )
    return plugin


def wire_plugin(config: CloudConfig | None) -> WirePlugin | None:
    """The configured driver plugin when it also provides the nodes' wires (`WirePlugin`),
    else None: SSH over TCP and Redfish over HTTPS, as always."""
    if config is None or config.driver_plugin is None:
        return None
    plugin = load_plugin(config.driver_plugin, config.driver)
    return plugin if isinstance(plugin, WirePlugin) else None
