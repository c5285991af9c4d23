"""The chaos run's machine-readable report: the facts its invariants rest on, as the nodes,
the BMCs and the cloud recorded them (format and invariants: `chaos.recheck`).

    report = build_report(evidence, seed=..., replay=..., faults=..., node_states=...)
    write_report(path, report)       # then: python3 e2e/chaos/recheck.py PATH

Built from the evidence the fleet gathered after the operators stopped (`ChaosFleet.
evidence`): the stub cloud's and the side nodes' run ledgers (each run's start and end
on the node's clock), the fleet's definition of each host's capacity (the side nodes'
WorkerNode capacity; the catalogue's instance type of each VM, which its runs name),
the fake BMCs' reset logs (time and User-Agent), the schedule's VM power-offs and the
side nodes' power events. Nothing in it comes from the operator's own view of the runs.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

from chaos.recheck import FORMAT
from nodewarden.units import parse_quantity

OBSERVE_WINDOW = 5.0
"""Seconds after a run's end within which its host's death can still hide that end from
the operator (a probe every second, then the runner-status command, on a loaded machine).
Such a run is run again: the node is the only record of a runner's exit, so a finished run
nobody saw finish counts as lost (at least once, as in Arvados). A later run after a run
whose end was observable is a real double run."""

_AGENT = re.compile(r"dispatcher=(?P<dispatcher>[^;)]+)(?:; replica=(?P<replica>[^;)]+))?")


def capacity_of(resources: dict[str, Any]) -> dict[str, int]:
    """{vcpus, ram (bytes), gpus} of a capacity or a container's resources."""
    return {
        "vcpus": int(resources.get("vcpus") or 0),
        "ram": parse_quantity(resources.get("ram") or 0),
        "gpus": int(resources.get("gpus") or 0),
    }


def _run(host: str, record: dict[str, Any]) -> dict[str, Any]:
    keys = ("startedAt", "endedAt", "end", "exitCode", "dispatcherId", "fence", "pid")
    return {"host": host, **{k: record.get(k) for k in keys}}


def _runs(ev: dict[str, Any]) -> tuple[dict[str, list[dict[str, Any]]], dict[str, str]]:
    """uuid -> its runs on every host; VM host -> its instance type (from its runs)."""
    runs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    sizes: dict[str, str] = {}
    for r in ev["cloud_runs"]:
        host = f"vm:{r['instanceId']}"
        sizes[host] = str(r["size"])
        runs[r["uuid"]].append(_run(host, r))
    for node, node_runs in ev["side_runs"].items():
        for r in node_runs:
            runs[r["uuid"]].append(_run(f"side:{node}", r))
    for rs in runs.values():
        rs.sort(key=lambda r: float(r["startedAt"]))
    return runs, sizes


def _nodes(ev: dict[str, Any], sizes: dict[str, str]) -> dict[str, dict[str, Any]]:
    owners = ev.get("owners") or {}
    nodes: dict[str, dict[str, Any]] = {
        f"side:{name}": {
            "kind": "side",
            "name": name,
            "size": None,
            "owner": owners.get(f"side:{name}"),
            "capacity": capacity_of(cap),
        }
        for name, cap in ev["capacity"]["side"].items()
    }
    types = ev["capacity"]["types"]
    for vm in ev["cloud_vms"]:
        sizes.setdefault(f"vm:{vm['id']}", str(vm["size"]))
    for host, size in sizes.items():
        if size in types:
            nodes[host] = {
                "kind": "vm",
                "name": host.removeprefix("vm:"),
                "size": size,
                "owner": ev.get("cloud_owner"),
                "capacity": capacity_of(types[size]),
            }
    return nodes


def _deaths(ev: dict[str, Any], runs: dict[str, list[dict[str, Any]]]) -> dict[str, list[float]]:
    deaths: dict[str, set[float]] = defaultdict(set)
    for vm, at in ev["vm_deaths"].items():
        deaths[f"vm:{vm}"].add(float(at))
    for node, events in ev["side_events"].items():
        for e in events:
            if e["kind"] == "power_off":
                deaths[f"side:{node}"].add(float(e["monotonic"]))
    for rs in runs.values():
        for r in rs:
            if r["end"] == "powerLoss":
                deaths[r["host"]].add(float(r["endedAt"]))
    return {host: sorted(times) for host, times in sorted(deaths.items())}


def _power_requests(ev: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for node, log in ev["bmc_logs"].items():
        for r in log.get("resets", []):
            agent = r.get("user_agent") or ""
            match = _AGENT.search(agent)
            out.append(
                {
                    "node": node,
                    "at": float(r["at"]),
                    "resetType": r["reset_type"],
                    "outcome": r.get("outcome"),
                    "userAgent": agent,
                    "dispatcher": match["dispatcher"] if match else None,
                    "replica": match["replica"] if match else None,
                }
            )
    return sorted(out, key=lambda r: r["at"])


def build_report(
    ev: dict[str, Any],
    *,
    seed: int,
    replay: str,
    t0: float,
    faults: list[dict[str, Any]],
    node_states: list[tuple[float, str, str]],
) -> dict[str, Any]:
    runs, sizes = _runs(ev)
    containers = []
    for cd in ev["containers"]:
        st, spec = cd.get("status") or {}, cd["spec"]
        containers.append(
            {
                "name": cd["metadata"]["name"],
                "uuid": spec["uuid"],
                "phase": st.get("phase"),
                "reason": st.get("reason"),
                "schedulingStatus": st.get("schedulingStatus"),
                "node": st.get("node"),
                "resources": capacity_of(spec["resources"]),
                "runs": runs.get(spec["uuid"], []),
            }
        )
    known = {c["uuid"] for c in containers}
    return {
        "format": FORMAT,
        "seed": seed,
        "replay": replay,
        "clock": "CLOCK_MONOTONIC seconds of this machine (nodes, BMCs and harness share it)",
        "t0": t0,
        "readAt": float(ev["read_at"]),
        "observeWindow": OBSERVE_WINDOW,
        "nodes": _nodes(ev, sizes),
        "containers": containers,
        "strayRuns": [{"uuid": u, **r} for u, rs in runs.items() if u not in known for r in rs],
        "hostDeaths": _deaths(ev, runs),
        "powerRequests": _power_requests(ev),
        "faults": faults,
        "nodeStates": [list(s) for s in node_states],
        "harness": {},
    }


def write_report(path: Path, report: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1, default=str))
