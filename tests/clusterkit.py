"""Helpers for tests against the real local control plane: kubectl, polling, operator processes.

Imported by name (`from clusterkit import ...`); the fixtures themselves live in
tests/conftest.py. A unique module name avoids clashes between the several conftest.py
files of the test tree.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calibration import scaled
from localcluster import REPO, LocalCluster, run_kubectl
from nodewarden_doubles.ports import unused_loopback_port


@dataclass
class ClusterHandle:
    kubeconfig: Path
    local: LocalCluster | None

    @property
    def operator_kubeconfig(self) -> Path:
        """The operator's own identity (audited, see tests/rbac); admin on other clusters."""
        return self.local.operator_kubeconfig if self.local is not None else self.kubeconfig

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        return run_kubectl(self.kubeconfig, *args, input=input, check=check, timeout=timeout)

    def get_json(self, namespace: str, *what: str) -> Any:
        out = self.kubectl("-n", namespace, "get", *what, "-o", "json")
        return json.loads(out.stdout)


def wait_for(predicate: Any, timeout: float = 20.0, interval: float = 0.2, what: str = "") -> Any:
    """Poll `predicate` until it returns a truthy value; fail with `what` after `timeout`
    (seconds on the reference machine, scaled by the calibration figure)."""
    timeout = scaled(timeout)
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}: {last!r}")


async def wait_for_async(
    predicate: Any,
    timeout: float = 20.0,  # noqa: ASYNC109 - wait_for's signature; the failure names `what`
    interval: float = 0.2,
    what: str = "",
) -> Any:
    """`wait_for` for async tests: the predicate runs in a thread and the wait yields the loop.

    Tests that serve peers (a fake BMC, a stub SSH worker) on their own event loop must not
    block it while they wait for the operator to reach those peers.
    """
    timeout = scaled(timeout)
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = await asyncio.to_thread(predicate)
        if last:
            return last
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}: {last!r}")


@dataclass
class OperatorProcess:
    proc: subprocess.Popen[str]
    port: int
    log_path: Path

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=2) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def start_operator(
    cluster: ClusterHandle,
    namespace: str,
    tmp_path: Path,
    *extra: str,
    name: str = "operator",
    env: dict[str, str] | None = None,
    probe_port: int | None = None,
) -> OperatorProcess:
    """`nodewarden run` on a free status port; `op.port` answers /healthz (the status
    port, or `probe_port` when the config gives the probes a listener of their own)."""
    port = unused_loopback_port()
    log_path = tmp_path / f"{name}.log"
    out = log_path.open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "nodewarden",
            "run",
            f"--kubeconfig={cluster.operator_kubeconfig}",
            f"--namespace={namespace}",
            f"--http-port={port}",
            "--http-host=127.0.0.1",
            "--resync-interval=2s",
            *extra,
        ],
        stdout=out,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
        env={**os.environ, **(env or {})},
    )
    out.close()
    op = OperatorProcess(proc, probe_port or port, log_path)

    def up() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"operator exited {proc.returncode}:\n{op.logs()}")
        try:
            return op.get("/healthz")[0] == 200
        except OSError:
            return False

    wait_for(up, timeout=30, what="operator /healthz")
    return op
