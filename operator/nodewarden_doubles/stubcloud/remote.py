"""The remote side of the stub cloud's libcloud driver and address resolver (loopback HTTP).

`RemoteStubNodeDriver` is what `get_driver("nodewarden-stub")(key, secret,
cloud="http://127.0.0.1:PORT")` returns: a libcloud driver built like a real provider
driver, on libcloud's own `ConnectionUserAndKey` (requests session, timeouts, optional
retries) and a `JsonResponse` subclass whose `parse_error` raises the same libcloud
exceptions as the in-process stub (`InvalidCredsError` on 401; otherwise libcloud's
`exception_from_message` with the "Code: message" text and the headers, so 429 becomes
`RateLimitReachedError` with its Retry-After). Every request is signed
(`nodewarden_doubles.stubcloud.wire`); the secret never travels.

`RemoteStubResolver` is the `nodewarden.ssh.addressing.AddressResolver` for VMs of a
stub cloud server: it maps a VM's fake address (198.18.0.0/15) to 127.0.0.1:<port of its
SSH server> from the server's endpoint table, cached for `ttl` seconds and refetched on
a miss (at most once per `min_refresh_interval`); loopback addresses pass as given, any
other address is refused.

Only loopback URLs are accepted (`wire.loopback_base_url`).
"""

from __future__ import annotations

import ipaddress
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import unquote

from libcloud.common.base import ConnectionUserAndKey, JsonResponse
from libcloud.common.types import InvalidCredsError
from libcloud.compute.base import Node, NodeImage, NodeSize

from nodewarden.scheduling.instancetypes import InstanceType
from nodewarden.ssh.addressing import Endpoint, ResolutionRefused, is_loopback
from nodewarden_doubles.stubcloud import wire
from nodewarden_doubles.stubcloud.cloud import ADDRESS_NETWORK
from nodewarden_doubles.stubcloud.driver import StubNodeDriver, to_node, to_size

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 30.0


class StubApiResponse(JsonResponse):
    """A stub cloud API answer; errors become the in-process stub's libcloud exceptions."""

    def success(self) -> bool:
        status: int = self.status
        return 200 <= status < 300

    def parse_error(self) -> str:
        try:
            body = json.loads(self.body) if self.body else None
        except ValueError:
            body = None
        text = wire.error_text(body) or str(self.body or f"HTTP {self.status}")
        if self.status == 401:
            raise InvalidCredsError(text)
        return text


class StubApiConnection(ConnectionUserAndKey):
    """HTTP connection to a stub cloud server; `user_id` = access key, `key` = secret."""

    responseCls = StubApiResponse
    timeout = DEFAULT_TIMEOUT

    def add_default_headers(self, headers: dict[str, str]) -> dict[str, str]:
        headers["Accept"] = "application/json"
        if self.data:
            headers["Content-Type"] = "application/json"
        return headers

    def pre_connect_hook(
        self, params: dict[str, Any], headers: dict[str, str]
    ) -> tuple[dict[str, Any], dict[str, str]]:
        data = self.data
        body = data.encode() if isinstance(data, str) else (data or b"")
        headers["Authorization"] = wire.authorization_header(
            str(self.user_id),
            str(self.key or ""),
            str(self.method),
            unquote(str(self.action)),
            wire.query_pairs(params),
            int(time.time()),
            body,
        )
        return params, headers


