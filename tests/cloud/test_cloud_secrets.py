"""No secret ever reaches a log line, an error, a repr or a status view of the cloud adapter.

One run with real secrets configured -- cloud credentials (stub cloud checking them, and
the EC2 driver signing requests to moto), the per-instance secret and the SSH private
key used to log in to a stub VM -- captures every log record of every logger at DEBUG
(nodewarden, libcloud, asyncssh at debug level 2, moto/werkzeug) and asserts that none
of the secret values appears anywhere in them, nor in the errors, reprs and dumps the
adapter hands out.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import asyncssh
import pytest
from pydantic import SecretStr

from cloud.cloud_peers import (
    MotoEndpoint,
    OperatorKey,
    StubCloudFactory,
    create,
    ssh_run,
    stub_facade,
    wait_for_ssh,
)
from nodewarden.cloud import (
    CloudAuthError,
    CloudConfig,
    CloudCredentials,
    CloudCredentialsRef,
    TransientCloudError,
    build_cloud,
)
from nodewarden.scheduling.instancetypes import InstanceType
from nodewarden.ssh.addressing import LoopbackOnlyResolver
from nodewarden.ssh.protocol import DEFAULT_INSTANCE_SECRET_COMMAND
from nodewarden_doubles.stubcloud import StubFaults

CLOUD_KEY = "AKIASECRETKEYID77777"
CLOUD_SECRET = "cloud-secret-9f8e7d6c5b4a39281706"
WRONG_SECRET = "wrong-cloud-secret-0a1b2c3d4e5f6a7b"


@pytest.fixture
def debug_everything() -> Iterator[None]:
    previous = logging.getLogger("asyncssh").level
    asyncssh.set_debug_level(2)
    yield
    asyncssh.set_debug_level(1)
    logging.getLogger("asyncssh").setLevel(previous)


def secret_fragments(values: list[str]) -> list[str]:
    """Each secret, and each long line of multi-line secrets (PEM bodies)."""
    out = []
    for value in values:
        out.append(value)
        out.extend(line for line in value.splitlines() if len(line) >= 16 and "-----" not in line)
    return out


async def test_no_secret_in_logs_errors_or_reprs(
    stub_cloud_factory: StubCloudFactory,
    catalogue: list[InstanceType],
    operator_key: OperatorKey,
    moto_ec2: MotoEndpoint,
    caplog: pytest.LogCaptureFixture,
    debug_everything: None,
) -> None:
    caplog.set_level(logging.DEBUG)
    log = logging.getLogger("test.operator")
    creds = CloudCredentials(key=SecretStr(CLOUD_KEY), secret=SecretStr(CLOUD_SECRET))
    exposed: list[str] = []  # everything the adapter handed out that a caller could print

    # -- the stub cloud checks the credentials on every call --------------------------------
    cloud = stub_cloud_factory(
        StubFaults(destroy_error_rate=1.0), credentials=(CLOUD_KEY, CLOUD_SECRET)
    )
    facade = stub_facade(cloud, catalogue, credentials=creds)
    vm, instance_secret = await create(facade, "small", operator_key, name="wn-secret")
    endpoint = await wait_for_ssh(facade, vm)
    worker = cloud.worker(vm.id)
    proof = await ssh_run(
        endpoint,
        operator_key.private,
        worker.host_public_key,  # type: ignore[union-attr]
        DEFAULT_INSTANCE_SECRET_COMMAND,
    )
    assert str(proof.stdout).strip() == instance_secret.get_secret_value()  # it was used
    listed = await facade.list_instances()
    with pytest.raises(TransientCloudError) as destroy_error:
        await facade.destroy(vm)
    log.warning("destroy failed: %s", destroy_error.value, exc_info=destroy_error.value)

    wrong = CloudCredentials(key=SecretStr(CLOUD_KEY), secret=SecretStr(WRONG_SECRET))
    with pytest.raises(CloudAuthError) as auth_error:
        await stub_facade(cloud, catalogue, credentials=wrong).list_instances()
    log.error("cloud refused us: %s", auth_error.value, exc_info=auth_error.value)

    itype = facade.instance_type("small")
    assert itype is not None
    request, secret2 = facade.create_request(
        name="wn-x", instance_type=itype, ssh_public_key=operator_key.public_line
    )
    exposed += [
        repr(facade.config),
        repr(creds),
        str(creds),
        repr(request),
        str(request),
        request.model_dump_json(),
        json.dumps(facade.backoff.snapshot(vm.observed_at)),
        *(i.model_dump_json() for i in listed),
        str(destroy_error.value),
        repr(destroy_error.value),
        str(auth_error.value),
        repr(auth_error.value),
        repr(instance_secret),
        str(instance_secret),
    ]
    log.info("created %r", request)  # a careless caller logging the request
    log.info("credentials %s", creds)

    # -- libcloud's EC2 driver signing requests to moto --------------------------------------
    ec2 = build_cloud(
        CloudConfig(
            driver="ec2",
            driver_params={
                "region": "us-east-1",
                "host": moto_ec2.host,
                "port": moto_ec2.port,
                "secure": False,
                "signature_version": "4",
            },
            credentials=CloudCredentialsRef.model_validate(
                {
                    "key_ref": {"name": "cloud", "key": "id"},
                    "secret_ref": {"name": "cloud", "key": "secret"},
                }
            ),
            image="ami-12c6146b",
            ops_per_second=0,
            instance_types=catalogue,
        ),
        creds,
        "disp-secrets",
        resolver=LoopbackOnlyResolver(),
    )
    ec2_request, ec2_secret = ec2.create_request(
        name="wn-ec2", instance_type=itype, ssh_public_key=operator_key.public_line
    )
    ec2_vm = await ec2.create(ec2_request)
    exposed.append(ec2_vm.model_dump_json())
    await ec2.destroy(ec2_vm)
    await ec2.close()

    secrets = secret_fragments(
        [
            CLOUD_KEY,
            CLOUD_SECRET,
            WRONG_SECRET,
            instance_secret.get_secret_value(),
            secret2.get_secret_value(),
            ec2_secret.get_secret_value(),
            operator_key.private_pem,
        ]
    )
    assert len(caplog.records) > 20  # the capture really saw the run
    assert any(r.name.startswith("asyncssh") for r in caplog.records)
    assert any(r.name.startswith("nodewarden.cloud") for r in caplog.records)
    texts = [caplog.text]
    for record in caplog.records:
        texts.append(record.getMessage())
        texts.append(repr(record.__dict__))
    haystack = "\n".join(texts + exposed)
    for secret in secrets:
        assert secret not in haystack, "a secret value leaked"
