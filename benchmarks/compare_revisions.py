#!/usr/bin/env python3
"""Benchmarks of two git revisions, one after the other in one session, side by side.

    .venv/bin/python benchmarks/compare_revisions.py --before fea1317 --after HEAD
        [--scale] [--policy-args '--rounds 5'] [--dispatch-args '--runs 1']
        [--scale-args '--nodes 1000'] [--from-after benchmarks/bench_power_fleet.py]

For each revision: a temporary detached `git worktree`, and its own benchmark scripts run
with this checkout's `.venv` but the revision's sources (`PYTHONPATH=<tree>/operator`;
the scripts find their kits in the tree's tests/ and e2e/). Each benchmark is run for
`before` then at once for `after` (so the two runs of a pair see the most similar load):
`bench_policy.py`, `bench_dispatch.py`, and with `--scale` `bench_scale.py --nodes 1000`
(heavy: several minutes and most of the machine). Printed: the calibration figure and
the load average at the start, the load average before and after each run, and each
benchmark's headline figures as `before | after | after/before`. Every benchmark's
whole output is kept with `--log-dir`.

`--from-after PATH` copies PATH from the after revision into the before tree first (a
benchmark fix that landed in between: at fea1317, bench_scale cannot start its fake BMC
without ef914c8's bench_power_fleet.py). Exit 1 when a benchmark run failed (its
figures are then missing), 0 otherwise: judging "worse beyond noise" is left to the
reader, with the calibration and load printed beside the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "e2e"))

from calibration import load, summary  # noqa: E402
from compare_demo_records import worktree  # noqa: E402

Figures = dict[str, float]


def json_blocks(text: str) -> list[tuple[str, dict[str, Any]]]:
    """Every JSON object printed from column 0 (`json.dumps(..., indent=2)`), each with
    the line printed just before it."""
    lines = text.splitlines()
    out: list[tuple[str, dict[str, Any]]] = []
    i = 0
    while i < len(lines):
        if lines[i] == "{":
            end = next((j for j in range(i + 1, len(lines)) if lines[j] == "}"), None)
            if end is None:
                break
            with contextlib.suppress(ValueError):
                out.append((lines[i - 1] if i else "", json.loads("\n".join(lines[i : end + 1]))))
            i = end + 1
            continue
        i += 1
    return out


POLICY_ROW = re.compile(
    r"^  (?P<label>\S.*?)\s+(?P<cpu>[\d.]+)\s+(?P<rate>\d+)\s+(?P<wall>[\d.]+)$"
)


def policy_figures(text: str) -> Figures:
    """bench_policy: CPU ms of each row (best of its rounds)."""
    out: Figures = {}
    for line in text.splitlines():
        m = POLICY_ROW.match(line)
        if m:
            label = re.sub(r"\(\d+ full records\)", "(incremental)", m["label"])
            out[f"{label} cpu ms"] = float(m["cpu"])
    return out


DISPATCH_KEYS = (
    "wall_seconds_to_all_running",
    "seconds_to_first_running",
    "operator_cpu_seconds",
    "operator_peak_rss_mb",
    "kube_requests_per_container",
    "containerdispatch_writes_per_container",
)


def dispatch_figures(text: str) -> Figures:
    """bench_dispatch: the medians block (the only run when --runs 1 printed no other)."""
    blocks = json_blocks(text)
    medians = next((b for before, b in blocks if before.startswith("median of")), None)
    if medians is None:
        return {}
    out: Figures = {k: float(medians[k]) for k in DISPATCH_KEYS if k in medians}
    share = medians.get("cpu_share_of_one_core") or {}
    for name in ("operator", "kube-apiserver", "etcd"):
        if name in share:
            out[f"cpu share {name}"] = float(share[name])
    return out


def scale_figures(text: str) -> Figures:
    """bench_scale: per size, the summary line's figures (from its JSON result)."""
    out: Figures = {}
    for _, r in json_blocks(text):
        if "nodes" not in r or "steady" not in r:
            continue
        n = r["nodes"]
        lag = r.get("fact_change_to_decision_written") or {}
        picks: dict[str, Any] = {
            "s to every first decision": r.get("seconds_to_every_first_decision"),
            "s to every node fresh": r.get("seconds_to_every_node_fresh"),
            "operator peak RSS MB": r.get("operator_peak_rss_mb"),
            "operator CPU s (total)": r.get("operator_cpu_seconds_total"),
            "steady operator cpu share": r["steady"].get("operator_cpu_share"),
            "steady api writes": sum((r["steady"].get("api_writes") or {}).values()),
            "lag p99 bmc s": (lag.get("bmc") or {}).get("p99_seconds"),
            "lag p99 spec s": (lag.get("spec") or {}).get("p99_seconds"),
        }
        for key, value in picks.items():
            if isinstance(value, (int, float)):
                out[f"[{n}] {key}"] = float(value)
    return out


