"""The capacity ledger against the real peers (issue 19): a takeover with Locked
containers above a node's capacity starts only what fits and adopts what runs; what a
container holds is snapshotted and shown, and cannot be edited while it is held; the
overcommit alert under promtool."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from clusterkit import ClusterHandle, wait_for
from dispatchkit import DispatchEnv, apply_many, container
from localcluster import REPO, binaries_dir

pytestmark = pytest.mark.cluster

RUN, FITS = 60.0, 3.0
"""Run times (stub runner) of the container the old leader started (it outlives the test)
and of the lock that fits beside it."""


def _status(env: DispatchEnv, name: str, status: dict[str, Any]) -> None:
    env.cluster.kubectl(
        "-n", env.namespace, "patch", "cd", name, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": status}),
    )  # fmt: skip


def _get(env: DispatchEnv, name: str) -> dict[str, Any]:
    return env.cluster.get_json(env.namespace, "cd", name)  # type: ignore[no-any-return]


@pytest.fixture
def env(cluster: ClusterHandle, namespace: str, tmp_path: Path) -> Iterator[DispatchEnv]:
    e = DispatchEnv.create(
        cluster, namespace, tmp_path, policy={"maxNodes": 1, "idleThreshold": "1h"}
    )
    yield e
    e.close()


def test_a_takeover_above_capacity_starts_only_what_fits_and_adopts_what_runs(
    env: DispatchEnv,
) -> None:
    # the old leader runs `run` on a small node (2 vCPUs) and dies before writing Running
    first = env.start_operator(name="old-leader")
    apply_many(env, [container("run", 1, vcpus=1, ram="256Mi", duration=RUN)])
    wait_for(lambda: env.phases().get("run") == "Running", timeout=90, what="run Running")
    first.stop(signal.SIGKILL)
    node, pid = (_get(env, "run")["status"][k] for k in ("node", "runnerPid"))
    _status(env, "run", {"phase": "Locked", "attempts": 0, "runnerPid": None, "startedAt": None})
    # ... and had locked two more there, whose runners never started: one vCPU left
    apply_many(
        env,
        [
            container("fits", 2, vcpus=1, ram="256Mi", duration=FITS, priority=600),
            container("over", 3, vcpus=1, ram="256Mi", duration=1, priority=400),
        ],
    )
    for name in ("fits", "over"):
        _status(env, name, {"phase": "Locked", "node": node, "lockedBy": "disp", "attempts": 0})

    env.start_operator(name="new-leader")
    env.wait_phases({"run": "Running", "fits": "Complete", "over": "Complete"}, timeout=90)
    got = {c["metadata"]["name"]: c["status"] for c in env.containers()}
    assert (got["run"]["reason"], got["run"]["runnerPid"]) == ("Adopted", pid)
    assert all(s["node"] == node and s["attempts"] == 1 for s in got.values()), got
    assert got["over"]["lockFlaps"] == 1  # unlocked once (reason Overflow), then placed again
    assert got["run"].get("lockFlaps", 0) == got["fits"].get("lockFlaps", 0) == 0

    # the runners' own record (the stub's clock): each container ran once; `over` started
    # only once `fits` had ended, never as a third vCPU on the 2-vCPU node
    uuids = {f"zzzzz-dz642-{i:015d}": name for i, name in ((1, "run"), (2, "fits"), (3, "over"))}
    runs = [r for r in env.stub.admin.runs() if r["uuid"] in uuids]
    assert sorted(uuids[r["uuid"]] for r in runs) == ["fits", "over", "run"], runs
    start = {uuids[r["uuid"]]: float(r["startedAt"]) for r in runs}
    assert start["over"] >= start["fits"] + FITS - 0.5, start


def test_resources_are_snapshotted_shown_and_frozen_while_held(
    cluster: ClusterHandle, namespace: str
) -> None:
    cd = container("held", 9, vcpus=2, ram="3Gi", gpus=0)
    cluster.kubectl("-n", namespace, "create", "-f", "-", input=json.dumps(cd))

    def edit(vcpus: int) -> subprocess.CompletedProcess[str]:
        patch = {"spec": {"resources": {"vcpus": vcpus}}}
        return cluster.kubectl(
            "-n", namespace, "patch", "cd", "held", "--type=merge", "-p", json.dumps(patch),
            check=False,
        )  # fmt: skip

    assert edit(3).returncode == 0  # Queued: it holds nothing, an edit is planned again
    snapshot = {"vcpus": 3, "ram": "3Gi", "scratch": "0", "gpus": 0, "preemptible": False}
    status = {"phase": "Running", "node": "vm-1", "resources": snapshot}
    cluster.kubectl(
        "-n", namespace, "patch", "cd", "held", "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": status}),
    )  # fmt: skip
    refused = edit(1)
    assert refused.returncode != 0
    assert "spec.resources cannot change while the container is Locked or Running" in (
        refused.stderr
    )
    priority = {"spec": {"priority": 900}}  # other fields stay editable
    cluster.kubectl(
        "-n", namespace, "patch", "cd", "held", "--type=merge", "-p", json.dumps(priority)
    )
    wide = cluster.kubectl("-n", namespace, "get", "cd", "held", "-o", "wide").stdout
    header, row = wide.strip().splitlines()
    names = header.split()
    at = [header.index(n) for n in names]
    cells = {n: row[a:b].strip() for n, a, b in zip(names, at, [*at[1:], None], strict=True)}
    assert (cells["HELD-CPUS"], cells["HELD-RAM"], cells["HELD-GPUS"]) == ("3", "3Gi", "0"), wide


def test_the_overcommit_alert_fires_for_its_release_only(tmp_path: Path) -> None:
    out = subprocess.run(
        [str(binaries_dir() / "helm"), "template", "a", str(REPO / "helm" / "nodewarden"),
         "--namespace", "ns1", "--set", "image.repository=registry.example.org/nodewarden",
         "--set", "alerts.enabled=true"],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    (rules,) = [d for d in yaml.safe_load_all(out.stdout) if d and d["kind"] == "PrometheusRule"]
    mine = 'namespace="ns1", job="a-nodewarden-metrics"'
    other = 'namespace="ns2", job="b-nodewarden-metrics"'
    series = [
        {"series": f'nodewarden_overcommitted_nodes{{{mine}, pod="p0"}}', "values": "0 2 2 2 0"},
        {"series": f'nodewarden_overcommitted_nodes{{{mine}, pod="p1"}}', "values": "0x4"},
        {"series": f"nodewarden_overcommitted_nodes{{{other}}}", "values": "5x4"},
    ]
    firing = {
        "exp_labels": {"severity": "critical", "namespace": "ns1", "release": "a"},
        "exp_annotations": {
            "summary": "2 WorkerNode(s) run more containers than they hold",
            "description": next(
                r["annotations"]["description"]
                for g in rules["spec"]["groups"]
                for r in g["rules"]
                if r["alert"] == "NodewardenNodeOvercommitted"
            ).replace("{{ $labels.namespace }}", "ns1"),
        },
    }
    cases = [
        {"eval_time": "1m", "alertname": "NodewardenNodeOvercommitted", "exp_alerts": []},
        {"eval_time": "2m", "alertname": "NodewardenNodeOvercommitted", "exp_alerts": [firing]},
        {"eval_time": "4m", "alertname": "NodewardenNodeOvercommitted", "exp_alerts": []},
    ]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules["spec"]))
    tests = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": cases}],
    }
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests, width=1000))
    for args in (["check", "rules", "rules.yaml"], ["test", "rules", "tests.yaml"]):
        done = subprocess.run(
            ["promtool", *args], capture_output=True, text=True, check=False, cwd=tmp_path
        )
        assert done.returncode == 0, done.stdout + done.stderr
