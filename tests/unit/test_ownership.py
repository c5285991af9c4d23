"""Which install owns a WorkerNode (`nodewarden.ownership`, pure part)."""

from __future__ import annotations

from typing import Any

import pytest

from nodewarden.ownership import DISPATCHER_LABEL, Ownership, owner_of, ownership


def node(node_type: str, label: str | None = None) -> dict[str, Any]:
    labels = {DISPATCHER_LABEL: label} if label is not None else {}
    return {"metadata": {"name": "n", "labels": labels}, "spec": {"nodeType": node_type}}


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (node("SideNode", "alpha"), Ownership.OURS),
        (node("CloudVM", "alpha"), Ownership.OURS),
        (node("SideNode", "beta"), Ownership.FOREIGN),
        (node("CloudVM", "beta"), Ownership.FOREIGN),
        (node("SideNode"), Ownership.CLAIMABLE),  # claimed by a preconditioned label write
        (node("CloudVM"), Ownership.DECLARED),  # labelled by the install that adopts it
        (node("SideNode", ""), Ownership.CLAIMABLE),  # an empty label is no owner
    ],
)
def test_ownership_of_a_workernode(body: dict[str, Any], expected: Ownership) -> None:
    assert ownership(body, "alpha") is expected


def test_owner_of_reads_the_dispatcher_label() -> None:
    assert owner_of(node("SideNode", "beta")) == "beta"
    assert owner_of({"metadata": {}}) is None
