#!/usr/bin/env python3
"""Recompute the chaos run's capacity and exactly-once invariants from its report alone.

    python3 e2e/chaos/recheck.py REPORT.json     # one line per invariant; exit 1 on a violation

Standard library only, and nothing of the harness: the report (`chaos.report`, written
by every chaos run with `--report FILE.json`) holds every fact these checks read, as the
nodes and the BMCs recorded them, so anyone can check a run without trusting the
harness that played it. The chaos suite calls the same functions on the same report.

The report (format `nodewarden-chaos-report/1`; all times are seconds of the machine's
CLOCK_MONOTONIC, which every node double, fake BMC and the harness share):

- `nodes`: host -> {kind (`side` / `vm`), name, size, owner (the dispatcher id of the
  install it belongs to), capacity {vcpus, ram (bytes), gpus}},
  a host being `side:<name>` or `vm:<instance id>`; capacity from the fleet's definition
  (the side nodes' WorkerNode capacity, the cloud catalogue's instance type);
- `containers`: every ContainerDispatch with uuid, final phase, reason, the node its
  status names, its resources {vcpus, ram (bytes), gpus} and `runs`: each run of its
  uuid on any host as that host's run ledger recorded it: host, startedAt, endedAt
  (null: still running when the ledgers were read at `readAt`), end (exited, killed,
  lost, powerLoss), exitCode, dispatcherId, fence;
- `strayRuns`: runs whose uuid no ContainerDispatch has;
- `hostDeaths`: host -> times it lost power (VMs the schedule powered off, side-node
  power-offs, and every powerLoss end in a ledger);
- `observeWindow`: seconds after a run's end within which its host's death can hide
  that end from the operator (such a run may be run again: at least once);
- `powerRequests`: every reset a BMC received: node, at, resetType, outcome,
  userAgent and the dispatcher / replica it names;
- `faults`, `nodeStates`, `harness`: what was injected when and the WorkerNode states the
  harness saw (seconds after `t0`), and the harness's own counts (for comparison, not read here).

Invariants:

- capacity: at no instant does a host run more containers' resources (vcpus, ram, gpus,
  each on its own) than its capacity, from the runs' own start and end records;
- exactly once: every container is final; Failed ones name a reason; a Complete one has
  a run that exited, and no run of it started after a run whose exit its host could
  report (no death of the host within `observeWindow` of that exit); no run is stray;
- never two runners: no two runs of one container overlap in time, on any hosts;
- one actor at a time: per dispatcher, the replicas that sent power requests did so one
  after the other (one replica's requests never fall between another's);
- installs apart: every run on a host names the host's install as its owner (runs
  naming none, from the harness itself, excepted) and every power request to a node
  comes from the node's install.
"""

from __future__ import annotations

import itertools
import json
import sys
from collections import defaultdict
from collections.abc import Callable
from typing import Any

Report = dict[str, Any]
FINAL = ("Complete", "Failed", "Cancelled")
DIMENSIONS = ("vcpus", "ram", "gpus")
FORMAT = "nodewarden-chaos-report/1"


def _end(run: dict[str, Any], report: Report) -> float:
    ended = run.get("endedAt")
    return float(report["readAt"] if ended is None else ended)


def _describe(used: dict[str, int], cap: dict[str, int]) -> str:
    return ", ".join(
        f"{d} {used[d]}/{cap.get(d, 0)}" for d in DIMENSIONS if used[d] > cap.get(d, 0)
    )


def capacity(report: Report) -> list[str]:
    """Episodes in which a host ran more than its capacity (one violation per episode)."""
    events: dict[str, list[tuple[float, int, str, dict[str, int]]]] = defaultdict(list)
    for c in report["containers"]:
        for run in c["runs"]:
            start, end = float(run["startedAt"]), _end(run, report)
            events[run["host"]].append((start, 1, c["name"], c["resources"]))
            events[run["host"]].append((end, 0, c["name"], c["resources"]))
    out = []
    for host, timeline in sorted(events.items()):
        node = report["nodes"].get(host)
        if node is None:
            out.append(f"{host}: runs recorded but no capacity known for it")
            continue
        cap = node["capacity"]
        used = dict.fromkeys(DIMENSIONS, 0)
        running: dict[str, int] = defaultdict(int)
        episode: tuple[float, str, list[str]] | None = None
        # ends before starts at one instant: a runner that ended as another started
        for at, starting, name, res in sorted(timeline, key=lambda e: (e[0], e[1])):
            sign = 1 if starting else -1
            for d in DIMENSIONS:
                used[d] += sign * int(res.get(d) or 0)
            running[name] += sign
            over = any(used[d] > cap.get(d, 0) for d in DIMENSIONS)
            if over and episode is None:
                episode = (at, _describe(used, cap), sorted(n for n, k in running.items() if k))
            elif not over and episode is not None:
                since, what, names = episode
                out.append(
                    f"{host} ({node.get('size')}): over capacity from {since:.2f} to {at:.2f} "
                    f"({at - since:.2f}s): {what}; running {names}"
                )
                episode = None
    return out


def _deaths(report: Report) -> dict[str, list[float]]:
    return {host: [float(t) for t in times] for host, times in report["hostDeaths"].items()}


