"""The pure parts of `nodewarden check`: verdicts, digests, reviews, report and exit codes.

Also: the README names the same supported Kubernetes range as the code, and the
dispatcher's expected write conflicts are counted and logged at DEBUG, not INFO.
"""

from __future__ import annotations

import asyncio
import logging
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from nodewarden.api.kinds import ALL_KINDS
from nodewarden.check import crds, kubeapi, lease, policies, rbac
from nodewarden.check.render import render_json, render_table
from nodewarden.check.result import CheckResult, Report, Status, failed, passed, warned
from nodewarden.config import OperatorConfig
from nodewarden.dispatch.queue import LEGACY_FINALIZER, ContainerQueue
from nodewarden.kube.client import Conflict
from nodewarden.kube.permissions import REQUIRED_PERMISSIONS
from nodewarden.metrics import KUBE_CONFLICTS

README = Path(__file__).resolve().parents[2] / "README.md"
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


# --- version and clock ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "status"),
    [
        ("v1.34.9", Status.FAIL),
        ("v1.35.0", Status.PASS),
        ("v1.37.2", Status.PASS),
        ("v1.37.2-eks-1a2b3c", Status.PASS),
        ("v1.38.0", Status.WARN),
        ("dev", Status.WARN),
    ],
)
def test_the_server_version_is_held_against_the_supported_range(
    version: str, status: Status
) -> None:
    result = kubeapi.version_result(version)
    assert result.status is status, result
    if status is Status.FAIL:
        assert "upgrade the cluster to 1.35" in result.fix


def test_the_readme_lists_the_supported_range() -> None:
    (lo_major, lo_minor), (hi_major, hi_minor) = kubeapi.SUPPORTED
    text = README.read_text()
    assert re.search(
        rf"Supported Kubernetes versions: {lo_major}\.{lo_minor}\s*(\u2013|-|to)\s*{hi_major}\.{hi_minor}",
        text,
    ), "README must state the range kubeapi.SUPPORTED checks"


@pytest.mark.parametrize(
    ("skew", "uncertainty", "status"),
    [(0.3, 0.5, Status.PASS), (-2.0, 0.5, Status.PASS), (4.0, 0.5, Status.WARN),
     (-30.0, 0.5, Status.FAIL), (120.0, 0.6, Status.FAIL), (6.0, 2.0, Status.WARN)],
)  # fmt: skip
def test_clock_skew_counts_the_uncertainty(skew: float, uncertainty: float, status: Status) -> None:
    result = kubeapi.skew_result(skew, uncertainty)
    assert result.status is status, result
    if status is not Status.PASS:
        assert ("ahead of" if skew > 0 else "behind") in result.message
        assert "chrony" in result.fix


def test_the_clock_offset_variable_must_be_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(kubeapi.CLOCK_OFFSET_ENV, "-90.5")
    assert kubeapi.clock_offset() == -90.5
    monkeypatch.setenv(kubeapi.CLOCK_OFFSET_ENV, "soon")
    with pytest.raises(ValueError, match=kubeapi.CLOCK_OFFSET_ENV):
        kubeapi.clock_offset()


# --- CRDs ------------------------------------------------------------------------------------


def test_the_schema_digest_ignores_key_order_and_integral_floats() -> None:
    a = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}}
    b = {"properties": {"n": {"minimum": 0.0, "type": "integer"}}, "type": "object"}
    c = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}}}
    assert crds.schema_digest(a) == crds.schema_digest(b) != crds.schema_digest(c)


def test_discovery_names_missing_crds_and_subresources() -> None:
    [none] = crds.discovery_results(None)
    assert none.status is Status.FAIL and "not installed" in none.message
    assert "kubectl apply --server-side -f crds/" in none.fix
    [other] = crds.discovery_results(None, ["v1alpha0"])
    assert "only at v1alpha0" in other.message and "this nodewarden release" in other.fix
    served = {k.plural for k in ALL_KINDS} | {f"{k.plural}/status" for k in ALL_KINDS}
    assert crds.discovery_results(served) == []
    [missing, no_status] = crds.discovery_results(
        served - {"powerintents", "powerintents/status", "workernodes/status"}
    )
    assert "powerintents.nodewarden.io" in missing.message
    assert "workernodes.nodewarden.io" in no_status.message


def test_schemas_are_compared_or_the_reason_is_given() -> None:
    expected = crds.expected_digests()
    same = {n: crds.ServedCrd(n, d, ("v1alpha1",)) for n, d in expected.items()}
    [ok] = crds.schema_results(expected, same)
    assert ok.status is Status.PASS
    name = next(iter(expected))
    changed = {**same, name: crds.ServedCrd(name, "0123456789ab", ("v1alpha0", "v1alpha1"))}
    differ, storage = crds.schema_results(expected, changed)
    assert differ.status is Status.FAIL and name in differ.message
    assert storage.status is Status.WARN and "v1alpha0" in storage.message
    unreadable = {n: "GET customresourcedefinitions/x: HTTP 403 Forbidden" for n in expected}
    [warn] = crds.schema_results(expected, unreadable)
    assert warn.status is Status.WARN and "could not be compared" in warn.message


# --- RBAC ------------------------------------------------------------------------------------


