"""The chaos run's invariants, each a separate check over the evidence that counts violations.

    results = check_all(evidence)     # {name: [violation, ...]}, every check run
    print(report(results))            # one line per invariant with its count, then offenders

Evidence (see `ChaosFleet.evidence`) is what the run left behind, read after the
operators stopped: the stub cloud's run ledger (every run's start and end, destroyed
VMs included), the side nodes' run and power event logs, the fake BMCs' request and reset
logs, the Kubernetes objects (ContainerDispatch, WorkerNode, PowerIntent with its
Safety Records, Events, PowerPolicy) and the logs of every operator process. A
violation names the offending object and quotes the evidence that convicts it.

The capacity, exactly-once, never-two-runners and one-actor checks are `chaos.recheck`'s,
run over the run's report (`evidence["report"]`, `chaos.report`): the same report file
that `recheck.py` reads alone.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from chaos import recheck

Evidence = dict[str, Any]
Check = Callable[[Evidence], list[str]]

FINAL = ("Complete", "Failed", "Cancelled")
TERMINAL_INTENT = ("Succeeded", "Blocked", "Aborted", "Superseded", "Failed", "Shadow")
OPEN_INTENT = ("Pending", "Deferred", "InProgress")
STEADY_NODE = ("Idle", "Active", "Off")
NODE_MANAGER_RULES = {
    "WORKER_DOWN",
    "LAME_NODE",
    "BOOT_GRACE_EXCEEDED",
    "IDLE_EXCEEDED",
    "NODE_DELETED",
    "NODE_BROKEN",
    "POWER_PINNED_OFF",
    "IDLE_BEHAVIOR_DRAIN",
}


def _name(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["name"])


def _short(value: Any, limit: int = 600) -> str:
    text = json.dumps(value, default=str, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# -- containers and capacity: recomputed from the report (`chaos.recheck`) --------------


def _from_report(check: Check) -> Check:
    """A `chaos.recheck` check over the report built from the evidence (`chaos.report`):
    the harness and `recheck.py REPORT.json` count with the same functions."""

    def run(ev: Evidence) -> list[str]:
        return check(ev["report"])

    run.__doc__ = check.__doc__
    return run


# -- cloud ----------------------------------------------------------------------------------


def no_orphan_instances(ev: Evidence) -> list[str]:
    """60 s after the queue drained, every instance of ours has a WorkerNode."""
    return [f"instance {i} is ours but no WorkerNode stands for it" for i in ev["orphans"]]


# -- side nodes and their BMCs --------------------------------------------------------------


def no_leaked_bmc_sessions(ev: Evidence) -> list[str]:
    """At most one session per operator process and BMC; every clean stop logs out."""
    out = []
    for node, log in ev["bmc_logs"].items():
        requests = log.get("requests", [])
        if not requests:
            continue
        peak = max(r["live_sessions"] for r in requests)
        final = requests[-1]["live_sessions"]
        if peak > ev["processes"]:
            out.append(f"{node}: {peak} sessions live at once, {ev['processes']} processes ran")
        if final > ev["killed"]:
            out.append(
                f"{node}: {final} sessions live after every replica stopped "
                f"({ev['killed']} were SIGKILLed and could not log out)"
            )
    return out


def _records(intent: dict[str, Any]) -> list[dict[str, Any]]:
    st = intent.get("status") or {}
    return [r for r in (st.get("requestRecord"), st.get("safetyRecord")) if r]


def _node_type(intent: dict[str, Any]) -> str | None:
    for record in _records(intent):
        return str(record.get("nodeType"))
    return None


def _shutdown_requests(intent: dict[str, Any]) -> dict[str, Any] | None:
    st = intent.get("status") or {}
    if intent["spec"]["action"] != "Shutdown":
        return None
    record = st.get("requestRecord")
    return record if record and record.get("request") else None


def side_shutdown_gates(ev: Evidence) -> list[str]:
    """Every side-node shutdown request: every gate passed on fresh evidence, or an
    audited override naming the gate; every BMC shutdown reset has such a record."""
    out = []
    recorded: set[str] = set()
    for pi in ev["intents"]:
        record = _shutdown_requests(pi)
        if record is None or record.get("nodeType") != "SideNode":
            continue
        recorded.add(pi["spec"]["nodeName"])
        override = record.get("manualOverride") or {}
        applied = set(override.get("applied") or [])
        for gate in record.get("gates") or []:
            if gate["verdict"] == "FAIL" and gate["gate"] not in applied:
                out.append(
                    f"{_name(pi)}: gate {gate['gate']} FAIL without override: {_short(gate)}"
                )
        if not record.get("gates"):
            out.append(f"{_name(pi)}: shutdown request with no gate table")
        tele = record.get("telemetry") or {}
        age, limit = tele.get("oldestAgeSeconds"), tele.get("maxAgeSeconds")
        if tele.get("stale") or tele.get("missing") or age is None or age > limit:
            out.append(f"{_name(pi)}: shutdown on stale or missing telemetry: {_short(tele)}")
    for node, log in ev["bmc_logs"].items():
        sent = [
            r for r in log.get("resets", []) if r["reset_type"] in ("GracefulShutdown", "ForceOff")
        ]
        if sent and node not in recorded:
            out.append(
                f"{node}: {len(sent)} shutdown resets reached its BMC, no intent records one"
            )
    return out


def cloud_shutdown_rule(ev: Evidence) -> list[str]:
    """Every cloud-VM destroy names the node-manager rule that fired and its evidence."""
    out = []
    for pi in ev["intents"]:
        record = _shutdown_requests(pi)
        if record is None or record.get("nodeType") != "CloudVM":
            continue
        rule = [g for g in record.get("gates") or [] if g["gate"] == "nodeManager"]
        if not rule:
            out.append(
                f"{_name(pi)}: destroy without a nodeManager gate: {_short(record.get('gates'))}"
            )
            continue
        codes = set(rule[0].get("reasons") or [])
        if not codes & NODE_MANAGER_RULES or not rule[0].get("evidence"):
            out.append(f"{_name(pi)}: destroy names no rule / evidence: {_short(rule[0])}")
    return out


def off_only_when_observed(ev: Evidence) -> list[str]:
    """No OFF recorded without an observed Off from a trusted source."""
    out = []
    for pi in ev["intents"]:
        for record in _records(pi):
            if record.get("stateAfter") != "OFF":
                continue
            actual = (record.get("proof") or {}).get("actualState") or []
            seen = [e for e in actual if e.get("name") == "power" and e.get("value") == "Off"]
            requested = (record.get("confirmation") or {}).get("requested") == "Off"
            if not seen or (requested and not (record.get("confirmation") or {}).get("confirmed")):
                out.append(f"{_name(pi)}: OFF recorded without an observed Off: {_short(actual)}")
    for wn in ev["workernodes"]:
        name, state = _name(wn), (wn.get("status") or {}).get("state")
        power = ev["side_power"].get(name)
        if state == "Off" and power not in (None, "Off"):
            out.append(f"{name}: WorkerNode Off while its power source says {power}")
    for node, events in ev["side_events"].items():
        for e in events:
            if e["kind"] == "power_off" and e.get("detail", {}).get("containers_lost"):
                out.append(f"{node}: switched off with containers running: {_short(e)}")
    return out


def bound_only_when_ready(ev: Evidence) -> list[str]:
    """No container started on a side node that was not On and ready (the node whose ready
    probe fails after a wake gets nothing after that wake)."""
    out = []
    for node, events in ev["side_events"].items():
        ons = sorted(float(e["monotonic"]) for e in events if e["kind"] == "power_on")
        offs = sorted(float(e["monotonic"]) for e in events if e["kind"] == "power_off")
        for run in ev["side_runs"][node]:
            at = float(run["monotonic"])
            last_off = max((t for t in offs if t <= at), default=None)
            last_on = max((t for t in ons if t <= at), default=None)
            if last_off is not None and (last_on is None or last_on < last_off):
                out.append(f"{node}: {run['uuid']} started while the node was off")
            if node == ev["ready_fails_node"] and last_on is not None:
                out.append(f"{node}: {run['uuid']} started after a wake whose ready probe fails")
    return out


def no_force_off_without_override(ev: Evidence) -> list[str]:
    """A ForceOff reaching a BMC needs a manual intent with an audited forceOff override."""
    allowed = {
        pi["spec"]["nodeName"]
        for pi in ev["intents"]
        if (
            (pi["spec"].get("override") or {}).get("forceOff")
            and pi["spec"].get("source") == "Manual"
        )
    }
    return [
        f"{node}: ForceOff at {r['at']} without an audited override"
        for node, log in ev["bmc_logs"].items()
        for r in log.get("resets", [])
        if r["reset_type"] == "ForceOff" and node not in allowed
    ]


# -- bookkeeping ----------------------------------------------------------------------------


def intents_closed_or_explained(ev: Evidence) -> list[str]:
    """Every PowerIntent terminal with a reason, or open with a reason and a recheck time."""
    out = []
    for pi in ev["intents"]:
        st = pi.get("status") or {}
        phase = st.get("phase")
        if phase in TERMINAL_INTENT:
            if not st.get("reasons"):
                out.append(f"{_name(pi)}: {phase} without a reason: {_short(st, 300)}")
        elif phase in OPEN_INTENT:
            if not (st.get("reasons") or st.get("message")) or not (
                st.get("recheckAt") or st.get("deadline")
            ):
                out.append(
                    f"{_name(pi)}: open ({phase}) without reason + recheck time: {_short(st, 400)}"
                )
        else:
            out.append(f"{_name(pi)}: phase {phase!r}: {_short(st, 300)}")
    return out


def _times(value: Any, keys: Iterable[str]) -> bool:
    if isinstance(value, dict):
        return any(value.get(k) for k in keys) or any(_times(v, keys) for v in value.values())
    if isinstance(value, list):
        return any(_times(v, keys) for v in value)
    return False


def workernodes_not_stuck(ev: Evidence) -> list[str]:
    """Every WorkerNode steady (Idle/Active/Off), Blocked with reasons, or with a recheck time."""
    out = []
    for wn in ev["workernodes"]:
        st = wn.get("status") or {}
        state = st.get("state")
        if state in STEADY_NODE:
            continue
        if state == "Blocked" and (st.get("lastSafetyRecord") or {}).get("reasons"):
            continue
        if _times(st.get("powerState"), ("recheckAt", "deadline", "nextAttemptAt")):
            continue
        if state == "Booting" and st.get("instanceId"):
            continue  # a cloud VM still booting: bootGrace bounds it (node-manager rule)
        out.append(
            f"{_name(wn)}: {state} without a recheck time: {_short(st.get('powerState'), 400)}"
        )
    return out


def no_secret_anywhere(ev: Evidence) -> list[str]:
    """No secret value in an operator log, a status, an object or an Event."""
    places: dict[str, str] = dict(ev["logs"])
    for kind in ("containers", "workernodes", "intents", "events", "policies"):
        places[kind] = json.dumps(ev[kind])
    return [
        f"{what} appears in {where}"
        for what, value in ev["secrets"].items()
        for where, text in places.items()
        if value and value in text
    ]


CHECKS: dict[str, Check] = {
    **{name: _from_report(check) for name, check in recheck.CHECKS.items()},
    "zero orphan instances 60 s after the drain": no_orphan_instances,
    "zero leaked BMC sessions": no_leaked_bmc_sessions,
    "side-node shutdowns: every gate passed on fresh evidence or audited override": side_shutdown_gates,
    "cloud-VM shutdowns name the node-manager rule and its evidence": cloud_shutdown_rule,
    "no OFF without an observed Off": off_only_when_observed,
    "no container on a node not verified On + ready": bound_only_when_ready,
    "no ForceOff without an audited override": no_force_off_without_override,
    "every PowerIntent terminal with a reason or open with reason + recheck": intents_closed_or_explained,
    "no WorkerNode stuck without a recheck time": workernodes_not_stuck,
    "no secret in any log, status or Event": no_secret_anywhere,
}


def check_all(ev: Evidence) -> dict[str, list[str]]:
    return {name: check(ev) for name, check in CHECKS.items()}


def report(results: dict[str, list[str]], shown: int = 10) -> str:
    lines = [f"{len(v):5d}  {name}" for name, v in results.items()]
    for name, violations in results.items():
        if violations:
            lines.append(f"--- {name}: {len(violations)} violation(s)")
            lines += [f"    {v}" for v in violations[:shown]]
            if len(violations) > shown:
                lines.append(f"    ... {len(violations) - shown} more")
    return "\n".join(lines)
