#!/usr/bin/env python3
"""`make e2e`: the chart installed on a real one-node cluster in network namespaces of its own.

Outside (the caller's namespace, as root): install missing Debian packages, build or
reuse the binaries and images (cached in ~/.cache/nodewarden), create the node and cloud
namespaces (`dataplane.netns`), then run this same file again inside the node namespace
(with a mount namespace of its own, shared by the kubelet and containerd) and delete
both namespaces afterwards, whatever happened. Inside: start the cluster
(`dataplane.node`), import the images and run the scenario (`dataplane.scenario`), which
asserts as it goes and writes a JSON report.

    python e2e/dataplane/run.py [--trimmed] [--report FILE] [--keep-state]

`--trimmed` is the form `make test` runs (fewer containers, no upgrade to a second
chart; see `dataplane.scenario`). Exit 0 only if every assertion held.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent.parent / "operator")]

from dataplane import images  # noqa: E402
from dataplane.netns import Namespaces  # noqa: E402
from dataplane.node import dataplane_binaries  # noqa: E402
from localcluster import binaries_dir  # noqa: E402


def log(msg: str) -> None:
    print(f">> {msg}", file=sys.stderr, flush=True)


def prepare() -> dict[str, str]:
    """Everything cached: packages, binaries, images. Returns what the inside run needs."""
    t0 = time.monotonic()
    subprocess.run([str(HERE / "deps.sh")], check=True)
    binaries_dir()
    dataplane_binaries()
    pause = images.pause_image()
    operator = images.operator_image()
    log(f"binaries and images ready in {time.monotonic() - t0:.0f}s")
    return {
        "pause_archive": str(pause.archive),
        "operator_ref": operator.ref,
        "operator_archive": str(operator.archive),
        "prepare_seconds": f"{time.monotonic() - t0:.1f}",
    }


def outside(args: argparse.Namespace) -> int:
    if os.geteuid() != 0:
        print("make e2e needs root (network namespaces, containerd, kubelet)", file=sys.stderr)
        return 2
    started = time.monotonic()
    prepared = prepare()
    namespaces = Namespaces.fresh().create()
    state = Path(tempfile.mkdtemp(prefix="nwe2e-", dir=args.state_root))
    report = args.report or state / "report.json"
    # The node namespace's network; a mount namespace of its own (mounts of the kubelet
    # and containerd shared by both, gone with them). Not `ip netns exec`: it remounts
    # /sys, which hides the cgroup hierarchies from the kubelet.
    inside_argv = [
        "nsenter", f"--net=/run/netns/{namespaces.node}", "--",
        "unshare", "--mount", "--propagation=slave", "--",
        sys.executable, str(Path(__file__).resolve()),
        "--inside", f"--state-dir={state}", f"--cloud-netns={namespaces.cloud}",
        f"--report={report}", f"--prepared={json.dumps(prepared)}",
    ]  # fmt: skip
    if args.trimmed:
        inside_argv.append("--trimmed")
    code = 1
    try:
        log(f"namespaces {namespaces.node} (node) and {namespaces.cloud} (cloud); state {state}")
        code = subprocess.call(inside_argv)
    finally:
        namespaces.delete()
        if not args.keep_state and code == 0:
            shutil.rmtree(state, ignore_errors=True)
    elapsed = time.monotonic() - started
    log(f"e2e {'passed' if code == 0 else 'FAILED'} in {elapsed:.0f}s; report {report}")
    return code


def private_netns_dir(state: Path, cloud_netns: str) -> Path:
    """Give this mount namespace a /run/netns of its own (containerd creates the Pods'
    network namespace files there: they go away with us instead of piling up on the
    host); keep a handle on the cloud namespace first. Returns that handle's path."""
    handle = state / "cloud.netns"
    handle.touch()
    subprocess.run(["mount", "--bind", f"/run/netns/{cloud_netns}", str(handle)], check=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=755", "nwe2e-netns", "/run/netns"],
                   check=True)  # fmt: skip
    return handle


def inside(args: argparse.Namespace) -> int:
    from dataplane.envs import NetnsEnvironment
    from dataplane.scenario import run_scenario

    prepared = json.loads(args.prepared)
    state = Path(args.state_dir)
    env = NetnsEnvironment(state, private_netns_dir(state, args.cloud_netns), prepared)
    return run_scenario(
        state, env, args.trimmed, Path(args.report), float(prepared["prepare_seconds"])
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--trimmed", action="store_true", help="the short form run by make test")
    parser.add_argument("--report", type=Path, help="write the JSON report here")
    parser.add_argument("--keep-state", action="store_true", help="keep logs and state")
    parser.add_argument("--state-root", default=None, help="parent of the state directory")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--state-dir", help=argparse.SUPPRESS)
    parser.add_argument("--cloud-netns", help=argparse.SUPPRESS)
    parser.add_argument("--prepared", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    return inside(args) if args.inside else outside(args)


if __name__ == "__main__":
    raise SystemExit(main())
