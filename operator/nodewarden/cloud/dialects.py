"""Per-driver dialects: how the four cloud operations map onto one libcloud driver's calls.

libcloud's `NodeDriver` standardises create/list/destroy but not tags, user data or
server-side filters, so each supported driver gets a small dialect (synchronous; called
from the adapter's worker threads):

- `Ec2Dialect` -- libcloud's EC2 driver. `create_node(ex_userdata=, ex_metadata=tags,
  ex_spot=)`, `list_nodes(ex_filters={"tag:K": V, "tag-key": [K2]})`, `destroy_node`. Tags are
  replaced with raw `CreateTags` / `DeleteTags` requests numbered from 1 (`ResourceId.1`,
  `Tag.1.Key`) as the EC2 API documents: libcloud's own `ex_create_tags` numbers from 0
  (`ResourceId.0`), which moto rejects with 400.
- `ExTagsDialect` -- drivers with the EC2-shaped `ex_create_tags` / `ex_delete_tags` and
  `ex_filters` (the nodewarden stub cloud).

`dialect_for(driver)` picks one; other drivers are refused with a clear message.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, Protocol

from libcloud.compute.base import Node, NodeDriver, NodeImage, NodeSize
from libcloud.compute.types import NodeState

from nodewarden.cloud.model import CreateRequest


class DriverDialect(Protocol):
    """Synchronous driver calls for one kind of libcloud driver."""

    name: str

    def list_nodes(self, driver: NodeDriver, filter_tags: Mapping[str, str | None]) -> list[Node]:
        """Nodes carrying every tag in `filter_tags` (value None = the key with any value)."""
        ...

    def create_node(
        self, driver: NodeDriver, request: CreateRequest, image: str, tags: Mapping[str, str]
    ) -> Node: ...

    def set_tags(
        self,
        driver: NodeDriver,
        instance_id: str,
        tags: Mapping[str, str],
        remove: Collection[str],
    ) -> None: ...

    def destroy_node(self, driver: NodeDriver, instance_id: str) -> None: ...

    def node_tags(self, node: Node) -> dict[str, str]: ...

    def node_provider_type(self, node: Node) -> str | None: ...


class ExTagsDialect:
    """Drivers with EC2-shaped `ex_filters`, `ex_userdata`, `ex_metadata`, `ex_*_tags`."""

    name = "ex-tags"

    def list_nodes(self, driver: NodeDriver, filter_tags: Mapping[str, str | None]) -> list[Node]:
        filters: dict[str, str | list[str]] = {
            f"tag:{key}": value for key, value in filter_tags.items() if value is not None
        }
        any_value = [key for key, value in filter_tags.items() if value is None]
        if any_value:
            filters["tag-key"] = any_value
        nodes: list[Node] = driver.list_nodes(ex_filters=filters or None)
        return nodes

    def create_node(
        self, driver: NodeDriver, request: CreateRequest, image: str, tags: Mapping[str, str]
    ) -> Node:
        itype = request.instance_type
        size = NodeSize(
            id=itype.provider_type,
            name=itype.provider_type,
            ram=itype.ram // 2**20,
            disk=itype.scratch // 2**30,
            bandwidth=None,
            price=itype.price,
            driver=driver,
        )
        kwargs: dict[str, Any] = {
            "name": request.name,
            "size": size,
            "image": NodeImage(id=image, name=image, driver=driver),
            "ex_metadata": dict(tags),
        }
        user_data = request.user_data.get_secret_value()
        if user_data:
            kwargs["ex_userdata"] = user_data
        if itype.preemptible:
            kwargs["ex_spot"] = True
        node: Node = driver.create_node(**kwargs)
        return node

    def set_tags(
        self,
        driver: NodeDriver,
        instance_id: str,
        tags: Mapping[str, str],
        remove: Collection[str],
    ) -> None:
        node = _bare_node(driver, instance_id)
        tagging: Any = driver  # ex_*_tags are driver extensions, not on NodeDriver
        if tags:
            tagging.ex_create_tags(node, dict(tags))
        if remove:
            tagging.ex_delete_tags(node, {key: "" for key in remove})

    def destroy_node(self, driver: NodeDriver, instance_id: str) -> None:
        driver.destroy_node(_bare_node(driver, instance_id))

    def node_tags(self, node: Node) -> dict[str, str]:
        tags = node.extra.get("tags") or {}
        return {str(k): str(v) for k, v in tags.items()}

    def node_provider_type(self, node: Node) -> str | None:
        value = node.extra.get("instance_type")
        if value is None and node.size is not None:
            value = node.size.id
        return str(value) if value is not None else None


class Ec2Dialect(ExTagsDialect):
    """libcloud's EC2 driver; tags replaced with 1-based CreateTags / DeleteTags requests."""

    name = "ec2"

    def set_tags(
        self,
        driver: NodeDriver,
        instance_id: str,
        tags: Mapping[str, str],
        remove: Collection[str],
    ) -> None:
        ec2: Any = driver
        if tags:
            params = {"Action": "CreateTags", "ResourceId.1": instance_id}
            for index, (key, value) in enumerate(tags.items(), start=1):
                params[f"Tag.{index}.Key"] = key
                params[f"Tag.{index}.Value"] = value
            ec2.connection.request(ec2.path, params=params)
        if remove:
            params = {"Action": "DeleteTags", "ResourceId.1": instance_id}
            for index, key in enumerate(remove, start=1):
                params[f"Tag.{index}.Key"] = key
            ec2.connection.request(ec2.path, params=params)


def _bare_node(driver: NodeDriver, instance_id: str) -> Node:
    return Node(
        id=instance_id,
        name=instance_id,
        state=NodeState.UNKNOWN,
        public_ips=[],
        private_ips=[],
        driver=driver,
    )


def dialect_for(driver: NodeDriver) -> DriverDialect:
    """The dialect for a driver instance; ValueError naming the driver when unsupported."""
    from libcloud.compute.drivers.ec2 import BaseEC2NodeDriver

    if isinstance(driver, BaseEC2NodeDriver):
        return Ec2Dialect()
    if hasattr(driver, "ex_create_tags") and hasattr(driver, "ex_delete_tags"):
        return ExTagsDialect()
    raise ValueError(
        f"libcloud driver {type(driver).__name__} is not supported by nodewarden yet "
        "(supported: EC2 and the nodewarden stub cloud)"
    )
