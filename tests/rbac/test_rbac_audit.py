"""The operator calls exactly what its Role grants: derived from the API server's audit log.

The local control plane audits every request of the operator's own identity
(`localcluster.OPERATOR_USER`, used by every operator the tests start). This test runs
last (tests/conftest.py) and compares what the operator really called during the whole
run with the permission table the chart's Role is made of: it fails on any call not
granted and on any grant never used. Run alone it has nothing to compare and skips.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from clusterkit import ClusterHandle
from localcluster import OPERATOR_USER
from rbac.rbac_rules import covered, table_grants, used_grants

pytestmark = [pytest.mark.cluster, pytest.mark.audit_last]

# Suites that exercise every permission; the audit is meaningful only after all of them.
EXERCISING = ("tests/cluster/", "tests/dispatch/", "tests/power/")


def test_the_operator_uses_exactly_the_permissions_it_is_granted(
    cluster: ClusterHandle, request: pytest.FixtureRequest
) -> None:
    if cluster.local is None:
        pytest.skip("needs the local control plane's audit log")
    collected = {item.nodeid for item in request.session.items}
    missing = [d for d in EXERCISING if not any(n.startswith(d) for n in collected)]
    if missing:
        pytest.skip(f"the RBAC audit needs the full suite (make test); not run: {missing}")
    events: list[dict[str, Any]] = []
    with cluster.local.audit_log.open() as lines:
        for line in lines:
            events.append(json.loads(line))
    used = used_grants(events, OPERATOR_USER)
    assert used, "no audited request of the operator: is the audit policy in place?"
    grants = table_grants()
    not_granted = sorted(u for u in used if not covered(u, grants))
    unused = sorted(g for g in grants if not any(covered(u, {g}) for u in used))
    assert not_granted == [], f"the operator made calls its Role does not grant: {not_granted}"
    assert unused == [], f"the Role grants what the operator never used: {unused}"
