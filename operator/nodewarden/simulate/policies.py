"""The policies a simulation compares: PowerPolicy files and the two baselines.

`load_policy(data, fallback_name)` accepts a PowerPolicy YAML document as written for
the cluster (the whole object, `kind: PowerPolicy` with metadata and spec) or just its
spec, validates it exactly as the operator does (`PowerPolicySpec` + `PolicyView`, so a
policy the CRD's CEL rules would reject is rejected here too) and raises `InputError`
naming the field.

Baselines (always in the table, never read from a file):

* `never-off`: nothing is ever switched off. Every WorkerNode is pinned On (`spec.power:
  On`): cloud VMs are created on demand and kept, side nodes are woken once, and the real
  state machine never shuts either down. Knobs otherwise the built-in PowerPolicy
  defaults.
* `fixed-timeout`: the Arvados dispatcher's fixed idle timeout (TimeoutIdle 1m): a node
  idle for one minute is switched off, with no billing window (per-second), no min-on,
  min-off or cooldown, and no disruption budget; side nodes are woken on demand. It runs
  through the same decision code as any policy, with those knobs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from nodewarden.api.powerpolicy import PowerPolicySpec
from nodewarden.api.warmcapacity import warm_problems
from nodewarden.policy.view import PolicyView
from nodewarden.rules.forecast import Histogram
from nodewarden.simulate.errors import InputError, field_errors


@dataclass(frozen=True, slots=True)
class SimPolicy:
    """A policy under simulation: its name, spec and parsed view, and baseline flags."""

    name: str
    spec: PowerPolicySpec
    view: PolicyView
    baseline: str | None = None
    """None for a policy file; 'never-off' or 'fixed-timeout' for a baseline."""
    forecast: Histogram | None = None
    """The forecast lever's histogram, trained on the first days of the trace
    (`simulate.warmth.train`); None: the forecast has nothing to go on."""

    @property
    def never_off(self) -> bool:
        return self.baseline == "never-off"


def policy_from_spec(
    spec: PowerPolicySpec, name: str, generation: int | None = None, baseline: str | None = None
) -> SimPolicy:
    view = PolicyView.from_spec(spec, name=name, generation=generation)
    problems = [
        *view.problems,
        *warm_problems(spec.node_classes, spec.warm_capacity, spec.forecast_wake),
    ]
    if problems:
        raise InputError("; ".join(f"spec.{p}" for p in problems))
    return SimPolicy(name=name, spec=spec, view=view, baseline=baseline)


def load_policy(data: Any, fallback_name: str) -> SimPolicy:
    """A PowerPolicy object or spec document; InputError names the field."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InputError("the document must be a PowerPolicy object or its spec (a mapping)")
    name = fallback_name
    generation: int | None = None
    is_object = "kind" in data or "apiVersion" in data or "metadata" in data
    if is_object:
        if data.get("kind", "PowerPolicy") != "PowerPolicy":
            raise InputError(f"kind: expected PowerPolicy, got {data.get('kind')!r}")
        meta = data.get("metadata") or {}
        if not isinstance(meta, dict):
            raise InputError("metadata: must be a mapping")
        name = str(meta.get("name") or fallback_name)
        raw_generation = meta.get("generation")
        generation = raw_generation if isinstance(raw_generation, int) else None
        spec_data = data.get("spec") or {}
        prefix = "spec."
    else:
        spec_data = data
        prefix = ""
    try:
        spec = PowerPolicySpec.model_validate(spec_data)
    except ValidationError as exc:
        raise InputError(field_errors(exc, prefix)) from None
    return policy_from_spec(spec, name, generation)


FIXED_TIMEOUT_SPEC: dict[str, Any] = {
    "idleThreshold": "1m",
    "bootGrace": "10m",
    "minOn": "0s",
    "minOff": "0s",
    "cooldown": "0s",
    "billing": {"period": "0s", "windowStart": "0s", "windowEnd": "1s"},
    "disruptionBudget": {"maxConcurrentTransitions": 10000},
}
"""The knobs of the fixed-timeout baseline (Arvados TimeoutIdle 1m, BootTimeout 10m)."""


def baselines() -> tuple[SimPolicy, SimPolicy]:
    """The never-off and fixed-timeout baselines."""
    never = policy_from_spec(PowerPolicySpec(), "never-off", baseline="never-off")
    fixed = policy_from_spec(
        PowerPolicySpec.model_validate(FIXED_TIMEOUT_SPEC),
        "fixed-timeout-1m",
        baseline="fixed-timeout",
    )
    return never, fixed
