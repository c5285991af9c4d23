#!/usr/bin/env python3
"""Benchmark: Karpenter's 1,000-pod scale-out and bench_dispatch side by side, same control plane.

Issue 23's anchor. One local control plane (`e2e/localcluster.py`, cached binaries, plus
node-lifecycle-controller) serves both runs, one after the other:

1. Karpenter v1.15.0's KWOK provider, KWOK v0.8.0 and kube-scheduler (`e2e/anchor/build.sh`,
   built from the Go module proxy and cached in ~/.cache/nodewarden/anchor): N pending
   bare pods (1 CPU, 1 GiB each, like bench_dispatch's containers) -> all Running; first
   Running; Karpenter's CPU seconds and peak RSS (VmHWM); the number of Nodes it made.
   Then every process of that run is stopped and its objects are removed.
2. `benchmarks/bench_dispatch.py --kubeconfig <this control plane> --runs 1 --containers N`:
   N ContainerDispatches Queued -> Running on the stub cloud with zero boot.

Printed first: the calibration figure and the load average; then both rows and the
ratios nodewarden / Karpenter (below 1: nodewarden is faster or smaller). Not part of
`make test`; `make bench-anchor` runs it at 1,000 pods (several minutes, both cores).

    .venv/bin/python benchmarks/bench_anchor.py [--pods 1000] [--timeout 600]
        [--karpenter-only | --nodewarden-only] [--json FILE]

Every process started (control plane, scheduler, KWOK, Karpenter, bench_dispatch and its
operator) is stopped on success, failure, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "e2e")]

from anchor.karpenter import AnchorCluster, Scenario  # noqa: E402
from calibration import load, summary  # noqa: E402

BENCH_DISPATCH = REPO / "benchmarks" / "bench_dispatch.py"
DISPATCH_STOP_SECONDS = 60.0

# (label, Karpenter's key, bench_dispatch's key)
COMPARED = [
    ("Queued -> all Running, s", "wall_seconds_to_all_running", "wall_seconds_to_all_running"),
    ("first Running, s", "seconds_to_first_running", "seconds_to_first_running"),
    ("controller CPU, s", "karpenter_cpu_seconds", "operator_cpu_seconds"),
    ("controller peak RSS, MB", "karpenter_peak_rss_mb", "operator_peak_rss_mb"),
]


def dispatch_result(stdout: str) -> dict[str, Any]:
    """The first JSON object of one run in bench_dispatch's output (its per-run dict)."""
    decoder = json.JSONDecoder()
    for at, char in enumerate(stdout):
        if char == "{" and (at == 0 or stdout[at - 1] == "\n"):
            try:
                value, _ = decoder.raw_decode(stdout, at)
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict) and "wall_seconds_to_all_running" in value:
                return value
    raise RuntimeError("bench_dispatch printed no run result")


def run_dispatch(kubeconfig: Path, containers: int, timeout: float) -> dict[str, Any]:
    """bench_dispatch once against the running control plane; its per-run figures."""
    argv = [
        sys.executable,
        str(BENCH_DISPATCH),
        "--kubeconfig",
        str(kubeconfig),
        "--runs",
        "1",
        "--containers",
        str(containers),
        "--timeout",
        str(timeout),
    ]
    # its own process group: on Ctrl-C this script interrupts it (its `finally` stops the
    # operator and the stub cloud), and kills the group only if it does not exit in time
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, _ = proc.communicate()
    except BaseException:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=DISPATCH_STOP_SECONDS)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        raise
    sys.stdout.write(stdout)
    if proc.returncode not in (0, 1):  # 1: ran, but not every container reached Running
        raise RuntimeError(f"bench_dispatch exited with {proc.returncode}")
    return dispatch_result(stdout)


def ratio(ours: Any, theirs: Any) -> str:
    try:
        return f"{float(ours) / float(theirs):.2f}"
    except (TypeError, ValueError, ZeroDivisionError):
        return "n/a"


