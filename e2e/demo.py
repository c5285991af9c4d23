#!/usr/bin/env python3
"""`make demo`: a real local control plane, a stub cloud, the examples, and the operator.

Steps: build/reuse the control plane binaries → start etcd, kube-apiserver and
kube-controller-manager on 127.0.0.1 (state in .nodewarden/demo) → install the CRDs →
start the stub cloud (a separate process whose VMs are real SSH servers on 127.0.0.1;
catalogue in e2e/demo/catalogue.yaml) → create the Secrets the operator needs (a fresh
SSH key, the stub cloud's credentials, the status API token) → apply `examples/`, the
fast demo policy and the demo batch of containers (e2e/demo/) into namespace
`nodewarden` → run `nodewarden run` with the embedded demo configuration
(e2e/demo-config.yaml + the stub cloud's URL) in the foreground → on Ctrl-C (or after
`--duration` seconds) stop the operator, the stub cloud and the control plane and remove
their state. Nothing is left running afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from localcluster import REPO, ClusterError, LocalCluster
from nodewarden.ssh.credentials import SshClientKey
from nodewarden_doubles.stubcloud.process import StubCloudProcess
from nodewarden_doubles.stubcloud.serverconfig import StubServerConfig, StubServerCredentials

NAMESPACE = "nodewarden"
CONFIG = REPO / "e2e" / "demo-config.yaml"
DEMO = REPO / "e2e" / "demo"


def start_stub_cloud(state: Path) -> StubCloudProcess:
    catalogue = yaml.safe_load((DEMO / "catalogue.yaml").read_text())
    stub = StubCloudProcess(
        StubServerConfig(
            name="demo",
            credentials=StubServerCredentials(
                key="AKIADEMOSTUBCLOUD01", secret=secrets.token_hex(20)
            ),
            instance_types=catalogue,
            faults={"boot_delay": 3.0, "seed": 1},
        ),
        workdir=state / "stub-cloud",
    )
    stub.start()
    return stub


def write_secrets_and_config(
    cluster: LocalCluster, stub: StubCloudProcess, state: Path, port: int
) -> Path:
    key = SshClientKey.generate()
    creds = stub.cloud_credentials()
    assert creds is not None and creds.secret is not None
    token = secrets.token_hex(16)
    for name, data in {
        "nodewarden-ssh": {"id": key.export_private().get_secret_value()},
        "nodewarden-cloud": {
            "key": creds.key.get_secret_value(),
            "secret": creds.secret.get_secret_value(),
        },
        "nodewarden-status": {"token": token},
    }.items():
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name},
            "stringData": data,
        }
        cluster.kubectl("-n", NAMESPACE, "apply", "-f", "-", input=json.dumps(secret))
    config = yaml.safe_load(CONFIG.read_text())
    config["cloud"]["driver_params"] = {"cloud": stub.url}
    config["cloud"]["instance_types"] = yaml.safe_load((DEMO / "catalogue.yaml").read_text())
    config["http"]["port"] = port
    path = state / "operator-config.yaml"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    (state / "status-token").write_text(token)
    (state / "status-token").chmod(0o600)
    return path


def banner(kubeconfig: Path, port: int, token_file: Path) -> str:
    k = f"kubectl --kubeconfig {kubeconfig}"
    return f"""
==============================================================================
 nodewarden demo is running (namespace {NAMESPACE!r}). In another terminal:

   export KUBECONFIG={kubeconfig}
   {k} get wn,cd -w                 # nodes and containers, live
   {k} get nodewarden               # everything nodewarden owns
   {k} describe wn gpu-a100-01      # conditions, last Safety Record
   {k} get pi -o yaml               # power intents and their Safety Records
   {k} get events --sort-by=.lastTimestamp
   curl -s localhost:{port}/metrics | grep ^nodewarden_
   curl -s -H "Authorization: Bearer $(cat {token_file})" localhost:{port}/api/v1/status

 Press Ctrl-C here to stop the operator and the local control plane.
==============================================================================
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--duration", type=float, default=None, help="stop after N seconds (non-interactive)"
    )
    parser.add_argument("--state-dir", type=Path, default=REPO / ".nodewarden" / "demo")
    parser.add_argument("--keep", action="store_true", help="leave the control plane running")
    parser.add_argument("--http-port", type=int, default=8080, help="operator /metrics port")
    args = parser.parse_args(argv)

    cluster = LocalCluster(state_dir=args.state_dir.resolve(), namespace=NAMESPACE)
    old = LocalCluster.load(cluster.state_dir)
    if old.alive():
        print(">> stopping a demo control plane left from an earlier run", file=sys.stderr)
        old.down()
    try:
        cluster.up()
    except ClusterError as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 1
    operator: subprocess.Popen[bytes] | None = None
    stub: StubCloudProcess | None = None
    interrupted = False
    try:
        stub = start_stub_cloud(cluster.state_dir)
        config = write_secrets_and_config(cluster, stub, cluster.state_dir, args.http_port)
        cluster.kubectl("-n", NAMESPACE, "apply", "-f", str(REPO / "examples"))
        cluster.kubectl("-n", NAMESPACE, "apply", "-f", str(DEMO / "policy-default.yaml"))
        cluster.kubectl("-n", NAMESPACE, "apply", "-f", str(DEMO / "containers.yaml"))
        print(
            banner(cluster.kubeconfig, args.http_port, cluster.state_dir / "status-token"),
            file=sys.stderr,
            flush=True,
        )
        operator = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "nodewarden",
                "run",
                f"--config={config}",
                f"--kubeconfig={cluster.kubeconfig}",
                f"--namespace={NAMESPACE}",
                "--log-format=text",
                "--http-host=127.0.0.1",
                f"--http-port={args.http_port}",
            ],
            cwd=REPO,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        deadline = None if args.duration is None else time.monotonic() + args.duration
        while operator.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                break
            time.sleep(0.2)
        if operator.returncode not in (None, 0):
            print(f"demo: the operator exited with {operator.returncode}", file=sys.stderr)
            return operator.returncode
    except KeyboardInterrupt:
        interrupted = True
    finally:
        # Ctrl-C in a terminal already signalled the operator (same process group); a
        # signal sent to this process alone is passed on. Stop everything promptly.
        if operator is not None and operator.poll() is None:
            operator.send_signal(signal.SIGTERM)
            try:
                operator.wait(timeout=15)
            except subprocess.TimeoutExpired:
                operator.kill()
                operator.wait()
        if stub is not None:
            stub.stop(timeout=10)
        if not args.keep:
            cluster.down()
            print(">> demo stopped; the local control plane is down", file=sys.stderr)
    return 130 if interrupted else 0


if __name__ == "__main__":
    # Ctrl-C and TERM both mean "stop and clean up". Installed explicitly: a process
    # started in the background by a non-interactive shell inherits SIGINT as ignored,
    # and Python then would not turn it into KeyboardInterrupt.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    raise SystemExit(main())
