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
    """Every WorkerNode's BMC claim, indexed by endpoint and by UUID (a fleet of thousands of
    nodes, none sharing a BMC, costs a dictionary look-up per change); `owner_for` says who
    holds a clashing BMC."""

    def __init__(self) -> None:
        self._claims: dict[str, BmcClaim] = {}
        self._by_endpoint: dict[str, set[str]] = {}
        self._by_uuid: dict[str, set[str]] = {}
        self._refused: set[str] = set()

    def _rivals(self, claim: BmcClaim) -> list[BmcClaim]:
        names = set(self._by_endpoint.get(claim.endpoint, ()))
        if claim.uuid is not None:
            names |= self._by_uuid.get(claim.uuid, set())
        names.discard(claim.node)
        return [c for n in names if (c := self._claims[n]).clashes(claim)]

    def _index(self, claim: BmcClaim, add: bool) -> None:
        for index, key in ((self._by_endpoint, claim.endpoint), (self._by_uuid, claim.uuid)):
            if key is None:
                continue
            names = index.setdefault(key, set())
            if add:
                names.add(claim.node)
            else:
                names.discard(claim.node)
                if not names:
                    del index[key]

    def put(self, claim: BmcClaim | None, node: str) -> set[str]:
        """Record (or, with None, forget) `node`'s claim; the nodes whose owner changed (a
        node refused or no longer refused, `node` itself when its claim changed)."""
        before = self._claims.get(node)
        if claim == before:
            return set()
        group = {node}
        for old in (before, claim):
            if old is not None:
                group |= {c.node for c in self._rivals(old)}
        owners = {n: self._owner_name(n) for n in group}
        if before is not None:
            self._index(before, add=False)
            del self._claims[node]
        if claim is not None:
            self._claims[node] = claim
            self._index(claim, add=True)
        changed = set()
        for name in group:
            owner = self._owner_name(name)
            if owner is None:
                self._refused.discard(name)
            else:
                self._refused.add(name)
            if owner != owners[name]:
                changed.add(name)
        return changed | {node}

    def get(self, node: str) -> BmcClaim | None:
        return self._claims.get(node)

    def _owner_name(self, node: str) -> str | None:
        owner = self.owner_for(node)
        return owner.node if owner is not None else None

    def owner_for(self, node: str) -> BmcClaim | None:
        """The claim that holds `node`'s BMC when it is another node's (None: `node`
        holds it, or claims none)."""
        mine = self._claims.get(node)
        if mine is None:
            return None
        rivals = self._rivals(mine)
        if not rivals:
            return None
        owner = min([mine, *rivals], key=_rank)
        return None if owner.node == node else owner

    def refused(self) -> int:
        """How many WorkerNodes are refused their BMC because another holds it."""
        return len(self._refused)
