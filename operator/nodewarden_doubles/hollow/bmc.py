"""The hollow fleet's BMC: a `BmcTransport` answering Redfish requests from the model, under
the real `RedfishClient`, its auth and `PowerControl`.

One endpoint serves every hollow node as a ComputerSystem whose Id is the node's name
(spec.bmc.systemId), like a BMC aggregator: the service root (no SessionService, so the
client uses Basic auth and logs nothing more), the Systems collection, each system
(PowerState, UUID, the Reset action with its allowable values) and the Reset action
(204; 400 for a type not offered). Anything else is 404 (no power readings: the energy
meter reports none). Requests are counted (`requests`); power requests are recorded by
the model with the replica named in the User-Agent.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any
from urllib.parse import urljoin, urlsplit

from nodewarden.redfish.config import RedfishEndpointConfig
from nodewarden.redfish.transport import BmcTransport, BmcTransportFactory, HttpReply
from nodewarden_doubles.hollow.model import ALLOWABLE, HollowFleet, replica_of

HOLLOW_BMC_ENDPOINT = "https://127.0.0.1:9"
"""The endpoint hollow nodes name in spec.bmc: loopback, discard port, never dialled
(should a real transport ever be used by mistake, nothing leaves the machine)."""

ROOT = "/redfish/v1"
SYSTEMS = ROOT + "/Systems"
RESET = "/Actions/ComputerSystem.Reset"


class HollowBmcTransport:
    """`nodewarden.redfish.transport.BmcTransport` for one client of the hollow BMC."""

    def __init__(self, fleet: HollowFleet, endpoint: str, actor: str | None) -> None:
        self.fleet = fleet
        self.endpoint = endpoint
        self.actor = actor
        self.requests: Counter[str] = Counter()
        self.closed = False

    def url(self, path: str) -> str:
        return urljoin(self.endpoint + "/", path)

    def same_origin(self, url: str) -> bool:
        mine, theirs = urlsplit(self.endpoint), urlsplit(url)
        return (mine.scheme, mine.netloc) == (theirs.scheme, theirs.netloc)

    async def close(self) -> None:
        self.closed = True

    async def request(
        self,
        method: str,
        path: str,
        *,
        headers: Mapping[str, str] | None = None,
        json_body: Mapping[str, Any] | None = None,
        time_limit: float | None = None,
        keep_broken_body: bool = False,
    ) -> HttpReply:
        where = urlsplit(self.url(path)).path.rstrip("/")
        self.requests[f"{method} {where}"] += 1
        status, body = self._answer(method, where, json_body)
        return HttpReply(
            method=method,
            path=path,
            status=status,
            body=body,
            location=None,
            retry_after=None,
            auth_token=None,
            text_excerpt="",
        )

    def _answer(
        self, method: str, where: str, json_body: Mapping[str, Any] | None
    ) -> tuple[int, Any]:
        if method == "GET" and where == ROOT:
            return 200, {"@odata.id": ROOT + "/", "Systems": {"@odata.id": SYSTEMS}}
        if method == "GET" and where == SYSTEMS:
            members = [{"@odata.id": f"{SYSTEMS}/{n}"} for n in sorted(self.fleet.nodes)]
            return 200, {"@odata.id": SYSTEMS, "Members": members}
        if not where.startswith(SYSTEMS + "/"):
            return 404, None
        rest = where[len(SYSTEMS) + 1 :]
        name, _, action = rest.partition("/")
        if name not in self.fleet.nodes:
            return 404, None
        if method == "GET" and not action:
            return 200, self._system(name)
        if method == "POST" and "/" + action == RESET:
            reset_type = (json_body or {}).get("ResetType")
            if not isinstance(reset_type, str):
                return 400, {"error": {"message": "ResetType missing"}}
            accepted = self.fleet.reset(name, reset_type, self.actor)
            return (204, None) if accepted else (400, {"error": {"message": "not allowed"}})
        return 404, None

    def _system(self, name: str) -> dict[str, Any]:
        path = f"{SYSTEMS}/{name}"
        return {
            "@odata.id": path,
            "Id": name,
            "Name": name,
            "UUID": self.fleet.node(name).system_uuid,
            "PowerState": self.fleet.power_state(name),
            "Actions": {
                "#ComputerSystem.Reset": {
                    "target": path + RESET,
                    "ResetType@Redfish.AllowableValues": list(ALLOWABLE),
                }
            },
        }


def bmc_transports(fleet: HollowFleet, actor: str | None = None) -> BmcTransportFactory:
    """`PowerControl(bmc_transport=...)`: each BMC client of one replica gets a hollow
    transport; the actor is `actor`, else the replica its User-Agent names."""

    def make(config: RedfishEndpointConfig, user_agent: str | None) -> BmcTransport:
        return HollowBmcTransport(fleet, config.endpoint, actor or replica_of(user_agent))

    return make
