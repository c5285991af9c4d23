"""CloudConfig, credentials from Secret data, the init script, driver selection, stub extras."""

from __future__ import annotations

import base64
import contextlib
import shutil
import subprocess
from typing import Any

import asyncssh
import pytest
from libcloud.compute.drivers.dummy import DummyNodeDriver
from pydantic import SecretStr, ValidationError

from cloud.cloud_peers import (
    OperatorKey,
    StubCloudFactory,
    create,
    poll_until,
    ssh_run,
    stub_facade,
    wait_for_ssh,
)
from nodewarden.cloud import (
    CloudConfig,
    CloudCredentials,
    CloudCredentialsRef,
    InstanceState,
    build_cloud,
)
from nodewarden.cloud.dialects import dialect_for
from nodewarden.cloud.initscript import (
    INSTANCE_SECRET_PATH,
    new_instance_secret,
    parse_init_script,
    render_init_script,
    secret_digest,
)
from nodewarden.scheduling.instancetypes import InstanceType
from nodewarden.ssh import protocol as ssh_protocol
from nodewarden.ssh.addressing import ResolutionRefused
from nodewarden.ssh.protocol import DEFAULT_POWEROFF_COMMAND
from nodewarden_doubles.stubcloud import StubCloud


def test_config_from_plain_data() -> None:
    config = CloudConfig.model_validate(
        {
            "driver": "ec2",
            "driver_params": {"region": "eu-west-1", "secure": True},
            "credentials": {
                "key_ref": {"name": "cloud", "key": "access-key-id"},
                "secret_ref": {"name": "cloud", "key": "secret-access-key"},
            },
            "image": "ami-0123",
            "instance_types": [
                {
                    "name": "m5.large",
                    "provider_type": "m5.large",
                    "vcpus": 2,
                    "ram": "8Gi",
                    "price": 0.096,
                }
            ],
            "instance_type_policy": {"price_factor": 1.2},
            "backoff": {"quota_block": 30},
        }
    )
    assert config.instance_types[0].ram == 8 * 2**30
    assert config.ops_per_second == 10 and config.max_concurrent_creates == 1  # Arvados
    assert config.backoff.quota_block == 30 and config.backoff.rate_limit_max == 60
    assert config.instance_type_policy.price_factor == 1.2


def test_config_rejects_nonsense() -> None:
    base: dict[str, Any] = {"driver": "ec2", "image": "ami-1"}
    t = {"name": "a", "provider_type": "a", "vcpus": 1, "ram": "1Gi", "price": 1}
    with pytest.raises(ValidationError, match="listed twice"):
        CloudConfig.model_validate({**base, "instance_types": [t, t]})
    with pytest.raises(ValidationError, match="reserved prefix"):
        CloudConfig.model_validate({**base, "default_tags": {"nodewarden-dispatcher": "x"}})
    with pytest.raises(ValidationError):
        CloudConfig.model_validate({**base, "ops_per_second": -1})
    with pytest.raises(ValidationError):
        CloudConfig.model_validate({**base, "unknown_knob": 1})


def test_credentials_from_secret_data() -> None:
    ref = CloudCredentialsRef.model_validate(
        {"key_ref": {"name": "c", "key": "id"}, "secret_ref": {"name": "c", "key": "secret"}}
    )
    data = {
        "c": {
            "id": base64.b64encode(b"AKIAXYZ\n").decode(),
            "secret": base64.b64encode(b"s3cr3t-v").decode(),
        }
    }
    creds = CloudCredentials.from_secret_data(ref, data)
    assert creds.key.get_secret_value() == "AKIAXYZ"
    assert creds.secret is not None and creds.secret.get_secret_value() == "s3cr3t-v"
    assert "s3cr3t-v" not in repr(creds) and "AKIAXYZ" not in str(creds)
    with pytest.raises(KeyError, match="'c' has no key 'secret'") as missing:
        CloudCredentials.from_secret_data(ref, {"c": {"id": data["c"]["id"]}})
    assert "AKIAXYZ" not in str(missing.value)


def test_init_script_round_trip(operator_key: OperatorKey) -> None:
    secret = new_instance_secret()
    script = render_init_script(operator_key.public_line, secret, user="crunch")
    assert secret.get_secret_value() not in repr(script)
    text = script.get_secret_value()
    assert INSTANCE_SECRET_PATH in text and operator_key.public_line in text
    contents = parse_init_script(text)
    assert contents is not None
    assert contents.ssh_public_key == operator_key.public_line
    assert contents.instance_secret.get_secret_value() == secret.get_secret_value()
    assert contents.user == "crunch"
    assert len(secret_digest(secret)) == 64 and secret_digest(secret) != secret.get_secret_value()
    assert ssh_protocol.INSTANCE_SECRET_PATH == INSTANCE_SECRET_PATH  # the prober reads this file
    sh = shutil.which("sh")
    assert sh is not None
    syntax = subprocess.run([sh, "-n"], input=text, text=True, capture_output=True, check=False)
    assert syntax.returncode == 0, syntax.stderr


@pytest.mark.parametrize(
    "key",
    [
        "ssh-ed25519 AAAA' ; rm -rf / ; '",
        "ssh-ed25519 AAAAC3Nz\nNODEWARDEN_SSH_KEY\nrm -rf /",
        "not a key",
        "ssh-ed25519 AAAAC3Nz comment$(reboot)",
    ],
)
def test_init_script_refuses_injection(key: str) -> None:
    with pytest.raises(ValueError):
        render_init_script(key, new_instance_secret())


def test_init_script_refuses_bad_user_and_secret(operator_key: OperatorKey) -> None:
    with pytest.raises(ValueError):
        render_init_script(operator_key.public_line, new_instance_secret(), user="root; reboot")
    with pytest.raises(ValueError):
        render_init_script(operator_key.public_line, SecretStr("short'quote"))


def test_unknown_and_unsupported_drivers() -> None:
    with pytest.raises(ValueError, match="unknown libcloud driver"):
        build_cloud(CloudConfig(driver="no-such-cloud", image="x"), None, "d")
    with pytest.raises(ValueError, match="not supported"):
        dialect_for(DummyNodeDriver("0"))  # type: ignore[no-untyped-call]


def test_stub_cloud_registry(stub_cloud_factory: StubCloudFactory) -> None:
    cloud = stub_cloud_factory()
    assert StubCloud.get(cloud.name) is cloud
    with pytest.raises(ValueError, match="already running"):
        StubCloud(cloud.name).start()
    with pytest.raises(LookupError, match="no stub cloud named 'nope'"):
        StubCloud.get("nope")


async def test_poweroff_from_the_node_stops_the_vm(
    stub_cloud_factory: StubCloudFactory,
    catalogue: list[InstanceType],
    operator_key: OperatorKey,
) -> None:
    cloud = stub_cloud_factory()
    facade = stub_facade(cloud, catalogue)
    vm, _ = await create(facade, "small", operator_key)
    endpoint = await wait_for_ssh(facade, vm)
    worker: Any = cloud.worker(vm.id)
    # The node may drop the connection before its answer arrives: only the request counts.
    with contextlib.suppress(OSError, asyncssh.Error):
        await ssh_run(
            endpoint, operator_key.private, worker.host_public_key, DEFAULT_POWEROFF_COMMAND
        )

    async def stopped() -> bool | None:
        (listed,) = await facade.list_instances()
        return True if listed.state is InstanceState.STOPPED else None

    await poll_until(stopped, timeout=10)
    with pytest.raises(ResolutionRefused):
        facade.ssh_endpoint(vm)