def side_by_side(karpenter: dict[str, Any] | None, nodewarden: dict[str, Any] | None) -> str:
    """The comparison table: one row per figure, Karpenter, nodewarden, the ratio."""
    rows = [f"{'figure':<28} {'Karpenter':>10} {'nodewarden':>11} {'nw / K':>7}"]
    for label, k_key, n_key in COMPARED:
        k = karpenter.get(k_key) if karpenter else None
        n = nodewarden.get(n_key) if nodewarden else None
        rows.append(f"{label:<28} {k!s:>10} {n!s:>11} {ratio(n, k):>7}")
    if karpenter:
        rows.append(f"{'nodes (Karpenter)':<28} {karpenter.get('nodes')!s:>10}")
    if nodewarden and "kube_requests_per_container" in nodewarden:
        rows.append(
            f"{'API requests per container':<28} {'':>10} "
            f"{nodewarden.get('kube_requests_per_container')!s:>11}"
        )
    return "\n".join(rows)


def terminate_as_interrupt(signum: int, frame: FrameType | None) -> None:
    """SIGTERM ends the run the way Ctrl-C does: through every `finally` below."""
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=1000, help="pods, and containers (1000)")
    parser.add_argument("--timeout", type=float, default=600, help="per run, seconds")
    parser.add_argument("--cpu", default="1", help="CPU request of each pod")
    parser.add_argument("--memory", default="1Gi", help="memory request of each pod")
    only = parser.add_mutually_exclusive_group()
    only.add_argument("--karpenter-only", action="store_true")
    only.add_argument("--nodewarden-only", action="store_true")
    parser.add_argument("--json", type=Path, help="also write both rows and the ratios here")
    parser.add_argument(
        "--keep-state", action="store_true", help="keep logs and state (kept anyway on failure)"
    )
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, terminate_as_interrupt)

    print(summary(), flush=True)
    print(f"{load()} (before the control plane starts)", flush=True)
    work = Path(tempfile.mkdtemp(prefix="nw-anchor-"))
    cluster = AnchorCluster(state_dir=work / "cluster")
    karpenter: dict[str, Any] | None = None
    nodewarden: dict[str, Any] | None = None
    finished = False
    try:
        cluster.up()
        if not args.nodewarden_only:
            scenario = Scenario(
                cluster, pods=args.pods, cpu=args.cpu, memory=args.memory, timeout=args.timeout
            )
            try:
                karpenter = scenario.run()
            finally:
                scenario.close()
            print("karpenter:", json.dumps(karpenter, indent=2), flush=True)
            print(f"{load()} (after Karpenter's run and its cleanup)", flush=True)
        if not args.karpenter_only:
            t0 = time.monotonic()
            nodewarden = run_dispatch(cluster.kubeconfig, args.pods, args.timeout)
            print(f"bench_dispatch took {time.monotonic() - t0:.0f}s; {load()}", flush=True)
        finished = True
    finally:
        keep = args.keep_state or not finished
        cluster.down(remove_state=not keep)
        if keep:
            print(f"state and logs kept in {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    print()
    print(summary())
    print(f"side by side, {args.pods} pods / containers, one control plane, one after the other:")
    print(side_by_side(karpenter, nodewarden))
    print(
        "RSS: Karpenter's is VmHWM; nodewarden's the highest VmRSS bench_dispatch sampled "
        "(every 0.5 s). Issue 23 target: Queued -> all Running <= 0.35 x Karpenter."
    )
    if args.json is not None:
        ratios = {
            k_key: ratio((nodewarden or {}).get(n_key), (karpenter or {}).get(k_key))
            for _, k_key, n_key in COMPARED
        }
        record = {
            "calibration": summary(),
            "karpenter": karpenter,
            "nodewarden": nodewarden,
            "ratios_nodewarden_over_karpenter": ratios,
        }
        args.json.write_text(json.dumps(record, indent=2))
    ok = [r.get("all_running") for r in (karpenter, nodewarden) if r is not None]
    return 0 if ok and all(ok) else 1


if __name__ == "__main__":
    raise SystemExit(main())
