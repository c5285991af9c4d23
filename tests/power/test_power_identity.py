"""Issue 20, item 2, on the real control plane: one machine, one BMC.

An attacker (a ServiceAccount that may write WorkerNodes but not read Secrets) copies its
own idle node's `ssh` block and aims `bmc` at machines that are not its own, then asks for
`power: Off`:

- a second WorkerNode on a BMC another node holds (spelled differently: trailing
  `/redfish/v1/`, an explicit systemId) is refused (`Valid=False BmcClaimed`, naming the
  holder; `nodewarden_bmc_claimed_twice` for the alert), the holder keeps serving;
- a WorkerNode whose SSH host reports another DMI product UUID than the BMC's system: the
  shutdown BLOCKs with IDENTITY_MISMATCH and no reset reaches that BMC (its request log);
- editing the BMC endpoint of an enrolled node is refused at admission.

The nodes the attacker aims at are side-node doubles whose hosts report their own BMC's
UUID; the Safety Record of a real shutdown carries the match as evidence.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from clusterkit import ClusterHandle, wait_for
from powerkit import PowerEnv, side_node_entry

pytestmark = [pytest.mark.cluster]

ATTACKER = "node-author"


@pytest.fixture
def env(cluster: ClusterHandle, namespace: str, tmp_path: Path) -> Iterator[PowerEnv]:
    nodes = [side_node_entry(n) for n in ("victim", "mine", "spare")]
    specs = {"victim": {"power": "On"}, "mine": {"power": "On"}, "spare": {"power": "On"}}
    env = PowerEnv.create(cluster, namespace, tmp_path, nodes, node_specs=specs)
    # the attacker may write WorkerNodes, not read Secrets
    cluster.kubectl("-n", namespace, "create", "serviceaccount", ATTACKER)
    cluster.kubectl(
        "-n", namespace, "create", "role", "wn-author",
        "--verb=get,list,watch,create,update,patch", "--resource=workernodes.nodewarden.io",
    )  # fmt: skip
    cluster.kubectl(
        "-n", namespace, "create", "rolebinding", "wn-author", "--role=wn-author",
        f"--serviceaccount={namespace}:{ATTACKER}",
    )  # fmt: skip
    try:
        yield env
    finally:
        env.close()


def as_attacker(env: PowerEnv, *args: str, **kw: Any) -> Any:
    user = f"--as=system:serviceaccount:{env.namespace}:{ATTACKER}"
    return env.cluster.kubectl("-n", env.namespace, user, *args, **kw)


def condition(env: PowerEnv, name: str, kind: str) -> dict[str, Any]:
    conds = env.status(name).get("conditions") or []
    return next((c for c in conds if c["type"] == kind), {})


def test_one_machine_one_bmc(env: PowerEnv) -> None:
    assert "forbidden" in as_attacker(env, "get", "secret", "side-bmc", check=False).stderr
    op = env.start_operator()
    victim_bmc = env.side.node_info("victim")["power"]["endpoint"]
    for name in ("victim", "mine", "spare"):
        enrolment = wait_for(
            lambda name=name: (
                (env.status(name).get("enrolment") or {}).get("verifiedAt")
                and env.status(name)["enrolment"]
            ),
            timeout=60,
            what=f"{name} enrolled with a verified match",
        )
        assert enrolment["bmcUuid"] == enrolment["hostUuid"]
        assert enrolment["hostUuid"] == env.side.node_info(name)["product_uuid"]
    # the spare machine's WorkerNode goes: its BMC is nobody's now
    env.cluster.kubectl("-n", env.namespace, "delete", "wn", "spare")

    # -- a second WorkerNode on the victim's BMC, spelled differently -------------------
    copycat = env.worker_node("mine", power="Off")
    copycat["metadata"]["name"] = "copycat"
    copycat["spec"]["bmc"]["endpoint"] = victim_bmc.rstrip("/") + "/redfish/v1/"
    copycat["spec"]["bmc"]["systemId"] = "1"
    as_attacker(env, "create", "-f", "-", input=json.dumps(copycat))
    valid = wait_for(
        lambda: (c := condition(env, "copycat", "Valid")) and c.get("status") == "False" and c,
        timeout=30,
        what="copycat refused",
    )
    assert valid["reason"] == "BmcClaimed" and "'victim'" in valid["message"], valid
    metrics = op.get("/metrics")[1]
    assert "nodewarden_bmc_claimed_twice 1.0" in metrics
    # the holder keeps serving: valid, its power source answering
    assert condition(env, "victim", "Valid").get("status") == "True"
    wait_for(
        lambda: condition(env, "victim", "PowerSource").get("status") == "True",
        timeout=30,
        what="victim's BMC still read",
    )

    # -- an unclaimed BMC of another machine, with my own idle host's ssh block ----------
    hijack = env.worker_node("mine", power="Off")
    hijack["metadata"]["name"] = "hijack"
    hijack["spec"]["bmc"] = env.worker_node("spare")["spec"]["bmc"]
    as_attacker(env, "create", "-f", "-", input=json.dumps(hijack))
    blocked = wait_for(
        lambda: (
            "IDENTITY_MISMATCH"
            in ((env.status("hijack").get("lastSafetyRecord") or {}).get("reasons") or [])
            and env.status("hijack")["lastSafetyRecord"]
        ),
        timeout=60,
        what="hijack's shutdown blocked by the UUID mismatch",
    )
    assert blocked["decision"] == "BLOCK", blocked
    enrolment = env.status("hijack")["enrolment"]
    assert enrolment["bmcUuid"] != enrolment["hostUuid"] and "verifiedAt" not in enrolment
    assert env.resets("spare") == [] and env.resets("victim") == []  # nothing reached a BMC

    # -- the enrolled node's BMC cannot be re-aimed -------------------------------------
    edit = as_attacker(
        env, "patch", "wn", "mine", "--type=merge",
        "-p", json.dumps({"spec": {"bmc": {"endpoint": victim_bmc + "/"}}}), check=False,
    )  # fmt: skip
    assert edit.returncode != 0 and "cannot change: one machine, one BMC" in edit.stderr
    assert env.node("mine")["spec"]["bmc"]["endpoint"] != victim_bmc + "/"
