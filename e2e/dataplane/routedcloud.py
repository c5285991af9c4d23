"""Cloud driver plugin for operator Pods of the e2e data plane: the stub cloud, reached by routing.

The stub cloud (`nodewarden_doubles.stubcloud`, a test double) accepts loopback URLs only
and maps its VMs' fake addresses to 127.0.0.1:<port>; an operator Pod has a loopback of
its own. In `make e2e` the stub cloud runs in the cloud namespace, where a DNAT rule
makes <cloud IP>:<port> reach 127.0.0.1:<port> (see `dataplane.netns`). This plugin is
the stub's remote driver and resolver with just that difference: the base URL is
``http://<cloud IP>:<port>`` and VM addresses resolve to ``<cloud IP>:<ssh port>``.
Nothing else changes: requests are signed the same way, errors classify the same way.
An address of the routed network itself (the side nodes of `make e2e`, whose SSH servers
sit behind the same DNAT rule) is dialled as given; every other address is refused as
the stub's resolver refuses it.

Provider ``nodewarden-stub-routed``; named in the operator config as
``driver_plugin: nwe2e_routedcloud:plugin``. `make e2e` copies this file (as
``nwe2e_routedcloud.py``) and the test doubles into a directory mounted read-only into
the Pods and put on PYTHONPATH: the image itself contains neither. Self-contained on
purpose (imports only nodewarden and nodewarden_doubles).
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from nodewarden.cloud.config import CloudCredentials
from nodewarden.ssh.addressing import AddressResolver, Endpoint
from nodewarden_doubles.stubcloud.remote import RemoteStubNodeDriver, RemoteStubResolver

PROVIDER = "nodewarden-stub-routed"
# The e2e namespaces' link (RFC 5737); the kind environment names its Docker network.
ROUTED_NETWORK = ipaddress.ip_network(os.environ.get("NWE2E_ROUTED_NETWORK", "192.0.2.0/24"))


def routed_base_url(url: str) -> tuple[str, int]:
    """(host, port) of http://<address in ROUTED_NETWORK>:<port>; ValueError otherwise."""
    parts = urlsplit(url)
    try:
        address = ipaddress.ip_address(parts.hostname or "")
    except ValueError:
        address = None
    if parts.scheme != "http" or address is None or address not in ROUTED_NETWORK:
        raise ValueError(f"routed stub cloud URL must be http://<{ROUTED_NETWORK} address>:PORT")
    if parts.port is None or parts.path not in ("", "/") or parts.query:
        raise ValueError("routed stub cloud URL must be http://HOST:PORT with nothing else")
    return str(address), parts.port


def _in_routed_network(host: str) -> bool:
    try:
        return ipaddress.ip_address(host) in ROUTED_NETWORK
    except ValueError:
        return False


class RoutedStubNodeDriver(RemoteStubNodeDriver):
    """`RemoteStubNodeDriver` whose server is at an address of the e2e namespaces' link."""

    type = PROVIDER

    @staticmethod
    def server_address(cloud: str) -> tuple[str, int]:
        return routed_base_url(cloud)


class RoutedStubResolver:
    """VM address -> (cloud IP, port of its SSH server), from the server's endpoint table;
    an address of the routed network -> itself."""

    def __init__(self, url: str, key: str, secret: str | None) -> None:
        self.host, _ = routed_base_url(url)
        # The stub's resolver (cache, refetch on a miss), fed by the routed driver.
        self._table = RemoteStubResolver("http://127.0.0.1:9", key, secret)
        self._table._driver = RoutedStubNodeDriver(key, secret, cloud=url)

    def resolve(self, host: str, port: int) -> Endpoint:
        if _in_routed_network(host):
            return Endpoint(host, port)
        found = self._table.resolve(host, port)
        return Endpoint(self.host, found.port)


class _Plugin:
    provider = PROVIDER

    def register(self) -> None:
        from libcloud.compute.providers import DRIVERS, set_driver

        if PROVIDER not in DRIVERS:
            register: Any = set_driver
            register(PROVIDER, __name__, "RoutedStubNodeDriver")

    def resolver(
        self, driver_params: Mapping[str, object], credentials: CloudCredentials | None
    ) -> AddressResolver:
        key = credentials.key.get_secret_value() if credentials is not None else ""
        secret = (
            credentials.secret.get_secret_value()
            if credentials is not None and credentials.secret is not None
            else None
        )
        return RoutedStubResolver(str(driver_params.get("cloud", "")), key, secret)


plugin = _Plugin()
