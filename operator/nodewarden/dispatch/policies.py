"""The PowerPolicy book: the policies of the namespace as parsed views, with a built-in default.

Fed by the initial LIST and by watch events. A WorkerNode without `spec.policyRef` uses the
operator's default policy name; if no such PowerPolicy exists the built-in defaults
(`PowerPolicySpec()`) apply, and decisions record the version as `builtin`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from nodewarden.api.kinds import POWER_POLICY
from nodewarden.api.powerpolicy import PowerPolicySpec
from nodewarden.kube.client import Kube
from nodewarden.policy.view import PolicyView

BUILTIN = "builtin"


@dataclass
class Policy:
    name: str
    spec: PowerPolicySpec
    view: PolicyView


def _build(name: str, spec: PowerPolicySpec, generation: int | None) -> Policy:
    return Policy(name, spec, PolicyView.from_spec(spec, name=name, generation=generation))


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
        try:
            spec = PowerPolicySpec.model_validate(body.get("spec") or {})
        except ValidationError:
            self.policies.pop(name, None)  # invalid: its Valid condition says why
            return
        self.policies[name] = _build(name, spec, meta.get("generation"))

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
