"""The status API is answered by every replica: the standby relays to the leader's signed URL."""

from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from clusterkit import ClusterHandle, OperatorProcess, wait_for
from dispatchkit import DispatchEnv
from nodewarden.endpoints import (
    STATUS_SIGNATURE_ANNOTATION,
    STATUS_URL_ANNOTATION,
    advertised_status_url,
    sign_status_url,
)

pytestmark = pytest.mark.cluster

TOKEN = "status-token-for-tests-0123456789"


def test_advertised_url_and_signature() -> None:
    assert advertised_status_url(8080, "10.1.2.3") == "http://10.1.2.3:8080"
    assert advertised_status_url(8080, "fd00::5") == "http://[fd00::5]:8080"
    assert advertised_status_url(8080, "") is None
    assert advertised_status_url(8080, "not-an-ip") is None
    token = SecretStr("t0")
    sig = sign_status_url(token, "pod-a", "http://10.1.2.3:8080")
    assert sig == sign_status_url(SecretStr("t0"), "pod-a", "http://10.1.2.3:8080")
    assert sig != sign_status_url(token, "pod-b", "http://10.1.2.3:8080")
    assert sig != sign_status_url(token, "pod-a", "http://10.6.6.6:8080")
    assert sig != sign_status_url(SecretStr("t1"), "pod-a", "http://10.1.2.3:8080")


@pytest.fixture
def env(
    cluster: ClusterHandle, namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[DispatchEnv]:
    monkeypatch.setenv("NODEWARDEN_POD_IP", "127.0.0.1")  # what the chart sets from status.podIP
    e = DispatchEnv.create(cluster, namespace, tmp_path)
    yield e
    e.close()


def _status(op: OperatorProcess, token: str | None) -> tuple[int, dict[str, str], Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    req = urllib.request.Request(f"http://127.0.0.1:{op.port}/api/v1/status", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, dict(resp.headers), json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), json.loads(exc.read())


def _lease(env: DispatchEnv) -> dict[str, Any]:
    return env.cluster.get_json(env.namespace, "lease", f"nodewarden-{env.dispatcher_id}")  # type: ignore[no-any-return]


def test_standby_relays_status_to_the_leader(env: DispatchEnv) -> None:
    first = env.start_operator()
    wait_for(lambda: first.get("/readyz")[0] == 200, timeout=30, what="first replica leads")
    second = env.start_operator()
    wait_for(lambda: '"standby"' in second.get("/readyz")[1], timeout=30, what="standby")

    def published() -> dict[str, str] | None:
        annotations = _lease(env)["metadata"].get("annotations") or {}
        return annotations if STATUS_URL_ANNOTATION in annotations else None

    annotations = wait_for(published, timeout=20, what="the leader's status URL on its Lease")
    holder = _lease(env)["spec"]["holderIdentity"]
    assert annotations[STATUS_URL_ANNOTATION] == f"http://127.0.0.1:{first.port}"

    code, headers, body = _status(first, TOKEN)
    assert code == 200 and headers["X-Nodewarden-Served-By"] == holder
    code, headers, relayed = _status(second, TOKEN)
    assert code == 200, relayed
    assert headers["X-Nodewarden-Served-By"] == holder
    assert relayed["dispatcherId"] == body["dispatcherId"] == env.dispatcher_id
    # the standby checks the token itself: nothing reaches the leader without it
    assert _status(second, None)[0] == 401
    assert _status(second, "wrong")[0] == 401
    for op in (first, second):
        assert TOKEN not in op.logs()


def test_standby_never_sends_the_token_to_an_unsigned_url(env: DispatchEnv) -> None:
    """Whoever can edit the Lease but not read the token Secret cannot harvest the token."""
    seen: list[str] = []

    class Trap(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization", ""))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    trap = HTTPServer(("127.0.0.1", 0), Trap)
    threading.Thread(target=trap.serve_forever, daemon=True).start()
    try:
        leader = env.start_operator()
        wait_for(lambda: leader.get("/readyz")[0] == 200, timeout=30, what="leader")
        standby = env.start_operator()
        wait_for(lambda: '"standby"' in standby.get("/readyz")[1], timeout=30, what="standby")
        wait_for(
            lambda: STATUS_URL_ANNOTATION in (_lease(env)["metadata"].get("annotations") or {}),
            timeout=20,
            what="published status URL",
        )
        lease_name = f"nodewarden-{env.dispatcher_id}"
        forged = f"http://127.0.0.1:{trap.server_address[1]}"
        holder = _lease(env)["spec"]["holderIdentity"]
        # pause the leader so it cannot rewrite its annotation while we look
        leader.proc.send_signal(19)  # SIGSTOP
        try:
            env.cluster.kubectl(
                "-n", env.namespace, "annotate", "--overwrite", "lease", lease_name,
                f"{STATUS_URL_ANNOTATION}={forged}",
                f"{STATUS_SIGNATURE_ANNOTATION}={sign_status_url(SecretStr('guess'), holder, forged)}",
            )  # fmt: skip
            code, _, body = _status(standby, TOKEN)
        finally:
            leader.proc.send_signal(18)  # SIGCONT
        assert code == 503, body
        assert "verifiable" in body["error"]
        assert seen == []
    finally:
        trap.shutdown()
