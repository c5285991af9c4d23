"""The CRDs on the real kube-apiserver: established, examples accepted, nonsense rejected."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from clusterkit import ClusterHandle, wait_for
from localcluster import REPO
from nodewarden.api.powerpolicy import PowerPolicySpec

pytestmark = pytest.mark.cluster

EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


def test_all_four_crds_established(cluster: ClusterHandle) -> None:
    crds = json.loads(
        cluster.kubectl(
            "get", "crd", "-l", "app.kubernetes.io/part-of=nodewarden", "-o", "json"
        ).stdout
    )["items"]
    names = {c["metadata"]["name"] for c in crds}
    assert names == {
        "workernodes.nodewarden.io",
        "containerdispatches.nodewarden.io",
        "powerintents.nodewarden.io",
        "powerpolicies.nodewarden.io",
    }
    for crd in crds:
        conds = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
        assert conds.get("Established") == "True", crd["metadata"]["name"]
        assert conds.get("NamesAccepted") == "True", crd["metadata"]["name"]
        names_spec = crd["spec"]["names"]
        assert "nodewarden" in names_spec["categories"]


@pytest.mark.parametrize("short", ["wn", "cd", "pi", "pp", "nodewarden"])
def test_short_names_and_category_resolve(
    cluster: ClusterHandle, namespace: str, short: str
) -> None:
    out = cluster.kubectl("-n", namespace, "get", short)
    assert out.returncode == 0


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_every_example_is_accepted(cluster: ClusterHandle, namespace: str, path: Path) -> None:
    out = cluster.kubectl("-n", namespace, "apply", "--validate=strict", "-f", str(path))
    assert "created" in out.stdout
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    for doc in docs:
        kind = doc["kind"].lower()
        got = cluster.get_json(namespace, kind, doc["metadata"]["name"])
        assert got["metadata"]["name"] == doc["metadata"]["name"]


def _obj(kind: str, spec: dict[str, Any] | None, name: str = "bad") -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "nodewarden.io/v1alpha1",
        "kind": kind,
        "metadata": {"name": name},
    }
    if spec is not None:
        obj["spec"] = spec
    return obj


CLOUD_NODE = {"nodeType": "CloudVM", "instanceType": "m5.large"}
SIDE_NODE = {
    "nodeType": "SideNode",
    "controlMethod": "WakeOnLan",
    "wakeOnLan": {"mac": "3c:ec:ef:12:34:56"},
    "capacity": {"vcpus": 8, "ram": "32Gi"},
}
REDFISH = {
    "endpoint": "https://bmc.example",
    "usernameSecretRef": {"name": "s", "key": "u"},
    "passwordSecretRef": {"name": "s", "key": "p"},
}
CONTAINER = {"uuid": "zzzzz-dz642-aaaaaaaaaaaaaaa"}
INTENT = {"nodeName": "n1", "action": "Shutdown"}


def _with(base: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(base)
    cur = out
    keys = path.split(".")
    for key in keys[:-1]:
        cur = cur.setdefault(key, {})
    if value is _DELETE:
        cur.pop(keys[-1], None)
    else:
        cur[keys[-1]] = value
    return out


_DELETE = object()

# (id, object, text that must appear in the error: the field path or the rule message)
INVALID: list[tuple[str, dict[str, Any], str]] = [
    (
        "wn-bad-enum-nodeType",
        _obj("WorkerNode", _with(CLOUD_NODE, "nodeType", "Laptop")),
        "spec.nodeType",
    ),
    (
        "wn-bad-enum-idleBehavior",
        _obj("WorkerNode", _with(CLOUD_NODE, "idleBehavior", "sleep")),
        "spec.idleBehavior",
    ),
    ("wn-bad-enum-power", _obj("WorkerNode", _with(CLOUD_NODE, "power", "Maybe")), "spec.power"),
    (
        "wn-malformed-mac",
        _obj("WorkerNode", _with(SIDE_NODE, "wakeOnLan.mac", "3c:ec:ef:12:34")),
        "spec.wakeOnLan.mac",
    ),
    (
        "wn-missing-nodeType",
        _obj("WorkerNode", _with(CLOUD_NODE, "nodeType", _DELETE)),
        "spec.nodeType",
    ),
    ("wn-missing-spec", _obj("WorkerNode", None), "spec"),
    (
        "wn-redfish-without-bmc",
        _obj("WorkerNode", _with(SIDE_NODE, "controlMethod", "Redfish")),
        "spec.bmc",
    ),
    (
        "wn-bmc-plain-http",
        _obj(
            "WorkerNode",
            _with(
                _with(SIDE_NODE, "controlMethod", "Redfish"),
                "bmc",
                {**REDFISH, "endpoint": "http://bmc.example"},
            ),
        ),
        "spec.bmc.endpoint",
    ),
    (
        "wn-cloud-without-instanceType",
        _obj("WorkerNode", _with(CLOUD_NODE, "instanceType", _DELETE)),
        "spec.instanceType",
    ),
    (
        "wn-side-with-cloud-control",
        _obj("WorkerNode", _with(SIDE_NODE, "controlMethod", "Cloud")),
        "spec.controlMethod",
    ),
    ("wn-unknown-field", _obj("WorkerNode", _with(CLOUD_NODE, "colour", "blue")), "spec.colour"),
    (
        "wn-ssh-port-range",
        _obj("WorkerNode", _with(CLOUD_NODE, "ssh", {"port": 70000})),
        "spec.ssh.port",
    ),
    (
        "wn-bad-quantity",
        _obj("WorkerNode", _with(SIDE_NODE, "capacity.ram", "lots")),
        "spec.capacity.ram",
    ),
    (
        "wn-side-without-capacity",
        _obj("WorkerNode", _with(SIDE_NODE, "capacity", _DELETE)),
        "spec.capacity",
    ),
    ("pp-negative-duration", _obj("PowerPolicy", {"minOn": "-5m"}), "spec.minOn"),
    (
        "pp-duration-words",
        _obj("PowerPolicy", {"idleThreshold": "10 minutes"}),
        "spec.idleThreshold",
    ),
    (
        "pp-minOn-above-maxOn",
        _obj("PowerPolicy", {"minOn": "2h", "maxOn": "1h"}),
        "minOn must not exceed maxOn",
    ),
    (
        "pp-backoff-min-above-max",
        _obj("PowerPolicy", {"retry": {"initialBackoff": "10m", "maxBackoff": "1m"}}),
        "spec.retry.initialBackoff",
    ),
    (
        "pp-billing-window-inverted",
        _obj(
            "PowerPolicy", {"billing": {"period": "1h", "windowStart": "55m", "windowEnd": "50m"}}
        ),
        "spec.billing.windowStart",
    ),
    (
        "pp-billing-window-past-period",
        _obj("PowerPolicy", {"billing": {"period": "1h", "windowStart": "50m", "windowEnd": "2h"}}),
        "spec.billing.windowEnd",
    ),
    (
        "pp-minWarm-above-maxNodes",
        _obj("PowerPolicy", {"maxNodes": 2, "minWarmNodes": 5}),
        "spec.minWarmNodes",
    ),
    ("pp-jitter-range", _obj("PowerPolicy", {"retry": {"jitter": 1.5}}), "spec.retry.jitter"),
    (
        "pp-bad-action",
        _obj("PowerPolicy", {"allowedActions": ["Explode"]}),
        "spec.allowedActions[0]",
    ),
    (
        "pp-negative-budget",
        _obj("PowerPolicy", {"disruptionBudget": {"maxConcurrentTransitions": -1}}),
        "spec.disruptionBudget.maxConcurrentTransitions",
    ),
    ("cd-missing-uuid", _obj("ContainerDispatch", {"priority": 1}), "spec.uuid"),
    ("cd-malformed-uuid", _obj("ContainerDispatch", {"uuid": "not-a-uuid"}), "spec.uuid"),
    (
        "cd-priority-range",
        _obj("ContainerDispatch", {**CONTAINER, "priority": 5000}),
        "spec.priority",
    ),
    (
        "cd-zero-vcpus",
        _obj("ContainerDispatch", {**CONTAINER, "resources": {"vcpus": 0}}),
        "spec.resources.vcpus",
    ),
    (
        "cd-negative-ram",
        _obj("ContainerDispatch", {**CONTAINER, "resources": {"ram": "-4Gi"}}),
        "spec.resources.ram",
    ),
    ("pi-bad-action", _obj("PowerIntent", {**INTENT, "action": "Explode"}), "spec.action"),
    ("pi-missing-node", _obj("PowerIntent", {"action": "Wake"}), "spec.nodeName"),
    (
        "pi-override-on-policy-intent",
        _obj(
            "PowerIntent",
            {
                **INTENT,
                "source": "Policy",
                "override": {"inhibitors": True, "justification": "maintenance window agreed"},
            },
        ),
        "spec.override",
    ),
    (
        "pp-duplicate-node-class",
        _obj(
            "PowerPolicy",
            {"nodeClasses": [{"name": "a", "nodeType": "SideNode"}] * 2},
        ),
        "every class name must be unique",
    ),
    (
        "pp-window-of-no-class",
        _obj(
            "PowerPolicy",
            {
                "warmCapacity": {
                    "windows": [
                        {
                            "name": "w",
                            "nodeClass": "a100",
                            "minWarm": 1,
                            "start": "08:00",
                            "end": "20:00",
                        }
                    ]
                }
            },
        ),
        "every nodeClass must name a spec.nodeClasses entry",
    ),
    (
        "pp-window-start-is-end",
        _obj(
            "PowerPolicy",
            {
                "nodeClasses": [{"name": "a", "nodeType": "SideNode"}],
                "warmCapacity": {
                    "windows": [
                        {
                            "name": "w",
                            "nodeClass": "a",
                            "minWarm": 1,
                            "start": "08:00",
                            "end": "08:00",
                        }
                    ]
                },
            },
        ),
        "start and end must differ",
    ),
    (
        "pp-cloud-class-without-type",
        _obj("PowerPolicy", {"nodeClasses": [{"name": "a", "nodeType": "CloudVM"}]}),
        "names its instanceType",
    ),
    (
        "pp-forecast-confidence-out-of-range",
        _obj("PowerPolicy", {"forecastWake": {"confidence": 1.5}}),
        "spec.forecastWake.confidence",
    ),
    (
        "pi-override-short-justification",
        _obj("PowerIntent", {**INTENT, "override": {"inhibitors": True, "justification": "x"}}),
        "spec.override.justification",
    ),
]


def test_invalid_table_is_big_enough() -> None:
    assert len(INVALID) >= 20


@pytest.mark.parametrize(
    "obj,needle", [(o, n) for _, o, n in INVALID], ids=[i for i, _, _ in INVALID]
)
def test_invalid_object_rejected_naming_the_field(
    cluster: ClusterHandle, namespace: str, obj: dict[str, Any], needle: str
) -> None:
    out = cluster.kubectl(
        "-n",
        namespace,
        "create",
        "--validate=strict",
        "-f",
        "-",
        input=json.dumps(obj),
        check=False,
    )
    assert out.returncode != 0, f"accepted: {json.dumps(obj)}"
    assert needle in out.stderr, out.stderr
    # and nothing was stored
    got = cluster.kubectl(
        "-n", namespace, "get", obj["kind"].lower(), obj["metadata"]["name"], check=False
    )
    assert got.returncode != 0


def test_powerintent_spec_is_immutable(cluster: ClusterHandle, namespace: str) -> None:
    intent = _obj("PowerIntent", INTENT, name="pi1")
    cluster.kubectl("-n", namespace, "create", "-f", "-", input=json.dumps(intent))
    edited = _with(intent, "spec.action", "Wake")
    out = cluster.kubectl(
        "-n", namespace, "apply", "-f", "-", input=json.dumps(edited), check=False
    )
    assert out.returncode != 0
    assert "PowerIntent spec is immutable" in out.stderr
    stored = cluster.get_json(namespace, "pi", "pi1")
    assert stored["spec"]["action"] == "Shutdown"


def test_container_uuid_is_immutable(cluster: ClusterHandle, namespace: str) -> None:
    cd = _obj("ContainerDispatch", CONTAINER, name="cd1")
    cluster.kubectl("-n", namespace, "create", "-f", "-", input=json.dumps(cd))
    out = cluster.kubectl(
        "-n",
        namespace,
        "patch",
        "cd",
        "cd1",
        "--type=merge",
        "-p",
        json.dumps({"spec": {"uuid": "zzzzz-dz642-bbbbbbbbbbbbbbb"}}),
        check=False,
    )
    assert out.returncode != 0
    assert "spec.uuid is immutable" in out.stderr


def test_policy_defaults_are_filled_by_the_apiserver(
    cluster: ClusterHandle, namespace: str
) -> None:
    cluster.kubectl(
        "-n", namespace, "create", "-f", "-", input=json.dumps(_obj("PowerPolicy", {}, "p"))
    )
    spec = cluster.get_json(namespace, "pp", "p")["spec"]
    # the API server fills exactly the defaults the operator's own model has
    model = PowerPolicySpec().model_dump(mode="json", by_alias=True)
    assert spec["idleThreshold"] == model["idleThreshold"] == "5m"
    assert spec["billing"] == model["billing"]
    assert spec["billing"] == {"period": "0s", "windowStart": "50m", "windowEnd": "1h"}
    assert spec["disruptionBudget"] == model["disruptionBudget"]
    assert spec["retry"]["budget"] == 3
    assert "ForceOff" not in spec["allowedActions"]


def test_printer_columns_show_status_values(cluster: ClusterHandle, namespace: str) -> None:
    cluster.kubectl(
        "-n",
        namespace,
        "create",
        "-f",
        "-",
        input=json.dumps(_obj("WorkerNode", CLOUD_NODE, "vm1")),
    )
    status = {
        "status": {
            "state": "Active",
            "observedPower": "On",
            "readiness": "Ready",
            "runningContainers": 3,
            "hourlyPrice": 0.096,
            "idleSince": "2026-01-01T00:00:00Z",
            "instanceId": "i-0abc",
        }
    }
    cluster.kubectl(
        "-n",
        namespace,
        "patch",
        "wn",
        "vm1",
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps(status),
    )
    out = cluster.kubectl("-n", namespace, "get", "wn", "vm1").stdout
    header, row = out.strip().splitlines()
    for column in [
        "NAME",
        "STATE",
        "TYPE",
        "POWER",
        "READY",
        "CONTAINERS",
        "PRICE/H",
        "IDLE-FOR",
        "AGE",
    ]:
        assert column in header.split(), header
    cells = row.split()
    assert cells[:7] == ["vm1", "Active", "m5.large", "On", "Ready", "3", "0.096"], row
    assert cells[7].endswith("d")  # idle since January: days
    wide = cluster.kubectl("-n", namespace, "get", "wn", "vm1", "-o", "wide").stdout
    assert "i-0abc" in wide and "CloudVM" in wide


@pytest.mark.parametrize(
    "field,needle",
    [
        ("workernode.spec.idleBehavior", "hold: accept no new work"),
        ("workernode.spec.bmc.passwordSecretRef", "never logged"),
        ("workernode.status.observedPower", "trusted source"),
        ("powerpolicy.spec.telemetryMaxAge", "stale"),
        ("containerdispatch.spec.resources.preemptible", "matched exactly"),
        ("powerintent.spec", "Immutable"),
    ],
)
def test_kubectl_explain_shows_descriptions(
    cluster: ClusterHandle, field: str, needle: str
) -> None:
    def explained() -> str | None:
        out = cluster.kubectl("explain", field, check=False)
        return out.stdout if out.returncode == 0 else None

    text = wait_for(explained, timeout=30, what=f"kubectl explain {field}")
    assert needle in " ".join(text.split()), text  # kubectl wraps long lines
