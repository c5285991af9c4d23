"""The PowerPolicy book: the policies of the namespace as parsed views, with a built-in default.

Fed by the initial LIST and by watch events. A WorkerNode without `spec.policyRef` uses the
operator's default policy name; if no such PowerPolicy exists the built-in defaults
(`PowerPolicySpec()`) apply, and decisions record the version as `builtin`. A policy that
is invalid (does not parse, or fails `validate_powerpolicy`) stays in the book with its
problems, so the nodes under it BLOCK with POLICY_INVALID rather than fall back silently.
Whatever one policy holds, reading it never raises: an error the checks did not foresee
makes that policy invalid with the error as its problem, and the book goes on with the
others (a policy must never stop the operator, at start-up or at any event).

Creating capacity needs a usable default policy (`default_problem`): while it is missing
or invalid no instance is created at all -- it never means "unlimited".
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import ValidationError

from nodewarden.api.kinds import POWER_POLICY
from nodewarden.api.powerpolicy import PowerPolicySpec
from nodewarden.kube.client import Kube
from nodewarden.policy.view import PolicyView
from nodewarden.scheduling.caps import PolicyLimits
from nodewarden.validation import validate_powerpolicy

log = logging.getLogger(__name__)

BUILTIN = "builtin"


@dataclass
class Policy:
    name: str
    spec: PowerPolicySpec
    view: PolicyView


def _build(name: str, spec: PowerPolicySpec, generation: int | None) -> Policy:
    return Policy(name, spec, PolicyView.from_spec(spec, name=name, generation=generation))


def _read(name: str, raw: Mapping[str, Any] | None, generation: int | None) -> Policy:
    try:
        spec = PowerPolicySpec.model_validate(raw or {})
    except ValidationError as exc:
        # Its Valid condition says why; the nodes under it BLOCK with POLICY_INVALID.
        problem = "spec does not parse: " + "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        return _invalid(name, generation, problem)
    policy = _build(name, spec, generation)
    verdict = validate_powerpolicy(spec)
    if not verdict.valid:
        view = replace(policy.view, problems=(*policy.view.problems, verdict.message))
        policy = Policy(name, spec, view)
    return policy


def _invalid(name: str, generation: int | None, problem: str) -> Policy:
    """A stand-in for a policy that cannot be used: defaults, with the problem recorded."""
    spec = PowerPolicySpec()
    view = PolicyView.from_spec(spec, name=name, generation=generation)
    return Policy(name, spec, replace(view, problems=(problem,)))


@dataclass
class PolicyBook:
    namespace: str
    default_name: str
    policies: dict[str, Policy] = field(default_factory=dict)
    builtin: Policy = field(default_factory=lambda: _build(BUILTIN, PowerPolicySpec(), None))

    def observe(self, body: Mapping[str, Any], deleted: bool = False) -> None:
        meta = body.get("metadata", {})
        name = meta.get("name")
        if not name or (meta.get("namespace") or self.namespace) != self.namespace:
            return
        if deleted:
            self.policies.pop(name, None)
            return
        generation = meta.get("generation")
        try:
            self.policies[name] = _read(name, body.get("spec"), generation)
        except Exception as exc:  # a bug shown by one policy: that policy only is unusable
            log.exception("PowerPolicy %s could not be read; it counts as invalid", name)
            problem = f"nodewarden could not read this policy ({type(exc).__name__}: {exc})"
            self.policies[name] = _invalid(name, generation, problem[:1000])

    async def load(self, kube: Kube) -> list[dict[str, Any]]:
        """List the namespace's PowerPolicies into the book; returns their bodies (the
        caller hands them on to whoever reads their status)."""
        bodies = await kube.list(POWER_POLICY, self.namespace)
        for body in bodies:
            body.setdefault("metadata", {}).setdefault("namespace", self.namespace)
            self.observe(body)
        return list(bodies)

    def get(self, name: str | None) -> Policy:
        """The named policy, else the default policy, else the built-in defaults."""
        if name and name in self.policies:
            return self.policies[name]
        return self.policies.get(self.default_name, self.builtin)

    @property
    def default(self) -> Policy:
        return self.get(None)

    @property
    def default_problem(self) -> str | None:
        """Why no instance may be created now (the default policy is missing or invalid),
        or None when the default policy is usable."""
        policy = self.policies.get(self.default_name)
        if policy is None:
            return (
                f"the default PowerPolicy {self.default_name!r} does not exist; create it "
                "(the chart installs one) -- no instance is created without it"
            )
        if policy.view.problems:
            return (
                f"the default PowerPolicy {self.default_name!r} is invalid "
                f"({'; '.join(policy.view.problems)[:500]}); fix it -- no instance is created "
                "meanwhile"
            )
        return None

    def create_limits(self) -> tuple[PolicyLimits | None, str | None]:
        """The default policy's limits on creates, or (None, why creates are stopped)."""
        problem = self.default_problem
        if problem is not None:
            return None, problem
        spec = self.default.spec
        return (
            PolicyLimits(
                name=self.default_name,
                max_nodes=spec.max_nodes,
                max_hourly_spend=spec.max_hourly_spend,
                per_type={limit.instance_type: limit.max for limit in spec.instance_type_limits},
                min_warm_nodes=spec.min_warm_nodes,
            ),
            None,
        )

    def for_node(self, name: str | None) -> Policy:
        """The policy a node's power decisions use: a named policy that does not exist is
        not replaced by the default -- the node's decisions BLOCK with POLICY_INVALID."""
        if name and name not in self.policies:
            return _invalid(name, None, f"PowerPolicy {name!r} not found")
        return self.get(name)
