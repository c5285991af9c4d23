"""Where the prober actually connects: the address-resolver hook between a node's address and a socket.

A node's address (from its WorkerNode spec or the cloud) is *logical*; the resolver turns
it into the endpoint to dial. Production uses `DirectResolver`. Tests and demos use
`MappedResolver`, which maps the addresses a fake cloud invents onto loopback ports and
refuses everything else, so no test ever dials a real network.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A host and TCP port to dial."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


class ResolutionRefused(Exception):
    """The resolver does not allow connecting to this address."""


class AddressResolver(Protocol):
    """Turns a node's logical (host, port) into the endpoint to dial, or refuses it."""

    def resolve(self, host: str, port: int) -> Endpoint: ...


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class DirectResolver:
    """Production: dial the node's address as given."""

    def resolve(self, host: str, port: int) -> Endpoint:
        return Endpoint(host, port)


class LoopbackOnlyResolver:
    """Dial loopback addresses as given and refuse every other address (the safe default)."""

    def resolve(self, host: str, port: int) -> Endpoint:
        if not is_loopback(host):
            raise ResolutionRefused(
                f"{host} is not a loopback address and no mapping is configured for it"
            )
        return Endpoint(host, port)


class MappedResolver:
    """Explicit (host, port) → loopback endpoint mappings; unmapped addresses go to `fallback`.

    The stub cloud registers each fake VM here: its invented address maps to the port of
    the VM's StubWorker on 127.0.0.1. Targets must be loopback unless
    ``allow_non_loopback_targets`` is set.
    """

    def __init__(
        self,
        fallback: AddressResolver | None = None,
        *,
        allow_non_loopback_targets: bool = False,
    ) -> None:
        self._map: dict[tuple[str, int | None], Endpoint] = {}
        self._fallback: AddressResolver = fallback or LoopbackOnlyResolver()
        self._allow_non_loopback = allow_non_loopback_targets

    def map(self, host: str, target: Endpoint, port: int | None = None) -> None:
        """Send (host, port) — or host on any port when port is None — to ``target``."""
        if not self._allow_non_loopback and not is_loopback(target.host):
            raise ValueError(f"mapping target {target} is not a loopback address")
        self._map[(host, port)] = target

    def unmap(self, host: str, port: int | None = None) -> None:
        self._map.pop((host, port), None)

    def resolve(self, host: str, port: int) -> Endpoint:
        target = self._map.get((host, port)) or self._map.get((host, None))
        if target is not None:
            return target
        return self._fallback.resolve(host, port)

    def __len__(self) -> int:
        return len(self._map)
