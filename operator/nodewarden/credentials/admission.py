"""Endpoint admission: may a credential be sent to this host and port? (pure, no DNS)

An administrator lists, in the operator configuration, the endpoints each kind of
credential may go to (`credentials.bmcEndpoints`, `sshEndpoints`, `wakeOnLanTargets`).
Each entry is one of

    bmc-07.lab.example          one host name (any port)
    *.bmc.lab.example           any host name ending in .bmc.lab.example (one or more labels)
    10.20.0.0/16                an IPv4 or IPv6 network (CIDR); a bare address is a /32 (/128)
    [fd00:1::/64]               IPv6 in brackets, needed when a port follows

optionally followed by ``:PORT`` (``127.0.0.1:8443``, ``*.lab.example:22``,
``[::1]:2222``), so endpoints on one loopback address can be told apart.

Matching never resolves names: a host given as an IP literal matches only network
entries, a host name matches only name entries (case-insensitive, a trailing dot
ignored). A name that DNS would resolve into an admitted network is *not* admitted by
that network -- write the name, or use the address.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

from nodewarden.ssh.addressing import Endpoint

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")

EndpointKind = Literal["bmc", "ssh", "wol"]
__all__ = ["AdmissionList", "Endpoint", "EndpointRule", "InvalidRule", "bmc_endpoint"]


class InvalidRule(ValueError):
    """An admission entry in the operator configuration cannot be parsed."""


@dataclass(frozen=True, slots=True)
class EndpointRule:
    """One admission entry, parsed."""

    text: str
    name: str | None = None
    """Exact host name (lower case), or the suffix after '*.' when `wildcard`."""
    wildcard: bool = False
    network: IPNetwork | None = None
    port: int | None = None

    @classmethod
    def parse(cls, text: str) -> EndpointRule:
        raw = text.strip()
        if not raw:
            raise InvalidRule("an empty entry admits nothing; remove it")
        host, port = _split_port(raw)
        if "/" in host or _is_ip(host):
            try:
                network = ipaddress.ip_network(host, strict=True)
            except ValueError as exc:
                raise InvalidRule(f"{raw!r}: not a valid address or network ({exc})") from None
            return cls(text=raw, network=network, port=port)
        name = host.lower().rstrip(".")
        wildcard = name.startswith("*.")
        if wildcard:
            name = name[2:]
        labels = name.split(".")
        if not name or not all(_LABEL.match(label) for label in labels):
            raise InvalidRule(
                f"{raw!r}: expected a host name, '*.' + a domain, an IP address or a CIDR "
                "network, optionally followed by ':PORT'"
            )
        if wildcard and len(labels) < 2:
            raise InvalidRule(f"{raw!r}: a wildcard needs a domain of at least two labels")
        return cls(text=raw, name=name, wildcard=wildcard, port=port)

    def admits(self, endpoint: Endpoint) -> bool:
        if self.port is not None and endpoint.port != self.port:
            return False
        host = endpoint.host.strip("[]")
        if _is_ip(host):
            if self.network is None:
                return False
            address = ipaddress.ip_address(host)
            return address.version == self.network.version and address in self.network
        if self.name is None:
            return False
        name = host.lower().rstrip(".")
        if self.wildcard:
            return name.endswith("." + self.name)
        return name == self.name


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _split_port(raw: str) -> tuple[str, int | None]:
    if raw.startswith("["):
        end = raw.find("]")
        if end < 0:
            raise InvalidRule(f"{raw!r}: missing ']'")
        host, rest = raw[1:end], raw[end + 1 :]
        if not rest:
            return host, None
        if not rest.startswith(":"):
            raise InvalidRule(f"{raw!r}: expected ':PORT' after ']'")
        return host, _port(raw, rest[1:])
    if raw.count(":") == 1:
        host, _, port = raw.partition(":")
        return host, _port(raw, port)
    return raw, None  # no port, or a bare IPv6 address / network


def _port(raw: str, text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise InvalidRule(f"{raw!r}: the port must be a number 1..65535")
    return int(text)


@dataclass(frozen=True, slots=True)
class AdmissionList:
    """The entries admitting one kind of credential."""

    kind: EndpointKind
    rules: tuple[EndpointRule, ...]

    @classmethod
    def parse(cls, kind: EndpointKind, entries: Iterable[str]) -> AdmissionList:
        return cls(kind, tuple(EndpointRule.parse(e) for e in entries))

    def admits(self, endpoint: Endpoint) -> bool:
        return any(rule.admits(endpoint) for rule in self.rules)

    def describe(self) -> str:
        return ", ".join(r.text for r in self.rules) or "nothing"


def bmc_endpoint(url: str) -> Endpoint:
    """The host and port a Redfish base URL sends to (https; port 443 by default)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    try:
        port = parts.port or 443
    except ValueError:
        port = 0  # an invalid port is admitted by no entry
    return Endpoint(host, port)


def parse_entries(kind: EndpointKind, entries: Sequence[str]) -> AdmissionList:
    """Parse a configuration list; InvalidRule names the entry."""
    return AdmissionList.parse(kind, entries)
