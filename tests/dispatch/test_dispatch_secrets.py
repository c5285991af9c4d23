"""No secret reaches a log, a status or an Event in a real run (issue 4 acceptance, whole system)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from clusterkit import ClusterHandle, wait_for_async
from dispatchkit import DispatchEnv, apply_many, container
from nodewarden.cloud.facade import build_cloud
from nodewarden.cloud.initscript import secret_digest
from nodewarden.pool.identity import instance_secret, master_secret

pytestmark = pytest.mark.cluster

TOKEN = "status-token-for-tests-0123456789"


@pytest.fixture
def env(cluster: ClusterHandle, namespace: str, tmp_path: Path) -> Iterator[DispatchEnv]:
    e = DispatchEnv.create(cluster, namespace, tmp_path)
    yield e
    e.close()


def test_no_secret_in_logs_status_or_events(env: DispatchEnv) -> None:
    cfg = env.config_path.read_text().replace("log_level: INFO", "log_level: DEBUG")
    env.config_path.write_text(cfg)
    op = env.start_operator()
    apply_many(env, [container("s1", 901, duration=1), container("s2", 902, duration=1)])
    env.wait_phases({"s1": "Complete", "s2": "Complete"}, timeout=120)

    # the management status endpoint: token required, then a live view
    assert op.get("/api/v1/status")[0] == 401
    req = urllib.request.Request(
        f"http://127.0.0.1:{op.port}/api/v1/status", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    with urllib.request.urlopen(req, timeout=5) as resp:
        view = json.loads(resp.read())
    assert view["dispatcherId"] == env.dispatcher_id
    assert {c["name"] for c in view["containers"]} == {"s1", "s2"}
    node_names = {i["workerNode"] for i in view["instances"]}
    assert node_names, view
    nonces = {
        vm.tags["nodewarden-node"]: vm.tags.get("nodewarden-secret-nonce") for vm in env.ours()
    }
    assert set(nonces) >= node_names and all(nonces.values()), nonces

    env.wait_no_nodes(timeout=90)
    op.stop()
    creds = env.stub.cloud_credentials()
    assert creds is not None and creds.secret is not None
    private_key = env.ssh_key.export_private().get_secret_value()
    master = master_secret(env.ssh_key)
    secrets = [
        creds.secret.get_secret_value(),
        TOKEN,
        *[
            line
            for line in private_key.splitlines()
            if len(line) > 20 and "PRIVATE KEY" not in line
        ],
        *[instance_secret(master, name, nonces[name]).get_secret_value() for name in node_names],
    ]
    haystacks = {
        "operator log": op.logs(),
        "stub cloud log": env.stub.log_text(),
        "containers": json.dumps(env.containers()),
        "events": json.dumps(env.cluster.get_json(env.namespace, "events")),
    }
    assert "DEBUG" in haystacks["operator log"]  # the run really logged at DEBUG
    for where, text in haystacks.items():
        for secret in secrets:
            assert secret not in text, f"a secret leaked into the {where}"


async def test_a_re_created_declared_vm_gets_another_secret_an_old_one_is_still_proven(
    env: DispatchEnv,
) -> None:
    """Issue 20, item 6. A VM made by the release before nonces (secret HMAC(master, name),
    no nonce tag) is adopted and proven; a declared VM deleted and declared again under the
    same name gets a different per-instance secret."""
    master = master_secret(env.ssh_key)
    cloud = build_cloud(env.stub.cloud_config(), env.stub.cloud_credentials(), env.dispatcher_id)
    itype = next(t for t in cloud.catalogue if t.name == "small")
    old_secret = instance_secret(master, "legacy-1")
    request, _ = cloud.create_request(
        name="legacy-1",
        instance_type=itype,
        ssh_public_key=env.ssh_key.public_key,
        tags={"nodewarden-node": "legacy-1", "nodewarden-idle-behavior": "hold"},
        instance_secret=old_secret,
    )
    legacy = await cloud.create(request)
    await cloud.close()
    assert "nodewarden-secret-nonce" not in legacy.tags
    env.start_operator()

    def ready(name: str) -> dict[str, Any] | None:
        body = env.cluster.get_json(env.namespace, "wn")["items"]
        status = next((b.get("status") or {} for b in body if b["metadata"]["name"] == name), {})
        return status if status.get("readiness") == "Ready" and status.get("sshHostKey") else None

    await wait_for_async(lambda: ready("legacy-1"), timeout=60, what="legacy VM adopted, proven")

    declared = {
        "apiVersion": "nodewarden.io/v1alpha1",
        "kind": "WorkerNode",
        "metadata": {"name": "warm-1"},
        "spec": {"nodeType": "CloudVM", "instanceType": "small", "idleBehavior": "hold"},
    }
    tags = []
    for _ in range(2):
        env.apply(declared)
        status = await wait_for_async(lambda: ready("warm-1"), timeout=60, what="warm-1 proven")
        vm = next(v for v in env.ours() if v.id == status["instanceId"])
        tags.append(vm.tags)
        env.cluster.kubectl("-n", env.namespace, "delete", "wn", "warm-1", "--wait=true")
        await wait_for_async(
            lambda vm=vm: all(v.id != vm.id for v in env.ours()), timeout=60, what="destroyed"
        )
    first, second = tags
    assert first["nodewarden-secret-nonce"] != second["nodewarden-secret-nonce"]
    assert first["nodewarden-secret-sha256"] != second["nodewarden-secret-sha256"]
    for vm_tags in tags:
        nonce = vm_tags["nodewarden-secret-nonce"]
        digest = secret_digest(instance_secret(master, "warm-1", nonce))
        assert vm_tags["nodewarden-secret-sha256"] == digest
