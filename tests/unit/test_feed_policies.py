"""The PowerPolicies the feed lists at start-up reach the power controller before its first
round, so the forecast's histogram stored in a policy's status is restored rather than
started afresh (and then written over the stored one)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from nodewarden.api.powerpolicy import PowerPolicySpec
from nodewarden.fleet.policies import PolicyBook
from nodewarden.handlers.feed import Feed
from nodewarden.power.warmbook import WarmBook
from nodewarden.scheduling.instancetypes import Catalogue, InstanceTypePolicy

NS = "ns"
SPEC: dict[str, Any] = {
    "nodeClasses": [{"name": "fc", "nodeType": "SideNode", "namePrefix": "fc-"}],
    "forecastWake": {"mode": "On", "minDays": 1},
}


def _policy(counted_until: datetime) -> dict[str, Any]:
    watched = [1.0] * 24
    busy = {"arrivals": [6.0] * 24, "load": [6.0] * 24}
    forecast = {
        "state": "Forecasting",
        "timeZone": "UTC",
        "daysObserved": 2.0,
        "countedUntil": counted_until.isoformat(),
        "observedHours": {"weekday": watched, "weekend": watched},
        "classes": [{"name": "fc", "weekday": busy, "weekend": busy}],
    }
    return {
        "metadata": {"name": "default", "namespace": NS, "generation": 1},
        "spec": SPEC,
        "status": {"forecast": forecast},
    }


class _Kube:
    def __init__(self, bodies: list[dict[str, Any]]) -> None:
        self.bodies = bodies

    async def list(self, kind: object, namespace: str | None) -> list[dict[str, Any]]:
        return [dict(b) for b in self.bodies]


class _Controller:
    """The power controller's policy port, backed by the warm book it feeds."""

    def __init__(self) -> None:
        self.book = WarmBook(Catalogue(), InstanceTypePolicy())

    def observe_policy(self, body: Mapping[str, Any], deleted: bool = False) -> None:
        self.book.observe(body["metadata"]["name"], body.get("status"))


async def test_listed_policies_reach_the_power_controller_before_its_first_round() -> None:
    now = datetime(2027, 1, 6, 9, 0, tzinfo=UTC)
    book = PolicyBook(namespace=NS, default_name="default")
    controller = _Controller()
    feed = Feed.__new__(Feed)  # only the listing: no informers
    feed._kube = _Kube([_policy(now - timedelta(minutes=5))])  # type: ignore[assignment]
    feed._policies = book
    feed._controller = controller  # type: ignore[assignment]
    await feed._load_policies()
    assert "default" in book.policies
    # the controller's first round: the stored histogram comes back, not a fresh one
    h = controller.book.histogram("default", PowerPolicySpec.model_validate(SPEC), now)
    assert h is not None and h.days_observed == 2.0
    assert h.rate("fc", "weekday", 9) == (6.0, 1.0)
