"""The side node of the e2e scenario: its process config, chart values and cluster objects.

One GPU side node, `gpu-side-01`, run by the side-node process (`nodewarden_doubles.sidenode`,
a test double: a stub SSH worker that is up only while its fake Redfish BMC says On) in
the cloud namespace, advertised at the routed cloud address (`dataplane.envs`). It is On
and idle at the start; its GPU model (`GPU_MODEL`) is one no instance type of the stub
cloud has, so a container asking for it fits only this node.

What the scenario installs for it, built here from the process's state:

- chart values: `credentials.bmcEndpoints` / `sshEndpoints` admit exactly its BMC and SSH
  endpoints (address and port), `credentials.secretNames` narrows the Role's `get
  secrets` to its two designated Secrets (plus the operator's own), `power.*` timing fast
  enough for a test;
- Secrets: `side-bmc` (username, password, CA bundle; label `nodewarden.io/credentials=bmc`)
  and `side-ssh` (known_hosts; label `ssh`);
- PowerPolicy `e2e-side-fast` (its own, named by the node's `policyRef`): idle 2 s, no
  min-on/off or cooldown, deadlines long enough for a leader handover in the middle;
- the WorkerNode (Redfish, `knownHostsSecretRef`, cost 0).

`check_shutdown` and `check_wake` judge the two transitions from what the cluster and
the side node's BMC log show (problems, and a summary for the report).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from nodewarden.credentials.designation import LABEL

NODE = "gpu-side-01"
POLICY = "e2e-side-fast"
GPU_MODEL = "a100-e2e"
BMC_USER = "nwe2e-bmc"
BMC_SECRET = "side-bmc"
SSH_SECRET = "side-ssh"
TRANSITION_SECONDS = 4.0
"""How long the fake BMC takes to apply a reset (the node stays WAKING / SHUTTING_DOWN)."""

POLICY_SPEC: dict[str, Any] = {
    "idleThreshold": "2s",
    "bootGrace": "60s",
    "minOn": "0s",
    "minOff": "0s",
    "cooldown": "0s",
    "telemetryMaxAge": "15s",
    "heartbeatStaleAfter": "60s",
    "billing": {"period": "0s", "windowStart": "0s", "windowEnd": "1s"},
    # longer than a leader handover (lease 15 s): the new leader confirms, never re-sends
    "deadlines": {"shutdown": "60s", "wake": "60s", "ready": "60s", "drain": "60s"},
    "retry": {"budget": 2, "initialBackoff": "1s", "maxBackoff": "2s", "jitter": 0.1},
    "disruptionBudget": {"maxConcurrentTransitions": 2},
    # the warm-capacity and forecast levers in Shadow (they record, never act): their
    # dashboard panels have a series to show, and the power cycle below is theirs to leave be
    "nodeClasses": [{"name": "gpu", "nodeType": "SideNode", "gpuModel": GPU_MODEL}],
    "warmCapacity": {
        "mode": "Shadow",
        "windows": [
            {
                "name": "always",
                "nodeClass": "gpu",
                "minWarm": 1,
                "days": ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"],
                "start": "00:00",
                "end": "24:00",
            }
        ],
    },
    "forecastWake": {"mode": "Shadow"},
}
POWER_TIMING = {
    "power_poll_interval": 2,
    "power_poll_interval_at_rest": 2,
    "evaluate_interval": 5,
    "request_timeout": 10,
    # energy figures (docs/energy.md): a class for the side node, figures written often
    "energy": {
        "status_interval": 60,
        "classes": {
            "default": {
                "idle_watts": 300,
                "off_watts": 12,
                "boot_energy_wh": 4,
                "shutdown_energy_wh": 1,
                "price_per_kwh": 0.3,
            }
        },
    },
}
ON_WATTS = 280.0
"""The side node's draw while On, as its fake BMC reports it (with a kWh counter)."""


def new_bmc_password() -> str:
    return secrets.token_hex(12)


def process_config(operator_public_key: str, bmc_password: str) -> dict[str, Any]:
    """The side-node process config (the environment adds `advertise_address`)."""
    return {
        "name": "nwe2e-side",
        "authorized_keys": [operator_public_key],
        "bmc": {"username": BMC_USER, "password": bmc_password},
        "nodes": [
            {
                "name": NODE,
                "power": "fakebmc",
                "initial_power": "On",
                "boot_delay": 1.0,
                "ready_delay": 0.5,
                "shutdown_delay": 0.2,
                "gpus": 1,
                "fakebmc": {
                    "transition_seconds": TRANSITION_SECONDS,
                    # the only peer with power readings (sushy-tools has none)
                    "power_reading": "cumulative",
                    "on_watts": ON_WATTS,
                    "off_watts": 9.0,
                },
            }
        ],
    }


