"""`make demo` works non-interactively and leaves nothing behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clusterkit import wait_for
from localcluster import REPO, free_port, kubectl_path

pytestmark = pytest.mark.cluster


def _pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


def test_demo_runs_then_cleans_up_on_ctrl_c(tmp_path: Path) -> None:
    state = tmp_path / "demo"
    log = (tmp_path / "demo.log").open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            str(REPO / "e2e" / "demo.py"),
            f"--state-dir={state}",
            f"--http-port={free_port()}",
            "--duration=300",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        kubeconfig = state / "kubeconfig"
        wait_for(kubeconfig.exists, timeout=120, what="demo kubeconfig")
        pids = json.loads((state / "pids.json").read_text())["pids"]
        assert set(pids) == {"etcd", "kube-apiserver", "kube-controller-manager"}

        def acknowledged() -> bool:
            out = subprocess.run(
                [
                    kubectl_path(),
                    f"--kubeconfig={kubeconfig}",
                    "-n",
                    "nodewarden",
                    "get",
                    "wn",
                    "-o",
                    "jsonpath={.items[*].status.conditions[?(@.type=='Valid')].status}",
                ],
                capture_output=True,
                text=True,
                check=False,
            )
            return out.stdout.split() == ["True", "True", "True"]

        wait_for(acknowledged, timeout=90, interval=1, what="demo nodes acknowledged")
        proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
        assert proc.wait(timeout=60) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    output = (tmp_path / "demo.log").read_text()
    assert "kubectl --kubeconfig" in output and "get wn,cd -w" in output
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_pid_alive(p) for p in pids.values()):
        time.sleep(0.2)
    assert not [n for n, p in pids.items() if _pid_alive(p)], "demo left processes behind"
    # nor any other process that refers to the demo's state (the operator's --kubeconfig)
    leftovers = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _pid_alive(int(entry.name)):
            try:
                cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if str(state) in cmdline and int(entry.name) != os.getpid():
                leftovers.append(cmdline.replace("\0", " "))
    assert not leftovers, leftovers
    assert not (state / "etcd").exists() and not kubeconfig.exists()
