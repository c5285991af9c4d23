"""The scheduler's node views (`dispatch.views.NodeViews`): a cloud VM's view is made
again only when what it is made from changes -- a plan over 500 unchanged VMs builds
none -- and a change of any of those facts shows in the next plan's view.

Counted, not timed: the calls of `rules.nodeview.cloud_view`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fakes import SMALL, T0

import nodewarden.dispatch.views as views_module
from nodewarden.fleet.board import NodePowerView, PowerBoard
from nodewarden.policy.state import PowerState
from nodewarden.pool.worker import Worker
from nodewarden.scheduling.views import NodeState


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    calls: list[str] = []
    real = views_module.cloud_view

    def counted(name: str, *args: Any, **kwargs: Any) -> Any:
        calls.append(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(views_module, "cloud_view", counted)
    yield calls


def _fleet(n: int) -> tuple[PowerBoard, list[Worker]]:
    board = PowerBoard()
    workers = [Worker(name=f"vm-{i}", instance_type=SMALL, created_at=T0) for i in range(n)]
    for w in workers:
        board.set(w.name, NodePowerView(PowerState.ON_IDLE, True, True))
    return board, workers


def test_a_plan_over_unchanged_vms_builds_no_view(made: list[str]) -> None:
    board, workers = _fleet(500)
    views = views_module.NodeViews(board)
    first = views.nodes(workers)
    assert len(made) == 500
    made.clear()
    for _ in range(3):
        again = views.nodes(workers)
        assert again == first
    assert made == []


def test_a_changed_fact_makes_the_view_again(made: list[str]) -> None:
    board, workers = _fleet(3)
    views = views_module.NodeViews(board)
    views.nodes(workers)
    made.clear()
    # the power controller marks vm-0 busy; vm-1's destroy is asked for
    board.set("vm-0", NodePowerView(PowerState.ACTIVE, True, True))
    workers[1].destroy_requested_at = T0
    out = {v.name: v for v in views.nodes(workers)}
    assert sorted(made) == ["vm-0", "vm-1"]
    assert out["vm-1"].state is NodeState.SHUTTING_DOWN
    assert out["vm-2"].state is not NodeState.SHUTTING_DOWN
    made.clear()
    # a VM that leaves the pool is forgotten; back again, its view is made anew
    views.nodes(workers[1:])
    views.nodes(workers)
    assert made == ["vm-0"]