def test_reviews_cover_the_permission_table_with_the_lease_filled_in() -> None:
    config = OperatorConfig(dispatcher_id="east")
    asked = rbac.reviews(config, "nw")
    assert len(asked) == sum(
        len(p.verbs) * max(1, len(p.resource_names)) for p in REQUIRED_PERMISSIONS
    )
    lease_reviews = {r.verb: r.name for r in asked if r.resource == "leases"}
    assert lease_reviews == {"create": "", "get": "nodewarden-east", "update": "nodewarden-east"}
    status = [r for r in asked if r.subresource == "status"]
    assert status and all(r.verb == "patch" for r in status)
    per_secret = rbac.reviews(config, "nw", secret_names=["b", "a"])
    assert [r.name for r in per_secret if r.resource == "secrets"] == ["a", "b"]


def test_the_rbac_line_lists_what_is_missing() -> None:
    missing = [rbac.Review("nodewarden.io", "powerintents", "", "delete", "nw")]
    result = rbac.rbac_result("ServiceAccount nw/op", missing, 30)
    assert result.status is Status.FAIL
    assert (
        "lacks 1 of 30" in result.message and "delete powerintents.nodewarden.io" in result.message
    )
    assert rbac.rbac_result("x", [], 30).status is Status.PASS


# --- lease and policies ------------------------------------------------------------------------


def test_the_lease_line_tells_holder_age_and_staleness() -> None:
    fresh = {
        "holderIdentity": "pod-a",
        "renewTime": NOW - timedelta(seconds=3),
        "leaseDurationSeconds": 15,
    }
    stale = {**fresh, "renewTime": (NOW - timedelta(seconds=300)).isoformat()}
    assert lease.lease_result(fresh, "l", "nw", NOW, True).status is Status.PASS
    assert (
        "held by pod-a, renewed 3s ago" in lease.lease_result(fresh, "l", "nw", NOW, True).message
    )
    assert "300s ago" in lease.lease_result(stale, "l", "nw", NOW, True).message
    assert lease.lease_result(None, "l", "nw", NOW, True).status is Status.WARN
    assert "free" in lease.lease_result({"holderIdentity": ""}, "l", "nw", NOW, True).message
    assert "disabled" in lease.lease_result(None, "l", "nw", NOW, False).message


def _policy(name: str, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": spec}


def test_policies_invalid_missing_default_and_dangling_references() -> None:
    from nodewarden.api.workernode import WorkerNodeSpec
    from nodewarden.check.nodes import Node

    node = Node(
        "vm",
        WorkerNodeSpec.model_validate(
            {"nodeType": "CloudVM", "instanceType": "m5", "policyRef": {"name": "gone"}}
        ),
        None,
    )
    out = policies.policy_results(
        [_policy("fine"), _policy("zero", idleThreshold="0s")], [node], "default", "nw"
    )
    by_status = {r.status: [x.message for x in out if x.status is r.status] for r in out}
    assert by_status[Status.PASS] == ["1 PowerPolicy valid"]
    assert any("PowerPolicy zero: spec.idleThreshold" in m for m in by_status[Status.FAIL])
    assert any("WorkerNode vm: spec.policyRef.name 'gone'" in m for m in by_status[Status.FAIL])
    assert any("no PowerPolicy 'default'" in m for m in by_status[Status.WARN])


# --- report ----------------------------------------------------------------------------------


def test_exit_codes_and_rendering() -> None:
    ok = passed("crds", "fine")
    warn = warned("lease", "no operator", "start it")
    bad = failed("rbac", "lacks\nverbs", "grant them")
    assert Report((ok, warn)).exit_code == 0
    assert Report((ok, warn, bad)).exit_code == 1
    assert Report((ok,), could_not_run=True).exit_code == 2
    table = render_table(Report((ok, warn, bad)))
    assert "✓ crds" in table and "! lease" in table
    assert "✗ rbac   lacks verbs -> fix: grant them" in table
    assert table.splitlines()[-1].startswith("1 passed, 1 warnings, 1 failed; first: rbac")
    doc = render_json(Report((bad,)))
    assert '"exitCode": 1' in doc and '"status": "fail"' in doc
    assert CheckResult("x", Status.PASS, "a\n  b").message == "a b"


# --- log levels of expected conflicts ------------------------------------------------------------


class _ConflictingKube:
    field_manager = "test"

    async def patch(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        raise Conflict("patch ContainerDispatch ns/c: conflict (Conflict)", 409)


def test_a_legacy_finalizer_conflict_is_counted_and_logged_at_debug(
    caplog: pytest.LogCaptureFixture,
) -> None:
    queue = ContainerQueue(kube=_ConflictingKube(), namespace="ns", dispatcher_id="d")  # type: ignore[arg-type]
    queue.observe(
        {
            "metadata": {
                "name": "c",
                "namespace": "ns",
                "resourceVersion": "5",
                "finalizers": [LEGACY_FINALIZER],
            },
            "spec": {},
        }
    )
    counter = KUBE_CONFLICTS.labels("ContainerDispatch", "patch")
    before = counter._value.get()
    with caplog.at_level(logging.DEBUG, logger="nodewarden.dispatch.queue"):
        container = queue.get("c")
        assert container is not None
        assert asyncio.run(queue.drop_legacy_finalizer(container)) is False
    assert counter._value.get() == before + 1
    records = [r for r in caplog.records if "finalizer update of c skipped" in r.getMessage()]
    assert [r.levelno for r in records] == [logging.DEBUG]