class RemoteStubNodeDriver(StubNodeDriver):
    """libcloud driver of a stub cloud server reached over loopback HTTP."""

    connectionCls = StubApiConnection
    process_local = False  # a server: any process may list it

    @staticmethod
    def server_address(cloud: str) -> tuple[str, int]:
        """(host, port) of the stub cloud server named by the `cloud` URL (loopback only)."""
        return wire.loopback_base_url(cloud)

    def __init__(
        self,
        key: str,
        secret: str | None = None,
        secure: bool = True,
        host: str | None = None,
        port: int | None = None,
        cloud: str = "",
        **kwargs: Any,
    ) -> None:
        url_host, url_port = self.server_address(cloud)
        self._cloud_name = cloud
        # libcloud passes (key, secret, secure, host, port) positionally: the secret
        # must not be None or the arguments shift.
        super(StubNodeDriver, self).__init__(  # type: ignore[no-untyped-call]
            key, secret=secret or "", secure=False, host=url_host, port=url_port, **kwargs
        )

    def _request(
        self,
        path: str,
        *,
        method: str = "GET",
        params: Mapping[str, Any] | None = None,
        body: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        response = self.connection.request(  # type: ignore[no-untyped-call]
            path,
            params=dict(params or {}),
            data=json.dumps(body) if body is not None else None,
            method=method,
        )
        answer = response.object
        return answer if isinstance(answer, dict) else {}

    def list_nodes(self, ex_filters: dict[str, str | list[str]] | None = None) -> list[Node]:
        answer = self._request(wire.INSTANCES, params=ex_filters or {})
        return [to_node(self, wire.vm_from_json(vm)) for vm in answer.get("instances", [])]

    def create_node(
        self,
        name: str,
        size: NodeSize,
        image: NodeImage,
        location: Any = None,
        auth: Any = None,
        ex_userdata: str | None = None,
        ex_metadata: dict[str, str] | None = None,
        ex_spot: bool = False,
        **kwargs: Any,
    ) -> Node:
        answer = self._request(
            wire.INSTANCES,
            method="POST",
            body={
                "name": name,
                "size": size.id,
                "image": image.id,
                "user_data": ex_userdata,
                "tags": dict(ex_metadata or {}),
                "spot": bool(ex_spot),
            },
        )
        return to_node(self, wire.vm_from_json(answer["instance"]))

    def destroy_node(self, node: Node) -> bool:
        self._request(wire.instance_path(str(node.id)), method="DELETE")
        return True

    def ex_create_tags(self, resource: Node, tags: dict[str, str]) -> bool:
        self._request(wire.tags_path(str(resource.id)), method="POST", body={"tags": dict(tags)})
        return True

    def ex_delete_tags(self, resource: Node, tags: dict[str, str]) -> bool:
        self._request(wire.tags_path(str(resource.id)), method="DELETE", params={"key": list(tags)})
        return True

    def list_sizes(self, location: Any = None) -> list[NodeSize]:
        answer = self._request(wire.INSTANCE_TYPES)
        return [
            to_size(self, InstanceType.model_validate(t)) for t in answer.get("instance_types", [])
        ]

    def ex_list_endpoints(self) -> dict[str, int]:
        """Fake address -> loopback SSH port of every VM whose SSH server listens."""
        answer = self._request(wire.ENDPOINTS)
        return {str(k): int(v) for k, v in dict(answer.get("endpoints") or {}).items()}


class RemoteStubResolver:
    """`AddressResolver` for the VMs of a stub cloud server (see the module docstring).

    `resolve` may make one short blocking loopback request on a cache miss (at most
    once per `min_refresh_interval`); hits are answered from memory.
    """

    def __init__(
        self,
        url: str,
        key: str = "",
        secret: str | None = None,
        *,
        ttl: float = 5.0,
        min_refresh_interval: float = 0.1,
        timeout: float = 5.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        wire.loopback_base_url(url)  # refuse non-loopback URLs now, not on first use
        self.url = url
        self._key = key
        self._secret = secret
        self._timeout = timeout
        self._ttl = ttl
        self._min_interval = min_refresh_interval
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._driver: RemoteStubNodeDriver | None = None
        self._ports: dict[str, int] = {}
        self._fetched_at: float | None = None
        self._attempted_at: float | None = None
        self.fetches = 0

    def __repr__(self) -> str:
        return f"RemoteStubResolver({self.url!r})"

    def resolve(self, host: str, port: int) -> Endpoint:
        if is_loopback(host):
            return Endpoint(host, port)
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            address = None
        if address is None or address not in ADDRESS_NETWORK:
            raise ResolutionRefused(
                f"{host} is neither loopback nor a stub cloud VM address ({ADDRESS_NETWORK})"
            )
        with self._lock:
            now = self._monotonic()
            cached = self._ports.get(host)
            age = None if self._fetched_at is None else now - self._fetched_at
            if cached is not None and age is not None and age < self._ttl:
                return Endpoint("127.0.0.1", cached)
            since_attempt = None if self._attempted_at is None else now - self._attempted_at
            if since_attempt is None or since_attempt >= self._min_interval:
                self._attempted_at = now
                try:
                    self._refresh(now)
                except Exception as exc:
                    log.warning(
                        "stub cloud endpoint table unavailable",
                        extra={"stub_cloud_url": self.url, "error_type": type(exc).__name__},
                    )
                    if cached is not None:
                        return Endpoint("127.0.0.1", cached)  # stale beats nothing
                    raise ResolutionRefused(
                        f"{host}: the stub cloud at {self.url} did not answer"
                    ) from None
            found = self._ports.get(host)
        if found is None:
            raise ResolutionRefused(
                f"{host} is not the address of a stub VM with a listening SSH server"
            )
        return Endpoint("127.0.0.1", found)

    def _refresh(self, now: float) -> None:
        if self._driver is None:
            driver = StubNodeDriver(self._key, self._secret, cloud=self.url, timeout=self._timeout)
            assert isinstance(driver, RemoteStubNodeDriver)
            self._driver = driver
        self._ports = self._driver.ex_list_endpoints()
        self._fetched_at = now
        self.fetches += 1
