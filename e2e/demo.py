#!/usr/bin/env python3
"""`make demo`: a real local control plane, the examples, and the operator in the foreground.

Steps: build/reuse the control plane binaries → start etcd, kube-apiserver and
kube-controller-manager on 127.0.0.1 (state in .nodewarden/demo) → install the CRDs →
apply `examples/` into namespace `nodewarden` → run `nodewarden run` with the embedded
demo configuration (e2e/demo-config.yaml) in the foreground → on Ctrl-C (or after
`--duration` seconds) stop the operator and the control plane and remove their state.
Nothing is left running afterwards.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from localcluster import REPO, ClusterError, LocalCluster

NAMESPACE = "nodewarden"
CONFIG = REPO / "e2e" / "demo-config.yaml"


def banner(kubeconfig: Path) -> str:
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
    interrupted = False
    try:
        cluster.kubectl("-n", NAMESPACE, "apply", "-f", str(REPO / "examples"))
        print(banner(cluster.kubeconfig), file=sys.stderr, flush=True)
        operator = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "nodewarden",
                "run",
                f"--config={CONFIG}",
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
        if operator is not None and operator.poll() is None:
            operator.send_signal(signal.SIGTERM)
            try:
                operator.wait(timeout=20)
            except subprocess.TimeoutExpired:
                operator.kill()
                operator.wait()
        if not args.keep:
            cluster.down()
            print(">> demo stopped; the local control plane is down", file=sys.stderr)
    return 130 if interrupted else 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # treat TERM like Ctrl-C
    raise SystemExit(main())
