"""Check the hard caps before an upgrade: is the current fleet above the operator's ceilings,
and can anything be created at all (pure).

The fleet is this dispatcher's CloudVM WorkerNodes (labelled with its id): their count,
their summed hourly price (status, else the catalogue's price) and their count per
instance type, compared with `dispatch.limits` (Helm values `limits.*`). A fleet above
a ceiling keeps running -- nothing is destroyed -- but no instance is created until it
shrinks below it: the line says which ceiling, by how much, and how to raise it. No
default PowerPolicy (or an invalid one) stops every create; no ceiling at all is a
warning (any PowerPolicy author could then run up the bill).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from nodewarden.check.result import CheckResult, failed, passed, warned
from nodewarden.config import OperatorConfig
from nodewarden.ownership import DISPATCHER_LABEL
from nodewarden.scheduling.caps import Ceilings, Fleet, above_ceilings

CHART_DEFAULTS = Ceilings(max_nodes=50, max_hourly_spend=25.0, max_per_type=20)
"""The Helm chart's `limits.*` defaults (a test keeps them equal to values.yaml): a site
whose config has no ceilings yet gets these with its next chart upgrade."""

RAISE = (
    "before upgrading, set limits.{setting} in the Helm values to at least {current:g} "
    "(or shrink the fleet); nothing is destroyed, but no instance is created until the "
    "fleet is below the ceiling"
)


def fleet_of(bodies: Sequence[Mapping[str, Any]], config: OperatorConfig) -> Fleet:
    """This dispatcher's cloud instances as the WorkerNodes show them."""
    prices = {t.name: t.price for t in (config.cloud.instance_types if config.cloud else [])}
    instances: list[tuple[str, float]] = []
    for body in bodies:
        spec = body.get("spec") or {}
        labels = (body.get("metadata") or {}).get("labels") or {}
        if (
            spec.get("nodeType") != "CloudVM"
            or labels.get(DISPATCHER_LABEL) != config.dispatcher_id
        ):
            continue
        type_name = str(spec.get("instanceType") or "unknown")
        price = (body.get("status") or {}).get("hourlyPrice")
        if not isinstance(price, int | float):
            price = prices.get(type_name, 0.0)
        instances.append((type_name, float(price)))
    return Fleet.of(instances)


def caps_results(
    bodies: Sequence[Mapping[str, Any]], config: OperatorConfig, default_problem: str | None
) -> list[CheckResult]:
    limits = config.dispatch.limits
    ceilings = limits.ceilings()
    fleet = fleet_of(bodies, config)
    out: list[CheckResult] = []
    if config.cloud is not None and default_problem is not None:
        out.append(
            failed(
                "caps",
                f"no instance will be created: {default_problem}",
                "kubectl apply a PowerPolicy with that name (the chart installs one with "
                "defaultPowerPolicy.create=true)",
            )
        )
    excess = above_ceilings(fleet, ceilings)
    for e in excess:
        setting = e.setting.split(" ", 1)[0]
        out.append(
            warned(
                "caps",
                f"the fleet is above the operator's ceiling limits.{e.setting}: "
                f"{e.current:g} > {e.ceiling:g}",
                RAISE.format(setting=setting, current=e.current),
            )
        )
    unset = [
        name
        for name, value in (
            ("maxNodes", limits.max_nodes),
            ("maxHourlySpend", limits.max_hourly_spend),
            ("maxPerInstanceType", limits.max_per_instance_type),
        )
        if value is None
    ]
    if config.cloud is not None and unset:
        out.append(
            warned(
                "caps",
                f"no operator ceiling for {', '.join(unset)}: PowerPolicy authors alone "
                "decide how many instances run",
                "set limits.* in the Helm values (the chart's defaults are safe and non-zero)",
            )
        )
        for e in above_ceilings(fleet, CHART_DEFAULTS):
            setting = e.setting.split(" ", 1)[0]
            if setting in unset:
                out.append(
                    warned(
                        "caps",
                        f"the fleet is above the chart's default limits.{e.setting} "
                        f"({e.current:g} > {e.ceiling:g}): upgrading the chart with its "
                        "defaults stops new creates",
                        RAISE.format(setting=setting, current=e.current),
                    )
                )
    if not excess and config.cloud is not None:
        out.insert(
            0,
            passed(
                "caps",
                f"the fleet ({fleet.nodes} nodes, {fleet.hourly_spend:g}/h) is within the "
                "operator's ceilings",
            ),
        )
    return out