def _observable(run: dict[str, Any], deaths: dict[str, list[float]], window: float) -> bool:
    """Could the operator have seen this exit (the host stayed up `window` after it)?"""
    end = float(run["endedAt"])
    return not any(end <= d < end + window for d in deaths.get(run["host"], []))


def exactly_once(report: Report) -> list[str]:
    """Every container final, run to an exit (Complete) or Failed with a reason, and never
    run again after an exit its host could report; no stray runs."""
    out = []
    deaths, window = _deaths(report), float(report["observeWindow"])
    for c in report["containers"]:
        runs, phase = c["runs"], c["phase"]
        exited = [r for r in runs if r.get("end") == "exited"]
        seen = [r for r in exited if _observable(r, deaths, window)]
        again = [r for r in runs if any(float(r["startedAt"]) > float(s["endedAt"]) for s in seen)]
        if phase not in FINAL:
            out.append(f"{c['name']}: lost, phase {phase} ({c.get('schedulingStatus')})")
        elif phase == "Failed" and not c.get("reason"):
            out.append(f"{c['name']}: Failed without a reason")
        elif phase == "Complete" and (not exited or again):
            out.append(
                f"{c['name']}: Complete with {len(exited)} runs that exited, {len(again)} "
                f"started after an exit its host could report: {_runs(runs)}"
            )
    out += [f"{r['uuid']}: ran on {r['host']} but no container has it" for r in report["strayRuns"]]
    return out


def never_two_runners(report: Report) -> list[str]:
    """No container ran twice at once (on two hosts, or twice on one)."""
    out = []
    for c in report["containers"]:
        runs = sorted(c["runs"], key=lambda r: float(r["startedAt"]))
        for i, a in enumerate(runs):
            for b in runs[i + 1 :]:
                if float(b["startedAt"]) < _end(a, report):
                    out.append(
                        f"{c['name']}: a run on {b['host']} started at {b['startedAt']:.2f} "
                        f"while the one on {a['host']} (started {a['startedAt']:.2f}) ran"
                    )
    return out


def one_actor_at_a_time(report: Report) -> list[str]:
    """Per dispatcher, no replica's power requests fall between another replica's."""
    spans: dict[str, dict[str, list[float]]] = defaultdict(dict)
    for r in report["powerRequests"]:
        replica = r.get("replica") or "(unnamed)"
        first_last = spans[r.get("dispatcher") or "(none)"].setdefault(replica, [r["at"], r["at"]])
        first_last[0], first_last[1] = min(first_last[0], r["at"]), max(first_last[1], r["at"])
    out = []
    for dispatcher, replicas in sorted(spans.items()):
        ordered = sorted(replicas.items(), key=lambda kv: kv[1][0])
        for (a, (_, a_last)), (b, (b_first, _)) in itertools.pairwise(ordered):
            if b_first < a_last:
                out.append(
                    f"dispatcher {dispatcher}: replica {b} sent a power request at "
                    f"{b_first:.2f}, before replica {a}'s last at {a_last:.2f}"
                )
    return out


def installs_apart(report: Report) -> list[str]:
    """No install started a runner on, or sent a power request to, another's node."""
    nodes = report["nodes"]
    out = []
    for c in report["containers"]:
        for run in c["runs"]:
            owner = (nodes.get(run["host"]) or {}).get("owner")
            by = run.get("dispatcherId")
            if owner and by and by != owner:
                out.append(f"{c['name']}: install {by} ran it on {run['host']}, {owner}'s node")
    for r in report["powerRequests"]:
        owner = (nodes.get(f"side:{r['node']}") or {}).get("owner")
        if owner and r.get("dispatcher") and r["dispatcher"] != owner:
            out.append(
                f"{r['node']}: power request {r.get('resetType')} at {r['at']:.2f} from "
                f"install {r['dispatcher']}, the node is {owner}'s"
            )
    return out


def _runs(runs: list[dict[str, Any]]) -> str:
    return "; ".join(
        f"{r['host']} {float(r['startedAt']):.2f}..{r.get('endedAt')} {r.get('end')}" for r in runs
    )


CHECKS: dict[str, Callable[[Report], list[str]]] = {
    "no node ran more than its capacity (runs' own start/end records)": capacity,
    "every container completed exactly once or Failed with a reason": exactly_once,
    "never two runners of one container at once": never_two_runners,
    "one actor at a time: power requests of one replica after another": one_actor_at_a_time,
    "installs apart: runs and power requests only on the install's own nodes": installs_apart,
}


def recheck(report: Report) -> dict[str, list[str]]:
    if report.get("format") != FORMAT:
        raise ValueError(f"not a chaos report of format {FORMAT}: {report.get('format')!r}")
    return {name: check(report) for name, check in CHECKS.items()}


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(f"usage: {argv[0]} REPORT.json", file=sys.stderr)
        return 2
    with open(argv[1], encoding="utf-8") as f:
        report = json.load(f)
    results = recheck(report)
    for name, violations in results.items():
        print(f"{len(violations):5d}  {name}")
    for name, violations in results.items():
        for v in violations[:20]:
            print(f"  {name}: {v}")
    runs = sum(len(c["runs"]) for c in report["containers"])
    print(
        f"seed {report.get('seed')}: {len(report['containers'])} containers, {runs} runs on "
        f"{len(report['nodes'])} hosts, {len(report['powerRequests'])} power requests"
    )
    return 1 if any(results.values()) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
