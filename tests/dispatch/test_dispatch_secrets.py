"""No secret reaches a log, a status or an Event in a real run (issue 4 acceptance, whole system)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from clusterkit import ClusterHandle
from dispatchkit import DispatchEnv, apply_many, container
from nodewarden.dispatch.identity import instance_secret, master_secret

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
        *[instance_secret(master, name).get_secret_value() for name in node_names],
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