@dataclass(frozen=True)
class Bench:
    name: str
    script: str
    args: list[str]
    figures: Callable[[str], Figures]


@dataclass
class Outcome:
    figures: Figures
    seconds: float
    load_before: str
    load_after: str
    returncode: int


def run_bench(bench: Bench, tree: Path, log: Path | None) -> Outcome:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(tree / "operator"), *filter(None, [os.environ.get("PYTHONPATH")])]
        ),
    }
    before = load()
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(tree / "benchmarks" / bench.script), *bench.args],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.monotonic() - started
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-15:])
        print(f"   {bench.script} exited {proc.returncode}:\n{tail}", file=sys.stderr)
    return Outcome(bench.figures(proc.stdout), seconds, before, load(), proc.returncode)


def table(bench: Bench, a: Outcome, b: Outcome) -> str:
    rows = [
        f"\n{bench.name}: {shlex.join([bench.script, *bench.args])}",
        f"  before: {a.seconds:.0f} s, exit {a.returncode}; {a.load_before} -> {a.load_after}",
        f"  after:  {b.seconds:.0f} s, exit {b.returncode}; {b.load_before} -> {b.load_after}",
        f"  {'figure':44s} {'before':>10s} | {'after':>10s} | {'ratio':>6s}",
    ]
    for key in [*a.figures, *(k for k in b.figures if k not in a.figures)]:
        x, y = a.figures.get(key), b.figures.get(key)
        ratio = f"{y / x:6.2f}" if x and y is not None else "     -"
        left = f"{x:10.2f}" if x is not None else f"{'-':>10s}"
        right = f"{y:10.2f}" if y is not None else f"{'-':>10s}"
        rows.append(f"  {key:44s} {left} | {right} | {ratio}")
    return "\n".join(rows)


@contextlib.contextmanager
def trees(before: str, after: str, from_after: list[str]) -> Iterator[tuple[Path, Path, str, str]]:
    with (
        tempfile.TemporaryDirectory(prefix="nwbench-") as tmp,
        worktree(before, Path(tmp) / "a") as (tree_a, sha_a),
        worktree(after, Path(tmp) / "b") as (tree_b, sha_b),
    ):
        for path in from_after:
            shutil.copy2(tree_b / path, tree_a / path)
        yield tree_a, tree_b, sha_a, sha_b


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--before", required=True, help="git revision")
    parser.add_argument("--after", required=True, help="git revision")
    parser.add_argument("--scale", action="store_true", help="also bench_scale (heavy)")
    parser.add_argument("--policy-args", default="", help="extra arguments of bench_policy")
    parser.add_argument("--dispatch-args", default="", help="extra arguments of bench_dispatch")
    parser.add_argument("--scale-args", default="--nodes 1000", help="arguments of bench_scale")
    parser.add_argument(
        "--only", action="append", choices=["policy", "dispatch", "scale"], help="these only"
    )
    parser.add_argument(
        "--from-after", action="append", default=[], help="copy PATH from after into before"
    )
    parser.add_argument("--log-dir", type=Path, help="keep each benchmark's whole output here")
    args = parser.parse_args(argv)
    benches = [
        Bench("policy", "bench_policy.py", shlex.split(args.policy_args), policy_figures),
        Bench("dispatch", "bench_dispatch.py", shlex.split(args.dispatch_args), dispatch_figures),
    ]
    if args.scale:
        benches.append(
            Bench("scale", "bench_scale.py", shlex.split(args.scale_args), scale_figures)
        )
    if args.only:
        benches = [b for b in benches if b.name in args.only]
    print(summary(), flush=True)
    failed = False
    with trees(args.before, args.after, args.from_after) as (tree_a, tree_b, sha_a, sha_b):
        print(f"before: {args.before} ({sha_a[:12]}) | after: {args.after} ({sha_b[:12]})")
        for bench in benches:
            outcomes = []
            for tag, tree, sha in (("before", tree_a, sha_a), ("after", tree_b, sha_b)):
                print(f">> {bench.name} {tag} ({sha[:12]}) ...", file=sys.stderr, flush=True)
                log = None
                if args.log_dir is not None:
                    log = args.log_dir / f"{bench.name}-{tag}-{sha[:12]}.log"
                outcomes.append(run_bench(bench, tree, log))
            print(table(bench, *outcomes), flush=True)
            failed |= any(o.returncode != 0 or not o.figures for o in outcomes)
    print(f"\nat the end: {load()}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
