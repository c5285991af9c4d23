"""One machine, one BMC: which WorkerNode a BMC belongs to (pure, no I/O).

A BMC is identified by its endpoint, normalised (scheme, lower-cased host, default port,
no trailing slash or ``/redfish/v1``), with the ComputerSystem id -- and, once read, by the
system's UUID, so a second spelling of the same BMC (an address for a name, another
systemId for the only system) clashes too. Two WorkerNodes clash when their endpoints are
equal and their systemIds are equal or one is unset, or when their BMC UUIDs are equal.

Of the WorkerNodes that clash, one owns the BMC: the one whose enrolment is verified (the
host it reaches over SSH reported the BMC's UUID), else the oldest (creationTimestamp,
then name). Every other is refused its BMC credentials (`CredentialResolver.bmc`), gets
`Valid=False` naming the owner, and counts in `nodewarden_bmc_claimed_twice` (the chart's
alert NodewardenBmcClaimedTwice). The owner keeps serving: refusing both would let anyone
stop a victim's power management by naming its BMC.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

_DEFAULT_PORTS = {"https": 443, "http": 80}
_SERVICE_PATHS = ("/redfish/v1", "/redfish")


def normalised_endpoint(endpoint: str) -> str:
    """``https://BMC-7.lab:443/redfish/v1/`` -> ``https://bmc-7.lab:443``."""
    parts = urlsplit(endpoint.strip())
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    try:
        port = parts.port or _DEFAULT_PORTS.get(scheme, 0)
    except ValueError:
        port = 0
    path = parts.path.rstrip("/")
    for service in _SERVICE_PATHS:
        if path.lower().endswith(service):
            path = path[: -len(service)]
            break
    shown = f"[{host}]" if ":" in host else host
    return f"{scheme}://{shown}:{port}{path.rstrip('/')}"


@dataclass(frozen=True, slots=True)
class BmcClaim:
    """What one WorkerNode says (and what was observed) about its BMC."""

    node: str
    endpoint: str
    """Normalised (`normalised_endpoint`)."""
    system_id: str | None
    created: str
    """The WorkerNode's creationTimestamp (RFC 3339: sorts in time order)."""
    uuid: str | None = None
    """The BMC system's UUID (lower case), once read."""
    verified: bool = False
    """The host the node reaches over SSH reported that UUID (its enrolment is verified)."""

    def clashes(self, other: BmcClaim) -> bool:
        if self.uuid is not None and self.uuid == other.uuid:
            return True
        if self.endpoint != other.endpoint:
            return False
        return (
            self.system_id is None or other.system_id is None or self.system_id == other.system_id
        )

    def describe(self) -> str:
        text = self.endpoint
        if self.system_id:
            text += f", system {self.system_id}"
        if self.uuid:
            text += f", UUID {self.uuid}"
        return text


def _rank(claim: BmcClaim) -> tuple[int, str, str]:
    return (0 if claim.verified else 1, claim.created, claim.node)


class BmcRegistry:
    """Every WorkerNode's BMC claim; `owner_for` says who holds a clashing BMC."""

    def __init__(self) -> None:
        self._claims: dict[str, BmcClaim] = {}

    def put(self, claim: BmcClaim | None, node: str) -> set[str]:
        """Record (or, with None, forget) `node`'s claim; the nodes whose ownership may
        have changed (the node and every node that clashed with it before or after)."""
        before = self._claims.get(node)
        if claim == before:
            return set()
        touched = {node}
        for old in (before, claim):
            if old is not None:
                touched |= {c.node for c in self._claims.values() if c.clashes(old)}
        if claim is None:
            self._claims.pop(node, None)
        else:
            self._claims[node] = claim
        return touched

    def get(self, node: str) -> BmcClaim | None:
        return self._claims.get(node)

    def owner_for(self, node: str) -> BmcClaim | None:
        """The claim that holds `node`'s BMC when it is another node's (None: `node`
        holds it, or claims none)."""
        mine = self._claims.get(node)
        if mine is None:
            return None
        rivals = [c for c in self._claims.values() if c.node != node and c.clashes(mine)]
        if not rivals:
            return None
        owner = min([mine, *rivals], key=_rank)
        return None if owner.node == node else owner

    def refused(self) -> int:
        """How many WorkerNodes are refused their BMC because another holds it."""
        return sum(1 for node in self._claims if self.owner_for(node) is not None)
