"""The warm-capacity rules, pure (`rules.warm`, `rules.forecast`): windows in an IANA time
zone across daylight saving time, the levers' targets and modes, node classes, the cloud
VMs to create, the forecast histogram (learning, bursts, decay, persistence) and its
due times."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from nodewarden.api.containerdispatch import ContainerResources
from nodewarden.api.powerpolicy import PowerPolicySpec
from nodewarden.api.warmcapacity import (
    ForecastWake,
    NodeClass,
    WarmCapacity,
    warm_problems,
)
from nodewarden.rules.demand import idle_view
from nodewarden.rules.forecast import (
    HORIZON,
    container_class,
    forecast_want,
    fresh,
    from_status,
    next_due,
    poisson_quantile,
    to_status,
)
from nodewarden.rules.warm import (
    LeverWant,
    class_of,
    combine,
    next_window_boundary,
    targets,
    vm_creates,
    windows_of,
)
from nodewarden.scheduling.instancetypes import Catalogue, InstanceType, InstanceTypePolicy
from nodewarden.scheduling.views import Capacity, NodeState, NodeView, Plan, Start

GI = 1024**3
BERLIN_OFFICE = {
    "name": "office",
    "nodeClass": "a100",
    "minWarm": 2,
    "start": "08:00",
    "end": "20:00",
    "timeZone": "Europe/Berlin",
}


def _windows(*windows: dict[str, Any]) -> Any:
    return windows_of(WarmCapacity.model_validate({"windows": list(windows)}))


def _utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


# -- windows --------------------------------------------------------------------------------


def test_a_berlin_window_opens_at_08_local_before_and_after_the_spring_change() -> None:
    (w,) = _windows(BERLIN_OFFICE)
    # Friday 26 March 2027 is still CET (UTC+1): 08:00 local is 07:00 UTC
    assert not w.open_at(_utc(2027, 3, 26, 6, 59))
    assert w.open_at(_utc(2027, 3, 26, 7, 0))
    assert w.open_at(_utc(2027, 3, 26, 18, 59))
    assert not w.open_at(_utc(2027, 3, 26, 19, 0))
    # clocks go forward on Sunday 28 March: on Monday 08:00 local is 06:00 UTC
    assert not w.open_at(_utc(2027, 3, 29, 5, 59))
    assert w.open_at(_utc(2027, 3, 29, 6, 0))
    assert not w.open_at(_utc(2027, 3, 29, 18, 0))
    # the boundaries the agenda waits for follow the change
    assert next_window_boundary((w,), _utc(2027, 3, 26, 19, 0)) == _utc(2027, 3, 29, 6, 0)
    assert next_window_boundary((w,), _utc(2027, 3, 29, 6, 0)) == _utc(2027, 3, 29, 18, 0)


def test_the_autumn_change_moves_the_window_back_and_weekends_stay_closed() -> None:
    (w,) = _windows(BERLIN_OFFICE)
    # Friday 29 October 2027 is CEST (07:00 local -> 06:00 UTC for 08:00), Monday 1
    # November CET (07:00 UTC)
    assert w.open_at(_utc(2027, 10, 29, 6, 0))
    assert not w.open_at(_utc(2027, 10, 30, 12, 0))  # Saturday
    assert not w.open_at(_utc(2027, 11, 1, 6, 30))
    assert w.open_at(_utc(2027, 11, 1, 7, 0))
    assert next_window_boundary((w,), _utc(2027, 10, 29, 18, 0)) == _utc(2027, 11, 1, 7, 0)


def test_overnight_and_midnight_windows() -> None:
    night, evening = _windows(
        {"name": "night", "nodeClass": "c", "minWarm": 1, "days": ["Sun"], "start": "22:00",
         "end": "06:00"},
        {"name": "late", "nodeClass": "c", "minWarm": 3, "days": ["Mon"], "start": "20:00",
         "end": "24:00"},
    )  # fmt: skip
    sunday = _utc(2027, 3, 7, 23, 0)
    assert night.open_at(sunday) and night.open_at(sunday + timedelta(hours=6, minutes=59))
    assert not night.open_at(sunday + timedelta(hours=7))  # Monday 06:00
    assert evening.open_at(_utc(2027, 3, 8, 23, 59)) and not evening.open_at(_utc(2027, 3, 9, 0))


def test_targets_take_the_larger_lever_and_keep_shadow_apart() -> None:
    (w,) = _windows(BERLIN_OFFICE)
    c = NodeClass(name="a100", node_type="SideNode", gpu_model="a100")
    friday_noon = _utc(2027, 3, 26, 11, 0)

    def forecast(cls: NodeClass, at: datetime) -> LeverWant:
        return LeverWant(3, "forecast: 3", 1.7)

    on = targets([c], [w], "On", forecast, "Shadow", friday_noon)["a100"]
    assert (on.count, on.lever, on.shadow_count, on.shadow_lever) == (
        2,
        "WarmWindow",
        3,
        "Forecast",
    )
    assert "window office" in (on.why or "") and on.expected == 1.7
    both = targets([c], [w], "On", forecast, "On", friday_noon)["a100"]
    assert (both.count, both.lever, both.shadow_count) == (3, "Forecast", 0)
    assert targets([c], [w], "Off", None, "Off", friday_noon) == {}
    saturday = targets([c], [w], "On", None, "Off", _utc(2027, 3, 27, 11, 0))
    assert saturday == {}
    tie = combine(LeverWant(2, "w"), "On", LeverWant(2, "f"), "On")
    assert tie.lever == "WarmWindow"


def test_a_node_belongs_to_the_first_class_that_matches() -> None:
    classes = [
        NodeClass(name="a100", node_type="SideNode", gpu_model="a100"),
        NodeClass(name="gpu-lab", node_type="SideNode", name_prefix="lab-"),
        NodeClass(name="side", node_type="SideNode"),
        NodeClass(name="small", node_type="CloudVM", instance_type="m5.large"),
    ]
    assert class_of("lab-1", "SideNode", None, "a100", classes) == "a100"
    assert class_of("lab-2", "SideNode", None, "h100", classes) == "gpu-lab"
    assert class_of("rack-2", "SideNode", None, None, classes) == "side"
    assert class_of("vm-1", "CloudVM", "m5.large", None, classes) == "small"
    assert class_of("vm-2", "CloudVM", "m5.xlarge", None, classes) is None


def test_vm_creates_count_idle_and_coming_nodes_nobody_waits_for() -> None:
    c = NodeClass(name="small", node_type="CloudVM", instance_type="m5.large")
    cap = Capacity(2, 8 * GI, 0, 0)

    def vm(name: str, state: NodeState, ready: bool = True) -> NodeView:
        return NodeView(name, state, cap, "m5.large", 0.1, ready=ready)

    want = targets([c], [], "Off", lambda *_: LeverWant(3, "f"), "On", _utc(2027, 1, 4))
    nodes = [
        vm("idle", NodeState.IDLE),
        vm("taken", NodeState.IDLE),
        vm("booting", NodeState.BOOTING, ready=False),
        vm("waited-for", NodeState.BOOTING, ready=False),
        vm("busy", NodeState.ACTIVE),
    ]
    plan = Plan(starts=[Start("u1", "taken")], wait_nodes={"u2": "waited-for"})
    assert vm_creates(want, [c], nodes, plan) == [("small", "m5.large", 1)]
    assert vm_creates(want, [c], [*nodes, vm("idle-2", NodeState.IDLE)], plan) == []


# -- the forecast -----------------------------------------------------------------------------


SETTINGS = ForecastWake(mode="On", min_days=2, confidence=0.8, max_warm_nodes=3)
GPU = NodeClass(name="gpu", node_type="SideNode", boot_time="6m")


def _learn(days: int, per_hour: int = 20, hour: int = 10) -> Any:
    """A histogram that watched `days` weekdays from Monday 4 January 2027, with
    `per_hour` arrivals of class gpu at `hour`:00-`hour`:59 UTC each day."""
    start = _utc(2027, 1, 4)
    h = fresh("UTC", start)
    for day in range(days):
        base = start + timedelta(days=day, hours=hour)
        for i in range(per_hour):
            h.arrive("gpu", 0.5, base + timedelta(minutes=i * 60 / per_hour))
    h.advance(start + timedelta(days=days))
    return h


def test_no_forecast_until_min_days_are_watched() -> None:
    one = _learn(1)
    assert one.days_observed == pytest.approx(1.0)
    assert forecast_want(one, GPU, _utc(2027, 1, 5, 10), SETTINGS) is None
    assert to_status(one, SETTINGS).state == "Learning"
    two = _learn(2)
    status = to_status(two, SETTINGS)
    assert status.state == "Forecasting" and "2.0 days" in status.message
    want = forecast_want(two, GPU, _utc(2027, 1, 6, 10, 15), SETTINGS)
    assert want is not None
    # 20/h over a 6-minute boot: Poisson(2), its 0.8 quantile is 3 arrivals of half a node
    assert poisson_quantile(2.0, 0.8) == 3
    assert want.count == 2 and want.expected == pytest.approx(1.0)
    assert "20.0 arrivals/h" in want.why


def test_the_forecast_looks_one_boot_time_ahead_and_is_quiet_at_night() -> None:
    h = _learn(2)
    early = forecast_want(h, GPU, _utc(2027, 1, 6, 9, 53), SETTINGS)  # 09:53 + 6m: 9 o'clock
    assert early is not None and early.count == 0
    ahead = forecast_want(h, GPU, _utc(2027, 1, 6, 9, 55), SETTINGS)  # + 6m: 10 o'clock
    assert ahead is not None and ahead.count == 2
    night = forecast_want(h, GPU, _utc(2027, 1, 6, 3, 0), SETTINGS)
    assert night is not None and night.count == 0
    # no weekend hour was watched yet: Saturday borrows the weekdays' 10 o'clock, and says so
    saturday = forecast_want(h, GPU, _utc(2027, 1, 9, 10, 0), SETTINGS)
    assert saturday is not None and saturday.count == 2
    assert "borrowed: no weekend 10:00 watched yet" in saturday.why
    h.arrive("gpu", 0.5, _utc(2027, 1, 9, 10, 30))
    h.advance(_utc(2027, 1, 10))  # a Saturday watched: weekends have their own rate now
    own = forecast_want(h, GPU, _utc(2027, 1, 16, 10, 0), SETTINGS)
    assert own is not None and own.count == 0 and "(weekend 10:00 UTC)" in own.why
    # due times: each hour, and the boot time before it
    assert next_due(h, [GPU], _utc(2027, 1, 6, 9, 0)) == _utc(2027, 1, 6, 9, 54)
    assert next_due(h, [GPU], _utc(2027, 1, 6, 9, 54)) == _utc(2027, 1, 6, 10, 0)


def test_a_burst_is_counted_apart_and_the_rate_stays() -> None:
    h = _learn(2)
    at = _utc(2027, 1, 6, 14, 0)
    counted = [h.arrive("gpu", 0.5, at + timedelta(seconds=i)) for i in range(200)]
    assert counted.count(True) <= 12 and h.bursts["gpu"] >= 188
    h.advance(_utc(2027, 1, 7))
    rate = h.rate("gpu", "weekday", 14)
    assert rate is not None and rate[0] < 5


def test_the_histogram_forgets_past_its_horizon_and_stays_bounded() -> None:
    h = fresh("UTC", _utc(2027, 1, 4))
    for day in range(70):
        noon = _utc(2027, 1, 4) + timedelta(days=day, hours=12)
        if noon.weekday() < 5:
            for i in range(8 if day < 35 else 2):
                h.arrive("gpu", 1.0, noon + timedelta(minutes=7 * i))
        h.advance(noon + timedelta(hours=12))
    assert max(h.observed["weekday"]) <= HORIZON["weekday"]
    rate = h.rate("gpu", "weekday", 12)
    assert rate is not None and 2.0 <= rate[0] < 5.0  # recent weeks weigh more


def test_the_histogram_survives_its_status_and_a_zone_change_starts_afresh() -> None:
    h = _learn(3)
    status = to_status(h, SETTINGS)
    wire = status.to_wire()
    assert len(wire["classes"]) == 1 and len(wire["observedHours"]["weekday"]) == 24
    again = from_status(type(status).model_validate(wire), "UTC")
    assert again is not None
    assert again.days_observed == pytest.approx(h.days_observed)
    assert again.rate("gpu", "weekday", 10) == pytest.approx(h.rate("gpu", "weekday", 10))
    assert from_status(status, "Europe/Berlin") is None


def test_a_container_belongs_to_the_first_class_the_scheduler_would_run_it_on() -> None:
    small = InstanceType(name="small", provider_type="s", vcpus=2, ram=4 * GI, price=0.02)
    big = InstanceType(name="big", provider_type="b", vcpus=8, ram=32 * GI, price=0.4)
    catalogue = Catalogue(types=(small, big))
    policy = InstanceTypePolicy()
    views = [
        ("small", idle_view("small", Capacity.of(small), "small", small.price)),
        ("gpu", idle_view("gpu-1", Capacity(32, 256 * GI, 0, 4, "a100"), None, 1.0)),
        ("big", idle_view("big", Capacity.of(big), "big", big.price)),
    ]

    def of(**r: Any) -> Any:
        return container_class(ContainerResources.model_validate(r), views, catalogue, policy)

    assert of(vcpus=1, ram="1Gi") == ("small", pytest.approx(0.5, abs=0.1))
    assert of(vcpus=6, ram="8Gi") == ("big", pytest.approx(0.75))
    assert of(vcpus=4, ram="16Gi", gpus=2, gpuModel="a100") == ("gpu", pytest.approx(0.5))
    assert of(vcpus=64, ram="1Gi") is None


def test_problems_name_the_field_and_the_fix() -> None:
    spec = PowerPolicySpec.model_validate(
        {
            "nodeClasses": [{"name": "a100", "nodeType": "SideNode"}],
            "warmCapacity": {"windows": [{**BERLIN_OFFICE, "timeZone": "Mars/Olympus"}]},
            "forecastWake": {"classes": ["h100"], "timeZone": "Europe/Berlin"},
        }
    )
    problems = warm_problems(spec.node_classes, spec.warm_capacity, spec.forecast_wake)
    assert problems == [
        "warmCapacity.windows[0].timeZone: unknown time zone 'Mars/Olympus'; use an IANA "
        "name such as Europe/Berlin",
        "forecastWake.classes: no node class 'h100' in spec.nodeClasses",
    ]


def test_the_tz_database_comes_with_the_python_dependencies() -> None:
    """The image's slim base ships no /usr/share/zoneinfo: zoneinfo must find Europe/Berlin
    in the tzdata wheel (pyproject.toml, requirements.lock) with no system path at all."""
    import zoneinfo

    saved = zoneinfo.TZPATH
    zoneinfo.reset_tzpath(to=[])
    try:
        berlin = zoneinfo.ZoneInfo.no_cache("Europe/Berlin")
        assert datetime(2027, 7, 1, tzinfo=berlin).utcoffset() == timedelta(hours=2)
    finally:
        zoneinfo.reset_tzpath(to=saved)


def test_the_live_book_counts_each_arrival_once_and_restores_without_the_downtime() -> None:
    from nodewarden.power.warmbook import WarmBook
    from nodewarden.scheduling.views import ContainerView, Phase

    small = InstanceType(name="small", provider_type="s", vcpus=2, ram=4 * GI, price=0.02)
    spec = PowerPolicySpec.model_validate(
        {
            "nodeClasses": [{"name": "small", "nodeType": "CloudVM", "instanceType": "small"}],
            "forecastWake": {"mode": "Shadow", "minDays": 1},
        }
    )
    policies = [("p", spec)]
    t0 = _utc(2027, 1, 4, 9)
    res = ContainerResources.model_validate({"vcpus": 1, "ram": "1Gi"})

    def view(uuid: str, at: datetime) -> ContainerView:
        return ContainerView(uuid, Phase.QUEUED, 500, at, res)

    book = WarmBook(Catalogue(types=(small,)), InstanceTypePolicy())
    book.planned([view("old", t0 - timedelta(hours=1))], policies, t0)  # before: not counted
    new = view("new", t0 + timedelta(minutes=1))
    book.planned([new], policies, t0 + timedelta(minutes=2))
    book.planned([new], policies, t0 + timedelta(minutes=3))  # the same one: counted once
    h = book.histograms["p"]
    assert sum(h.classes["small"]["weekday"].arrivals) == 1
    h.advance(t0 + timedelta(hours=1))
    wire = to_status(h, spec.forecast_wake).to_wire()
    # a restart five hours later: the histogram comes back, the downtime is not watched
    again = WarmBook(Catalogue(types=(small,)), InstanceTypePolicy())
    again.observe("p", {"forecast": wire})
    restored = again.histogram("p", spec, t0 + timedelta(hours=6))
    assert restored is not None
    assert sum(restored.classes["small"]["weekday"].arrivals) == 1
    assert restored.counted_until == t0 + timedelta(hours=6)
    assert restored.days_observed == pytest.approx(1 / 24)
