"""EC2 contract: libcloud's EC2 driver, and the nodewarden facade over it, against moto.

moto runs on 127.0.0.1 (see conftest.moto_ec2 and its response filter). The addresses
moto invents for instances are never connected to: the facade is given a loopback-only
resolver and the test checks it refuses them.
"""

from __future__ import annotations

import base64
import uuid
from typing import Any

import boto3  # type: ignore[import-untyped]
import pytest
from libcloud.common.exceptions import BaseHTTPError
from libcloud.compute.base import NodeDriver, NodeImage, NodeSize
from libcloud.compute.providers import get_driver
from pydantic import SecretStr

from cloud.cloud_peers import MotoEndpoint, OperatorKey
from nodewarden.cloud import (
    CloudConfig,
    CloudCredentials,
    CloudFacade,
    InstanceState,
    build_cloud,
)
from nodewarden.cloud.dialects import Ec2Dialect
from nodewarden.cloud.initscript import parse_init_script, secret_digest
from nodewarden.scheduling.instancetypes import InstanceType
from nodewarden.ssh.addressing import LoopbackOnlyResolver, ResolutionRefused

IMAGE = "ami-12c6146b"
KEY_ID = "AKIAMOTOTESTKEY00001"
SECRET_KEY = "moto-secret-access-key-0123456789abcdef"


def ec2_driver(moto: MotoEndpoint) -> Any:
    cls = get_driver("ec2")
    driver: Any = cls(
        KEY_ID,
        SECRET_KEY,
        region="us-east-1",
        host=moto.host,
        port=moto.port,
        secure=False,
        signature_version="4",
    )
    return driver


def size(driver: NodeDriver, provider_type: str = "m5.large") -> NodeSize:
    return NodeSize(provider_type, provider_type, 8192, 32, None, 0.096, driver)


def boto(moto: MotoEndpoint) -> Any:
    return boto3.client(
        "ec2",
        endpoint_url=f"http://{moto.host}:{moto.port}",
        region_name="us-east-1",
        aws_access_key_id=KEY_ID,
        aws_secret_access_key=SECRET_KEY,
    )


def test_raw_libcloud_round_trip(moto_ec2: MotoEndpoint) -> None:
    driver = ec2_driver(moto_ec2)
    owner = f"d-{uuid.uuid4().hex[:8]}"
    node = driver.create_node(
        name="raw-1",
        size=size(driver),
        image=NodeImage(IMAGE, IMAGE, driver),
        ex_metadata={"nodewarden-dispatcher": owner, "nodewarden-instance-type": "medium"},
        ex_userdata="#!/bin/sh\ntrue\n",
    )
    assert node.extra["tags"]["nodewarden-dispatcher"] == owner

    listed = driver.list_nodes(ex_filters={"tag:nodewarden-dispatcher": owner})
    assert [n.id for n in listed] == [node.id]
    assert listed[0].extra["tags"]["Name"] == "raw-1"
    assert driver.list_nodes(ex_filters={"tag:nodewarden-dispatcher": owner + "-other"}) == []

    # libcloud's own ex_create_tags numbers parameters from 0 (ResourceId.0): moto says 400.
    with pytest.raises(BaseHTTPError):
        driver.ex_create_tags(node, {"x": "y"})
    # The facade's EC2 dialect numbers from 1, as the EC2 API documents: accepted.
    Ec2Dialect().set_tags(
        driver, node.id, {"nodewarden-node": "wn-1"}, remove=["nodewarden-instance-type"]
    )
    tags = driver.list_nodes(ex_filters={"tag:nodewarden-dispatcher": owner})[0].extra["tags"]
    assert tags == {"Name": "raw-1", "nodewarden-dispatcher": owner, "nodewarden-node": "wn-1"}

    assert driver.destroy_node(node) is True
    states = {n.id: n.state for n in driver.list_nodes(ex_filters={"instance-id": node.id})}
    assert states[node.id] in ("terminated", "shutting-down")


