"""The stub cloud as its own process: the facade over loopback HTTP against a real server.

Real peers: a stub cloud server subprocess (`python -m nodewarden_doubles.stubcloud.server`,
started by `StubCloudProcess`), reached through the libcloud driver's remote mode
(`cloud="http://127.0.0.1:PORT"`, libcloud's own Connection/Response machinery), and
behind each VM a real asyncssh server reached through the remote address resolver.
Errors are compared one by one with the in-process stub's, so both modes classify
identically.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import requests
from pydantic import SecretStr

from cloud.cloud_peers import (
    SERVER_CREDENTIALS,
    MutableClock,
    OperatorKey,
    StubCloudFactory,
    create,
    poll_until,
    remote_facade,
    ssh_run,
    stub_facade,
    wait_for_ssh,
)
from nodewarden.cloud import (
    CloudAuthError,
    CloudCredentials,
    CloudError,
    CloudFacade,
    CloudInstance,
    InstanceState,
    RateLimited,
)
from nodewarden.scheduling.instancetypes import InstanceType
from nodewarden.ssh import InstanceSecretTrust, SshClientKey, SshProber, SshTarget
from nodewarden.ssh.addressing import ResolutionRefused
from nodewarden.ssh.protocol import DEFAULT_INSTANCE_SECRET_COMMAND, DEFAULT_READY_COMMAND
from nodewarden_doubles.stubcloud import (
    RemoteStubResolver,
    StubFaults,
    StubNodeDriver,
    StubServerConfig,
    wire,
)
from nodewarden_doubles.stubcloud.process import StubCloudProcess, StubCloudProcessError
from nodewarden_doubles.stubcloud.server import parse_listen

CREDS = CloudCredentials(
    key=SecretStr(SERVER_CREDENTIALS[0]), secret=SecretStr(SERVER_CREDENTIALS[1])
)
WRONG = CloudCredentials(
    key=SecretStr(SERVER_CREDENTIALS[0]), secret=SecretStr("wrong-secret-0a1b2c3d4e5f")
)


def _client_key(key: OperatorKey) -> SshClientKey:
    return SshClientKey(SecretStr(key.private_pem))


def _process_gone(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return any(line.startswith("State:") and "Z" in line.split()[1] for line in status.splitlines())


async def _refused(port: int) -> bool | None:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return True
    writer.close()
    return None


# ---- lifecycle and SSH ------------------------------------------------------------------


async def test_lifecycle_and_ssh_through_the_remote_resolver(
    stub_server: StubCloudProcess, operator_key: OperatorKey
) -> None:
    facade = remote_facade(stub_server, dispatcher="disp-life")
    assert isinstance(facade.resolver, RemoteStubResolver)
    client_key = _client_key(operator_key)
    vm, secret = await create(facade, "medium", operator_key, name="wn-life")
    assert vm.instance_type == "medium" and vm.provider_type == "m5.large"
    assert vm.price == pytest.approx(0.096)
    assert vm.source == "cloud:ex-tags"
    address = vm.address()
    assert address is not None and address.startswith("198.18.")

    await wait_for_ssh(facade, vm)
    learned: list[Any] = []

    async def record(key: Any) -> None:
        learned.append(key)

    prober = SshProber(resolver=facade.resolver, on_host_key_learned=record)
    target = SshTarget(
        node="wn-life",
        host=address,
        client_key=client_key,
        trust=InstanceSecretTrust(secret),
    )
    try:
        ready = await prober.check_ready(target)
    finally:
        await prober.aclose()
    assert ready.ready
    admin_view = stub_server.admin.vm(vm.id)
    assert admin_view is not None and admin_view.host_public_key is not None
    assert [k.public_key for k in learned] == [admin_view.host_public_key]
    assert admin_view.worker is not None and admin_view.worker["auth_attempts"] >= 1

    (listed,) = await facade.list_instances()
    assert listed.id == vm.id and listed.state is InstanceState.RUNNING
    assert listed.created_at == vm.created_at
    await facade.set_tags(listed, {facade.tag_keys.node: "wn-life", "team": "a b&c=d"})
    (tagged,) = await facade.list_instances()
    assert tagged.tags[facade.tag_keys.node] == "wn-life"
    assert tagged.tags["team"] == "a b&c=d"  # query encoding survives the signature
    assert tagged.tags[facade.tag_keys.dispatcher] == "disp-life"
    assert facade.tag_keys.instance_type not in tagged.tags

    port = admin_view.port
    assert port is not None
    await facade.destroy(tagged)
    assert await facade.list_instances() == []
    assert stub_server.admin.vm(vm.id) is None
    await poll_until(lambda: _refused(port), timeout=10)
    await facade.close()


async def test_driver_catalogue_and_non_loopback_refusals(
    stub_server: StubCloudProcess, catalogue: list[InstanceType]
) -> None:
    driver = StubNodeDriver(*SERVER_CREDENTIALS, cloud=stub_server.url)
    assert type(driver).__name__ == "RemoteStubNodeDriver"
    assert {s.id for s in driver.list_sizes()} == {t.provider_type for t in catalogue}

    for url in ("http://10.1.2.3:8080", "https://127.0.0.1:1", "http://example.com:80"):
        with pytest.raises(ValueError, match="stub cloud URL"):
            StubNodeDriver("k", "s", cloud=url)
    resolver = RemoteStubResolver(stub_server.url, *SERVER_CREDENTIALS)
    for host in ("10.0.0.5", "192.168.1.1", "example.com", "8.8.8.8"):
        with pytest.raises(ResolutionRefused):
            resolver.resolve(host, 22)
    assert resolver.fetches == 0  # refused without asking anyone
    assert resolver.resolve("127.0.0.1", 2222).port == 2222
    with pytest.raises(ValueError):
        parse_listen("0.0.0.0:0")
    with pytest.raises(ValueError):
        parse_listen("10.0.0.1:8080")
    assert parse_listen("127.0.0.1:0") == ("127.0.0.1", 0)


# ---- errors classified like the in-process stub -----------------------------------------


Scenario = Callable[[CloudFacade, OperatorKey], Awaitable[object]]


async def _create(type_name: str, facade: CloudFacade, key: OperatorKey) -> object:
    return await create(facade, type_name, key)


async def _create_unknown_type(facade: CloudFacade, key: OperatorKey) -> object:
    itype = InstanceType(name="huge", provider_type="x9.huge", vcpus=96, ram="768Gi", price=9)
    request, _ = facade.create_request(
        name="wn-x", instance_type=itype, ssh_public_key=key.public_line
    )
    return await facade.create(request)


async def _tag_missing(facade: CloudFacade, key: OperatorKey) -> object:
    ghost = CloudInstance(
        id="i-doesnotexist",
        name="ghost",
        instance_type=None,
        provider_type=None,
        state=InstanceState.RUNNING,
        price=None,
        created_at=None,
        observed_at=datetime.now(tz=UTC),
        source="test",
    )
    await facade.set_tags(ghost, {facade.tag_keys.node: "x"})
    return None


async def _list(facade: CloudFacade, key: OperatorKey) -> object:
    return await facade.list_instances()


SCENARIOS: dict[str, tuple[dict[str, Any], tuple[int, float | None] | None, Scenario, bool]] = {
    # name: (faults, forced rate limit (calls, retry_after), call, use wrong credentials)
    "quota": ({"instance_quota": 0}, None, lambda f, k: _create("small", f, k), False),
    "capacity": ({"type_capacity": {"m5.large": 0}}, None, lambda f, k: _create("medium", f, k), False),
    "vcpu-group": ({"vcpu_quota": {"standard": 0}}, None, lambda f, k: _create("small", f, k), False),
    "transient": ({"create_error_rate": 1.0}, None, lambda f, k: _create("small", f, k), False),
    "permanent": ({}, None, _create_unknown_type, False),
    "not-found": ({}, None, _tag_missing, False),
    "rate-503-retry-after": ({}, (1, 5.0), _list, False),
    "rate-429-retry-after": ({"rate_limit_style": "http-429"}, (1, 7.0), _list, False),
    "rate-503-no-retry-after": ({}, (1, None), _list, False),
    "wrong-credentials": ({}, None, _list, True),
}  # fmt: skip


def _outcome(err: CloudError, clock: MutableClock) -> dict[str, Any]:
    return {
        "type": type(err).__name__,
        "kind": err.kind,
        "provider_code": err.provider_code,
        "http_status": err.http_status,
        "message": err.message,
        "retry_after": (err.retry_at - clock.now).total_seconds() if err.retry_at else None,
        "instance_type": err.instance_type,
        "quota_group": err.quota_group,
        "locally_throttled": err.locally_throttled,
    }


@pytest.mark.parametrize("name", list(SCENARIOS))
async def test_errors_classify_exactly_as_in_process(
    name: str,
    stub_server: StubCloudProcess,
    stub_cloud_factory: StubCloudFactory,
    catalogue: list[InstanceType],
    operator_key: OperatorKey,
) -> None:
    faults, rate_limit, call, wrong = SCENARIOS[name]
    outcomes = []
    for mode in ("in-process", "server"):
        clock = MutableClock()
        creds = WRONG if wrong else CREDS
        if mode == "in-process":
            cloud = stub_cloud_factory(StubFaults(**faults), credentials=SERVER_CREDENTIALS)
            if rate_limit is not None:
                cloud.force_rate_limit(*rate_limit)
            facade = stub_facade(cloud, catalogue, credentials=creds, clock=clock)
        else:
            stub_server.admin.set_faults(**faults)
            if rate_limit is not None:
                stub_server.admin.force_rate_limit(*rate_limit)
            facade = remote_facade(
                stub_server, dispatcher=f"disp-{name}", credentials=creds, clock=clock
            )
        with pytest.raises(CloudError) as info:
            await call(facade, operator_key)
        outcomes.append(_outcome(info.value, clock))
        await facade.close()
    in_process, server = outcomes
    assert server == in_process
    expected_kind = {
        "quota": "quota",
        "capacity": "capacity",
        "vcpu-group": "quota-group",
        "transient": "transient",
        "permanent": "permanent",
        "not-found": "not-found",
        "wrong-credentials": "auth",
    }.get(name, "rate-limit")
    assert server["kind"] == expected_kind
    if name == "rate-503-retry-after":
        assert server["http_status"] == 503 and server["retry_after"] == 5.0
        assert server["provider_code"] == "RequestLimitExceeded"
    if name == "rate-429-retry-after":
        assert server["http_status"] == 429 and server["retry_after"] == 7.0


async def test_rate_limit_backs_off_locally_until_retry_after(
    stub_server: StubCloudProcess,
) -> None:
    clock = MutableClock()
    facade = remote_facade(stub_server, dispatcher="disp-rl", clock=clock)
    stub_server.admin.force_rate_limit(1, retry_after=5)
    calls = stub_server.admin.stats()["api_calls"].get("list", 0)
    with pytest.raises(RateLimited) as first:
        await facade.list_instances()
    assert not first.value.locally_throttled
    clock.advance(2)
    with pytest.raises(RateLimited) as again:
        await facade.list_instances()
    assert again.value.locally_throttled
    assert stub_server.admin.stats()["api_calls"]["list"] == calls + 1  # not asked again
    clock.advance(4)
    assert await facade.list_instances() == []
    await facade.close()


def test_requests_must_be_signed_with_the_right_secret(stub_server: StubCloudProcess) -> None:
    url = stub_server.url + wire.INSTANCES
    key, secret = SERVER_CREDENTIALS
    query = [("tag-key", "nodewarden-dispatcher")]

    def auth(secret_used: str, *, ts: int | None = None, path: str = wire.INSTANCES) -> str:
        now = int(time.time()) if ts is None else ts
        return wire.authorization_header(key, secret_used, "GET", path, query, now, b"")

    def get(header: str | None) -> requests.Response:
        headers = {"Authorization": header} if header is not None else {}
        return requests.get(url, params=query, headers=headers, timeout=10)

    assert get(auth(secret)).status_code == 200
    refused = [
        get(None),
        get("Bearer nothing"),
        get(auth("not-the-secret")),
        get(auth(secret, ts=int(time.time()) - 3600)),  # replayed an hour later
        get(auth(secret, path=wire.ENDPOINTS)),  # signed for another request
    ]
    for response in refused:
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "AuthFailure"
        assert secret not in response.text and key not in response.text


# ---- several clients, processes, takeover -----------------------------------------------


_CHILD = textwrap.dedent(
    """
    import asyncio, json, sys, time
    from pydantic import SecretStr
    from nodewarden.cloud import CloudConfig, CloudCredentials, build_cloud

    args = json.loads(open(sys.argv[1]).read())

    async def main():
        facade = build_cloud(
            CloudConfig.model_validate(args["config"]),
            CloudCredentials(key=SecretStr(args["key"]), secret=SecretStr(args["secret"])),
            args["dispatcher"],
        )
        ids = []
        for i in range(2):
            itype = facade.instance_type("small")
            request, _ = facade.create_request(
                name=f"wn-child-{i}", instance_type=itype, ssh_public_key=args["public_key"]
            )
            ids.append((await facade.create(request)).id)
        with open(args["out"], "w") as out:
            out.write(json.dumps(ids))
        while True:
            await asyncio.sleep(60)

    asyncio.run(main())
    """
)


async def test_vms_survive_the_client_being_sigkilled(
    stub_server: StubCloudProcess, operator_key: OperatorKey, tmp_path: Path
) -> None:
    args = tmp_path / "args.json"
    out = tmp_path / "ids.json"
    fd = os.open(args, os.O_WRONLY | os.O_CREAT, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(
            {
                "config": stub_server.cloud_config(ops_per_second=0).model_dump(mode="json"),
                "key": SERVER_CREDENTIALS[0],
                "secret": SERVER_CREDENTIALS[1],
                "dispatcher": "disp-child",
                "public_key": operator_key.public_line,
                "out": str(out),
            },
            f,
        )
    child = await asyncio.create_subprocess_exec(sys.executable, "-c", _CHILD, str(args))
    try:

        async def created() -> list[str] | None:
            if child.returncode is not None:
                raise AssertionError(f"child exited with {child.returncode}")
            return json.loads(out.read_text()) if out.exists() and out.read_text() else None

        ids = await poll_until(created, timeout=30)
    finally:
        child.send_signal(signal.SIGKILL)
        await asyncio.wait_for(child.wait(), 10)
    assert child.returncode == -signal.SIGKILL

    facade = remote_facade(stub_server, dispatcher="disp-child")
    listed = {i.id: i for i in await facade.list_instances()}
    assert set(listed) == set(ids)
    for instance in listed.values():
        endpoint = await wait_for_ssh(facade, instance)
        view = stub_server.admin.vm(instance.id)
        assert view is not None and view.host_public_key is not None
        proof = await ssh_run(
            endpoint, operator_key.private, view.host_public_key, DEFAULT_INSTANCE_SECRET_COMMAND
        )
        digest = hashlib.sha256(str(proof.stdout).strip().encode()).hexdigest()
        assert digest == instance.tags[facade.tag_keys.secret_digest]
        await facade.destroy(instance)
    assert await facade.list_instances() == []
    await facade.close()


async def test_two_dispatchers_share_one_cloud_and_take_over(
    stub_server: StubCloudProcess, operator_key: OperatorKey
) -> None:
    a = remote_facade(stub_server, dispatcher="disp-share-a")
    b = remote_facade(stub_server, dispatcher="disp-share-b")
    vm_a, _ = await create(a, "small", operator_key)
    vm_b, _ = await create(b, "small", operator_key)
    assert [i.id for i in await a.list_instances()] == [vm_a.id]
    assert [i.id for i in await b.list_instances()] == [vm_b.id]

    managed = {i.id: i for i in await a.list_managed_instances()}
    assert {vm_a.id, vm_b.id} <= set(managed)  # other tests' dispatchers may be there too
    await a.set_tags(managed[vm_b.id], {a.tag_keys.node: "adopted"})
    assert {i.id for i in await a.list_instances()} == {vm_a.id, vm_b.id}
    assert await b.list_instances() == []
    for instance in await a.list_instances():
        await a.destroy(instance)
    await a.close()
    await b.close()


# ---- admin controls ------------------------------------------------------------------


async def test_admin_worker_controls_and_resolve(
    stub_server: StubCloudProcess, operator_key: OperatorKey
) -> None:
    facade = remote_facade(stub_server, dispatcher="disp-admin")
    vm, _ = await create(facade, "small", operator_key)
    endpoint = await wait_for_ssh(facade, vm)
    admin = stub_server.admin
    address = vm.address()
    assert address is not None
    assert admin.resolve(address) == endpoint
    assert admin.resolve("198.19.255.254") is None
    view = admin.vm(vm.id)
    assert view is not None and view.host_public_key is not None
    key = view.host_public_key

    ready = await ssh_run(endpoint, operator_key.private, key, DEFAULT_READY_COMMAND)
    assert ready.exit_status == 0
    faults = admin.set_worker_faults(vm.id, broken_ready=True)
    assert faults["broken_ready"] is True
    broken = await ssh_run(endpoint, operator_key.private, key, DEFAULT_READY_COMMAND)
    assert broken.exit_status != 0
    with pytest.raises(StubCloudProcessError, match="400"):
        admin.set_worker_faults(vm.id, no_such_fault=True)

    admin.poweroff(vm.id)
    stopped = admin.vm(vm.id)
    assert stopped is not None and stopped.state == "stopped" and stopped.port is None
    await poll_until(lambda: _refused(endpoint.port), timeout=10)
    (listed,) = await facade.list_instances()
    assert listed.state is InstanceState.STOPPED

    intruder = type(admin)(stub_server.url, "not-the-token")
    with pytest.raises(StubCloudProcessError, match="401"):
        intruder.vms()
    intruder.close()
    await facade.destroy(listed)
    await facade.close()


# ---- process lifecycle and logs ----------------------------------------------------------


async def test_sigterm_stops_every_ssh_server_and_leaks_no_secret(
    tmp_path: Path, catalogue: list[InstanceType], operator_key: OperatorKey
) -> None:
    admin_token = "admin-token-1f2e3d4c5b6a79880011"
    config = StubServerConfig(
        name="logs",
        credentials={"key": SERVER_CREDENTIALS[0], "secret": SERVER_CREDENTIALS[1]},
        admin_token=SecretStr(admin_token),
        instance_types=catalogue,
    )
    stub = StubCloudProcess(config, workdir=tmp_path, log_level="DEBUG").start()
    try:
        assert stub.admin_token.get_secret_value() == admin_token
        ready_file = tmp_path / "stub-cloud.ready"
        assert ready_file.stat().st_mode & 0o077 == 0
        assert json.loads(ready_file.read_text())["pid"] == stub.pid
        facade = remote_facade(stub, dispatcher="disp-term")
        secrets = []
        for i in range(3):
            _, secret = await create(facade, "small", operator_key, name=f"wn-{i}")
            secrets.append(secret.get_secret_value())
        assert stub.admin.wait_for_workers(3, timeout=20) == 3
        ports = [vm.port for vm in stub.admin.vms()]
        with pytest.raises(CloudAuthError):
            await remote_facade(stub, dispatcher="disp-term", credentials=WRONG).list_instances()
        stub.admin.set_faults(instance_quota=0)
        with pytest.raises(CloudError):
            await create(facade, "small", operator_key)
        await facade.close()
        pid = stub.pid
        assert pid is not None
    finally:
        code = stub.stop()
    assert code == 0
    assert _process_gone(pid)
    for port in ports:
        assert port is not None and await _refused(port)

    log_text = stub.log_text()
    assert "stub cloud server stopped" in log_text
    assert '"http_status": 401' in log_text  # the log really saw the refused call
    assert WRONG.secret is not None
    hidden = [*SERVER_CREDENTIALS, WRONG.secret.get_secret_value(), admin_token, *secrets]
    for value in hidden:
        assert value not in log_text, "a secret reached the server log"
    assert (tmp_path / "stub-cloud.yaml").stat().st_mode & 0o077 == 0  # holds the secrets


def test_server_exits_when_the_process_that_started_it_dies(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import sys, time
        from pathlib import Path
        from nodewarden_doubles.stubcloud.process import StubCloudProcess
        stub = StubCloudProcess(workdir=Path({str(tmp_path)!r})).start()
        print(stub.pid, flush=True)
        time.sleep(120)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        server_pid = int(parent.stdout.readline())
    finally:
        parent.kill()
        parent.wait(10)
    deadline = time.monotonic() + 15
    while not _process_gone(server_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    gone = _process_gone(server_pid)
    if not gone:  # clean up before failing: never leave a server behind
        os.kill(server_pid, signal.SIGKILL)
    assert gone, "the stub cloud server outlived its parent"
    assert "parent process gone" in (tmp_path / "stub-cloud.log").read_text()


def test_bad_config_is_refused_without_echoing_values(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("credentials: {key: 123456789012, secret: [987654321098]}\n")
    result = subprocess.run(
        [sys.executable, "-m", "nodewarden_doubles.stubcloud.server", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "credentials.key" in result.stderr and "credentials.secret" in result.stderr
    for value in ("123456789012", "987654321098"):
        assert value not in result.stderr + result.stdout