def _endpoint(info: dict[str, Any]) -> tuple[str, str]:
    """(BMC host:port, SSH host:port) of a node of the process state."""
    bmc = str(info["power"]["endpoint"]).removeprefix("https://").rstrip("/")
    return bmc, f"{info['ssh']['host']}:{info['ssh']['port']}"


def chart_values(state: dict[str, Any]) -> dict[str, Any]:
    """Values admitting exactly the side node's endpoints (see the module docstring)."""
    bmc, ssh = _endpoint(state["nodes"][NODE])
    return {
        "credentials": {
            "bmcEndpoints": [bmc],
            "sshEndpoints": [ssh],
            "wakeOnLanTargets": [],
            "secretNames": [BMC_SECRET, SSH_SECRET],
        },
        "power": POWER_TIMING,
    }


def objects(state: dict[str, Any], bmc_password: str) -> list[dict[str, Any]]:
    """The designated Secrets, the node's PowerPolicy and its WorkerNode."""
    info = state["nodes"][NODE]
    ssh = info["ssh"]

    def secret(name: str, use: str, data: dict[str, str]) -> dict[str, Any]:
        meta = {"name": name, "labels": {LABEL: use}}
        return {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "stringData": data}

    bmc_data = {"username": BMC_USER, "password": bmc_password, "caBundle": state["bmc_ca_pem"]}
    return [
        secret(BMC_SECRET, "bmc", bmc_data),
        secret(SSH_SECRET, "ssh", {"knownHosts": info["known_hosts_line"] + "\n"}),
        {
            "apiVersion": "nodewarden.io/v1alpha1",
            "kind": "PowerPolicy",
            "metadata": {"name": POLICY},
            "spec": POLICY_SPEC,
        },
        {
            "apiVersion": "nodewarden.io/v1alpha1",
            "kind": "WorkerNode",
            "metadata": {"name": NODE},
            "spec": {
                "nodeType": "SideNode",
                "controlMethod": "Redfish",
                "policyRef": {"name": POLICY},
                "costPerHour": 0,
                "capacity": {"vcpus": 16, "ram": "64Gi", "gpus": 1, "gpuModel": GPU_MODEL},
                "ssh": {
                    "address": ssh["host"],
                    "port": int(ssh["port"]),
                    "user": "nodewarden",
                    "knownHostsSecretRef": {"name": SSH_SECRET, "key": "knownHosts"},
                },
                "bmc": {
                    "endpoint": info["power"]["endpoint"],
                    "systemId": info["power"]["system_id"],
                    "usernameSecretRef": {"name": BMC_SECRET, "key": "username"},
                    "passwordSecretRef": {"name": BMC_SECRET, "key": "password"},
                    "caBundleSecretRef": {"name": BMC_SECRET, "key": "caBundle"},
                },
            },
        },
    ]


def gpu_container(name: str, uuid: str, seconds: int) -> dict[str, Any]:
    """A container that fits only the side node (its GPU model is in no instance type)."""
    return {
        "apiVersion": "nodewarden.io/v1alpha1",
        "kind": "ContainerDispatch",
        "metadata": {"name": name},
        "spec": {
            "uuid": uuid,
            "priority": 900,
            "resources": {"vcpus": 2, "ram": "4Gi", "gpus": 1, "gpuModel": GPU_MODEL},
            "command": ["train", "--epochs", "1"],
            "runtime": {"image": "example.org/train:1", "durationHintSeconds": seconds},
        },
    }


def parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def check_shutdown(
    intent: dict[str, Any],
    resets: list[dict[str, Any]],
    bmc_endpoint: str,
    wall_time: Callable[[float], datetime],
) -> tuple[list[str], dict[str, Any]]:
    """The idle node's Shutdown: made by the policy on passing gates, exactly one
    GracefulShutdown in the BMC's log (`resets`), OFF confirmed by a read of that BMC
    taken no earlier than the BMC applied the reset. The fake BMC applies a reset
    `TRANSITION_SECONDS` after it accepted it (`at`, its monotonic clock; `wall_time`
    converts): a record made on acceptance would be seconds early."""
    status = intent.get("status") or {}
    record = status.get("safetyRecord") or {}
    sent = status.get("requestRecord") or {}
    confirmation = record.get("confirmation") or {}
    problems = []
    if intent["spec"].get("source") != "Policy":
        problems.append(f"source {intent['spec'].get('source')}, not Policy")
    if status.get("phase") != "Succeeded" or "POWER_OFF_CONFIRMED" not in status.get("reasons", []):
        problems.append(f"phase {status.get('phase')} reasons {status.get('reasons')}")
    if sent.get("decision") != "SHUTDOWN" or "GATES_PASSED" not in sent.get("reasons", []):
        problems.append(f"request record {sent.get('decision')} {sent.get('reasons')}")
    if not sent.get("gates") or any(g.get("verdict") == "FAIL" for g in sent["gates"]):
        problems.append(f"request gates {sent.get('gates')}")
    if not (
        confirmation.get("confirmed") is True
        and confirmation.get("observed") == "Off"
        and bmc_endpoint in str(confirmation.get("source"))
    ):
        problems.append(f"confirmation {confirmation}, not an Off read from {bmc_endpoint}")
    if (record.get("policy") or {}).get("name") != POLICY:
        problems.append(f"policy {record.get('policy')}, not {POLICY}")
    summary: dict[str, Any] = {
        "intent": intent["metadata"]["name"],
        "reasons": status.get("reasons"),
        "request_gates": {g.get("gate"): g.get("verdict") for g in sent.get("gates") or []},
    }
    if [(r["reset_type"], r["outcome"]) for r in resets] != [("GracefulShutdown", "scheduled")]:
        problems.append(f"the BMC received {resets}, not one GracefulShutdown")
    elif confirmation.get("observedAt"):
        bmc_off = wall_time(float(resets[0]["at"]) + TRANSITION_SECONDS)
        seen_off = parse_time(confirmation["observedAt"])
        # 0.1 s: the monotonic-to-wall conversion, not the BMC (it is seconds late)
        if seen_off < bmc_off - timedelta(seconds=0.1):
            problems.append(
                f"OFF recorded from a read at {seen_off}, before the BMC switched Off at {bmc_off}"
            )
        summary |= {"bmc_off_at": bmc_off.isoformat(), "off_read_at": seen_off.isoformat()}
    return problems, summary


def check_wake(
    intent: dict[str, Any], container: dict[str, Any], took_over_at: datetime
) -> tuple[list[str], dict[str, Any]]:
    """The wake: Succeeded with On and ready confirmed; On confirmed by a read taken after
    the new leader acquired the Lease at `took_over_at` (the killed one sent the request:
    the new one resumed and confirmed); admission opened only after On and ready were
    observed; the container started only after admission opened."""
    status = intent.get("status") or {}
    record = status.get("safetyRecord") or {}
    confirmation = record.get("confirmation") or {}
    reasons = set(status.get("reasons", []))
    confirmed = {"POWER_ON_CONFIRMED", "READY_CONFIRMED"} <= reasons
    problems = []
    if status.get("phase") != "Succeeded" or not confirmed:
        problems.append(f"phase {status.get('phase')} reasons {sorted(reasons)}")
    if not (confirmation.get("confirmed") is True and confirmation.get("observed") == "On"):
        problems.append(f"confirmation {confirmation}")
    if record.get("readiness") != "Ready":
        problems.append(f"readiness {record.get('readiness')}")
    summary: dict[str, Any] = {"intent": intent["metadata"]["name"], "reasons": sorted(reasons)}
    try:
        opened = parse_time(record["drain"]["admissionSince"])
        on_seen = parse_time(confirmation["observedAt"])
        ready_seen = parse_time(record["readyProbe"]["observedAt"])
        started = parse_time(container["status"]["startedAt"])
    except (KeyError, TypeError) as exc:
        return [*problems, f"the record or the container lacks a time: {exc}"], summary
    if opened < on_seen or opened < ready_seen:
        problems.append(
            f"admission opened {opened}, before On ({on_seen}) or ready ({ready_seen}) was observed"
        )
    if on_seen < took_over_at:
        problems.append(
            f"On was confirmed at {on_seen}, before the new leader took over at {took_over_at}"
        )
    if started < opened:
        problems.append(f"the container started at {started}, before admission opened")
    summary |= {
        "new_leader_at": took_over_at.isoformat(),
        "on_read_at": on_seen.isoformat(),
        "ready_probe_at": ready_seen.isoformat(),
        "admission_opened_at": opened.isoformat(),
        "container_started_at": started.isoformat(),
    }
    return problems, summary
