"""Compact informer bodies keep the one annotation the product reads
(nodewarden.io/do-not-consolidate) and drop every other."""

from __future__ import annotations

from nodewarden.api.consolidation import DO_NOT_CONSOLIDATE
from nodewarden.kube.compact import compact_containerdispatch, compact_workernode
from nodewarden.rules.consolidation import protected


def test_the_do_not_consolidate_annotation_is_kept_and_the_rest_dropped() -> None:
    meta = {
        "name": "n1",
        "annotations": {
            DO_NOT_CONSOLIDATE: "true",
            "kubectl.kubernetes.io/last-applied-configuration": "{...}",
        },
    }
    for compact in (compact_workernode, compact_containerdispatch):
        body = compact({"metadata": meta, "spec": {}})
        assert body["metadata"]["annotations"] == {DO_NOT_CONSOLIDATE: "true"}
        assert protected(body["metadata"]["annotations"])
        plain = compact({"metadata": {"name": "n2", "annotations": {"a": "b"}}, "spec": {}})
        assert "annotations" not in plain["metadata"]
