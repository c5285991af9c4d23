"""Check the PowerPolicies: each one valid, the default present, every reference resolvable (pure)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from nodewarden.api.powerpolicy import PowerPolicySpec
from nodewarden.check.nodes import Node
from nodewarden.check.result import CheckResult, failed, passed, plural, warned
from nodewarden.validation import Verdict, parse_spec, validate_powerpolicy


def policy_results(
    bodies: Sequence[Mapping[str, Any]], nodes: Sequence[Node], default_policy: str, namespace: str
) -> list[CheckResult]:
    out: list[CheckResult] = []
    valid = 0
    names = set()
    for body in bodies:
        name = str(body.get("metadata", {}).get("name", "?"))
        names.add(name)
        parsed = parse_spec(PowerPolicySpec, body.get("spec"))
        verdict = parsed if isinstance(parsed, Verdict) else validate_powerpolicy(parsed)
        if verdict.valid:
            valid += 1
        else:
            out.append(
                failed(
                    "policies",
                    f"PowerPolicy {name}: {verdict.message}",
                    f"fix the named field (kubectl -n {namespace} edit pp {name})",
                )
            )
    dangling = sorted(
        {
            (n.name, n.spec.policy_ref.name)
            for n in nodes
            if n.spec.policy_ref is not None and n.spec.policy_ref.name not in names
        }
    )
    for node, policy in dangling:
        out.append(
            failed(
                "policies",
                f"WorkerNode {node}: spec.policyRef.name {policy!r} does not exist",
                "create that PowerPolicy or point spec.policyRef at an existing one",
            )
        )
    uses_default = any(n.spec.policy_ref is None for n in nodes)
    if default_policy not in names:
        message = f"no PowerPolicy {default_policy!r} (default_policy) in {namespace}"
        if uses_default:
            message += ": WorkerNodes without spec.policyRef run on the built-in defaults"
        out.append(
            warned(
                "policies",
                message,
                "kubectl apply -f examples/01-powerpolicy-default.yaml (edit its knobs first)",
            )
        )
    if valid:
        out.insert(0, passed("policies", f"{plural(valid, 'PowerPolicy', 'PowerPolicies')} valid"))
    return out