def ec2_config(moto: MotoEndpoint, catalogue: list[InstanceType]) -> CloudConfig:
    return CloudConfig(
        driver="ec2",
        driver_params={
            "region": "us-east-1",
            "host": moto.host,
            "port": moto.port,
            "secure": False,
            "signature_version": "4",
        },
        image=IMAGE,
        ops_per_second=0,
        max_concurrent_creates=2,
        instance_types=catalogue,
    )


@pytest.fixture
def facade(moto_ec2: MotoEndpoint, catalogue: list[InstanceType]) -> CloudFacade:
    return build_cloud(
        ec2_config(moto_ec2, catalogue),
        CloudCredentials(key=SecretStr(KEY_ID), secret=SecretStr(SECRET_KEY)),
        f"disp-{uuid.uuid4().hex[:8]}",
        resolver=LoopbackOnlyResolver(),
    )


async def test_facade_against_moto(
    facade: CloudFacade, moto_ec2: MotoEndpoint, operator_key: OperatorKey
) -> None:
    keys = facade.tag_keys
    medium = facade.instance_type("medium")
    assert medium is not None
    request, secret = facade.create_request(
        name="wn-ec2-1",
        instance_type=medium,
        ssh_public_key=operator_key.public_line,
        tags={keys.node: "wn-ec2-1"},
    )
    created = await facade.create(request)
    try:
        assert created.id.startswith("i-")
        assert created.instance_type == "medium"
        assert created.provider_type == "m5.large"
        assert created.price == pytest.approx(0.096)
        assert created.state in (InstanceState.PENDING, InstanceState.RUNNING)
        assert created.source == "cloud:ec2"
        assert created.tags[keys.dispatcher] == facade.dispatcher_id
        assert created.tags[keys.secret_digest] == secret_digest(secret)

        # The user data reached EC2 intact: it carries our key and the instance secret.
        attr = boto(moto_ec2).describe_instance_attribute(
            InstanceId=created.id, Attribute="userData"
        )
        user_data = base64.b64decode(attr["UserData"]["Value"]).decode()
        contents = parse_init_script(user_data)
        assert contents is not None
        assert contents.ssh_public_key == operator_key.public_line
        assert contents.instance_secret.get_secret_value() == secret.get_secret_value()

        # Listing is filtered by our dispatcher tag: an instance of another dispatcher
        # (created directly) is not listed.
        driver = ec2_driver(moto_ec2)
        foreign = driver.create_node(
            name="foreign",
            size=size(driver),
            image=NodeImage(IMAGE, IMAGE, driver),
            ex_metadata={keys.dispatcher: "someone-else"},
        )
        listed = await facade.list_instances()
        assert [i.id for i in listed] == [created.id]
        # ... but is among the managed instances (dispatcher tag with any value: "tag-key").
        managed = {i.id for i in await facade.list_managed_instances()}
        assert {created.id, foreign.id} <= managed
        view = listed[0]
        assert view.created_at is not None and view.created_at.tzinfo is not None
        assert view.private_ips and view.observed_at >= created.observed_at

        # Never connect to the addresses moto invents.
        with pytest.raises(ResolutionRefused):
            facade.ssh_endpoint(view)

        # Replace our tags: ours not given are removed, Name and the dispatcher stay.
        await facade.set_tags(
            view, {keys.node: "wn-renamed", keys.last_probe: "2026-11-30T12:00:00Z"}
        )
        (after,) = await facade.list_instances()
        assert after.tags == {
            "Name": "wn-ec2-1",
            keys.dispatcher: facade.dispatcher_id,
            keys.node: "wn-renamed",
            keys.last_probe: "2026-11-30T12:00:00Z",
        }
        driver.destroy_node(foreign)
    finally:
        await facade.destroy(created)
    assert await facade.list_instances() == []
    # Destroying an instance that does not exist (InvalidInstanceID.NotFound) counts as done.
    await facade.destroy(created.model_copy(update={"id": "i-0123456789abcdef0"}))
    await facade.close()
