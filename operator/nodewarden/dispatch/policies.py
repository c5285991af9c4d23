"""The PowerPolicy book: the policies of the namespace as parsed views, with a built-in default.

Fed by the initial LIST and by watch events. A WorkerNode without `spec.policyRef` uses the
operator's default policy name; if no such PowerPolicy exists the built-in defaults
(`PowerPolicySpec()`) apply, and decisions record the version as `builtin`. A policy that
is invalid (does not parse, or fails `validate_powerpolicy`) stays in the book with its
problems, so the nodes under it BLOCK with POLICY_INVALID rather than fall back silently.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import ValidationError

from nodewarden.api.kinds import POWER_POLICY
from nodewarden.api.powerpolicy import PowerPolicySpec
from nodewarden.kube.client import Kube
from nodewarden.policy.view import PolicyView
from nodewarden.validation import validate_powerpolicy

BUILTIN = "builtin"


@dataclass
class Policy:
    name: str
    spec: PowerPolicySpec
    view: PolicyView


def _build(name: str, spec: PowerPolicySpec, generation: int | None) -> Policy:
    return Policy(name, spec, PolicyView.from_spec(spec, name=name, generation=generation))


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
            spec = PowerPolicySpec.model_validate(body.get("spec") or {})
        except ValidationError as exc:
            # Its Valid condition says why; the nodes under it BLOCK with POLICY_INVALID.
            problem = "spec does not parse: " + "; ".join(
                f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
            )
            self.policies[name] = _invalid(name, generation, problem)
            return
        policy = _build(name, spec, generation)
        verdict = validate_powerpolicy(spec)
        if not verdict.valid:
            view = replace(policy.view, problems=(*policy.view.problems, verdict.message))
            policy = Policy(name, spec, view)
        self.policies[name] = policy

    async def load(self, kube: Kube) -> None:
        for body in await kube.list(POWER_POLICY, self.namespace):
            body.setdefault("metadata", {}).setdefault("namespace", self.namespace)
            self.observe(body)

    def get(self, name: str | None) -> Policy:
        """The named policy, else the default policy, else the built-in defaults."""
        if name and name in self.policies:
            return self.policies[name]
        return self.policies.get(self.default_name, self.builtin)

    @property
    def default(self) -> Policy:
        return self.get(None)

    def for_node(self, name: str | None) -> Policy:
        """The policy a node's power decisions use: a named policy that does not exist is
        not replaced by the default -- the node's decisions BLOCK with POLICY_INVALID."""
        if name and name not in self.policies:
            return _invalid(name, None, f"PowerPolicy {name!r} not found")
        return self.get(name)
