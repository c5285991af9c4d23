"""`StubNodeDriver`: the libcloud `NodeDriver` of the stub cloud (provider "nodewarden-stub").

It speaks the EC2-shaped subset the cloud adapter uses (`list_nodes(ex_filters=)`,
`create_node(ex_userdata=, ex_metadata=, ex_spot=)`, `ex_create_tags`, `ex_delete_tags`,
`destroy_node`). The `cloud` driver parameter says where the stub cloud is:

    get_driver("nodewarden-stub")(key, secret, cloud="default")
        in-process: every call goes to the running `StubCloud` named "default", which
        checks the credentials on every call like a real API;
    get_driver("nodewarden-stub")(key, secret, cloud="http://127.0.0.1:PORT")
        a stub cloud server (`nodewarden_doubles.stubcloud.server`) over loopback HTTP: the
        constructor returns a `nodewarden_doubles.stubcloud.remote.RemoteStubNodeDriver`.
"""

from __future__ import annotations

import builtins
from typing import Any

from libcloud.common.base import Connection, ConnectionKey
from libcloud.compute.base import Node, NodeDriver, NodeImage, NodeSize
from libcloud.compute.types import NodeState

from nodewarden.scheduling.instancetypes import InstanceType
from nodewarden_doubles.stubcloud.cloud import StubCloud, StubVMView
from nodewarden_doubles.stubcloud.wire import is_stub_url

STUB_PROVIDER = "nodewarden-stub"

_STATES = {
    "pending": NodeState.PENDING,
    "running": NodeState.RUNNING,
    "stopping": NodeState.STOPPING,
    "stopped": NodeState.STOPPED,
    "terminated": NodeState.TERMINATED,
}


class StubConnection(ConnectionKey):
    """No network: the stub cloud is in-process."""

    def connect(
        self, host: Any = None, port: Any = None, base_url: Any = None, **kwargs: Any
    ) -> Any:
        return None


class StubNodeDriver(NodeDriver):
    """libcloud driver of the nodewarden stub cloud (in-process; a URL `cloud` goes remote)."""

    name = "nodewarden stub cloud"
    website = "https://nodewarden.io/stub"
    type = STUB_PROVIDER
    connectionCls: builtins.type[Connection] = StubConnection
    features: dict[str, list[str]] = {"create_node": []}
    process_local = True
    """Its instances live in this process: no worker process can list them
    (nodewarden/cloud/listproc.py)."""

    def __new__(cls, *args: Any, cloud: str = "default", **kwargs: Any) -> StubNodeDriver:
        if cls is StubNodeDriver and is_stub_url(cloud):
            from nodewarden_doubles.stubcloud.remote import RemoteStubNodeDriver

            remote: StubNodeDriver = super().__new__(RemoteStubNodeDriver)
            return remote
        driver: StubNodeDriver = super().__new__(cls)
        return driver

    def __init__(
        self,
        key: str,
        secret: str | None = None,
        secure: bool = True,
        host: str | None = None,
        port: int | None = None,
        cloud: str = "default",
        **kwargs: Any,
    ) -> None:
        super().__init__(  # type: ignore[no-untyped-call]
            key, secret=secret, secure=secure, host=host, port=port, **kwargs
        )
        self._cloud_name = cloud

    @property
    def _cloud(self) -> StubCloud:
        cloud = StubCloud.get(self._cloud_name)
        cloud.check_credentials(self.key, self.secret)
        return cloud

    def list_nodes(self, ex_filters: dict[str, str | list[str]] | None = None) -> list[Node]:
        return [self._to_node(vm) for vm in self._cloud.api_list(ex_filters)]

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
        view = self._cloud.api_create(
            name=name,
            size=size.id,
            image=image.id,
            user_data=ex_userdata,
            tags=ex_metadata or {},
            spot=ex_spot,
        )
        return self._to_node(view)

    def destroy_node(self, node: Node) -> bool:
        self._cloud.api_destroy(str(node.id))
        return True

    def ex_create_tags(self, resource: Node, tags: dict[str, str]) -> bool:
        self._cloud.api_create_tags(str(resource.id), tags)
        return True

    def ex_delete_tags(self, resource: Node, tags: dict[str, str]) -> bool:
        self._cloud.api_delete_tags(str(resource.id), list(tags))
        return True

    def list_sizes(self, location: Any = None) -> list[NodeSize]:
        return [to_size(self, t) for t in self._cloud.catalogue()]

    def list_images(self, location: Any = None, ex_owner: Any = None) -> list[NodeImage]:
        return [NodeImage(id="stub-image", name="stub-image", driver=self)]

    def _to_node(self, vm: StubVMView) -> Node:
        return to_node(self, vm)


def to_node(driver: NodeDriver, vm: StubVMView) -> Node:
    """A libcloud `Node` as the stub drivers report it."""
    return Node(
        id=vm.id,
        name=vm.name,
        state=_STATES.get(vm.state, NodeState.UNKNOWN),
        public_ips=[],
        private_ips=[vm.private_ip],
        driver=driver,
        created_at=vm.created_at,
        extra={
            "tags": dict(vm.tags),
            "instance_type": vm.size,
            "image_id": vm.image,
            "price": vm.price,
        },
    )


def to_size(driver: NodeDriver, itype: InstanceType) -> NodeSize:
    """A libcloud `NodeSize` for one catalogue entry."""
    return NodeSize(
        id=itype.provider_type,
        name=itype.name,
        ram=itype.ram // 2**20,
        disk=itype.scratch // 2**30,
        bandwidth=None,
        price=itype.price,
        driver=driver,
        extra={"vcpus": itype.vcpus, "gpus": itype.gpus},
    )
