"""Validation handlers: acknowledge every object (observedGeneration) and keep its `Valid` condition.

Checks come from `nodewarden.validation` (pure); this module fetches the facts they need
(which policies, nodes and Secrets exist), writes one status patch per reconcile only when
something changed, and posts a Warning Event when an object becomes invalid. A PowerPolicy
appearing or disappearing re-validates the WorkerNodes that refer to it at once;
`resync_loop` re-validates everything every `resync_interval` (one LIST per kind, not one
timer per object) in case a Secret changed. WorkerNodes created by the dispatcher (label
`nodewarden.io/dispatcher`) are validated by the dispatcher in its own status writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any

import kopf

from nodewarden.api.base import GROUP, VERSION, Condition, set_condition
from nodewarden.api.containerdispatch import ContainerDispatchSpec
from nodewarden.api.kinds import CONTAINER_DISPATCH, POWER_INTENT, POWER_POLICY, WORKER_NODE, Kind
from nodewarden.api.powerintent import PowerIntentSpec
from nodewarden.api.powerpolicy import PowerPolicySpec, spec_hash
from nodewarden.api.workernode import WorkerNodeSpec
from nodewarden.dispatch.workers import DISPATCHER_LABEL
from nodewarden.handlers.context import HandlerContext
from nodewarden.kube.client import KubeError
from nodewarden.metrics import INVALID_OBJECTS, RECONCILE_SECONDS, RECONCILE_TOTAL
from nodewarden.units import parse_duration
from nodewarden.validation import (
    Verdict,
    parse_spec,
    validate_containerdispatch,
    validate_powerintent,
    validate_powerpolicy,
    validate_workernode,
)

log = logging.getLogger(__name__)

VALID = "Valid"


def _conditions(status: Mapping[str, Any] | None) -> list[Condition]:
    out = []
    for raw in (status or {}).get("conditions", []) or []:
        try:
            out.append(Condition.model_validate(raw))
        except ValueError:
            continue  # a malformed condition written by someone else is dropped, not fatal
    return out


def _valid_condition(status: Mapping[str, Any] | None) -> Condition | None:
    for cond in _conditions(status):
        if cond.type == VALID:
            return cond
    return None


def status_patch(
    ctx: HandlerContext, body: Mapping[str, Any], verdict: Verdict, extra: Mapping[str, Any]
) -> dict[str, Any]:
    """The status changes for `verdict` (empty if nothing would change)."""
    status = body.get("status") or {}
    generation = body.get("metadata", {}).get("generation")
    current = _valid_condition(status)
    want_status = "True" if verdict.valid else "False"
    patch: dict[str, Any] = {}
    unchanged = (
        current is not None
        and current.status == want_status
        and current.reason == verdict.reason
        and current.message == verdict.message
        and current.observed_generation == generation
    )
    if not unchanged:
        conditions = set_condition(
            _conditions(status),
            VALID,
            verdict.valid,
            verdict.reason,
            verdict.message,
            generation,
            ctx.clock(),
        )
        patch["conditions"] = [c.to_wire() for c in conditions]
    if status.get("observedGeneration") != generation:
        patch["observedGeneration"] = generation
    for key, value in extra.items():
        if status.get(key) != value:
            patch[key] = value
    return patch


async def _apply(
    ctx: HandlerContext,
    kind: Kind,
    body: Mapping[str, Any],
    verdict: Verdict,
    extra: Mapping[str, Any] | None = None,
) -> None:
    meta = body.get("metadata", {})
    patch = status_patch(ctx, body, verdict, extra or {})
    RECONCILE_TOTAL.labels(kind.kind, "ok" if verdict.valid else "invalid").inc()
    if not patch:
        return
    await ctx.kube.patch_status(kind, meta["namespace"], meta["name"], patch)
    previous = _valid_condition(body.get("status"))
    became_invalid = not verdict.valid and (
        previous is None or previous.status != "False" or previous.message != verdict.message
    )
    if became_invalid:
        await ctx.kube.emit_event(
            {"apiVersion": f"{GROUP}/{VERSION}", "kind": kind.kind, **body},
            reason=verdict.reason,
            message=verdict.message,
            type_="Warning",
            action="Validate",
        )
        log.warning(
            "%s %s/%s is invalid: %s",
            kind.kind,
            meta.get("namespace"),
            meta.get("name"),
            verdict.message,
            extra={"reason": verdict.reason},
        )
    elif verdict.valid and previous is not None and previous.status == "False":
        log.info("%s %s/%s is valid again", kind.kind, meta.get("namespace"), meta.get("name"))


async def reconcile_workernode(
    ctx: HandlerContext, body: Mapping[str, Any], policies: Collection[str]
) -> Verdict:
    namespace = body["metadata"]["namespace"]
    parsed = parse_spec(WorkerNodeSpec, body.get("spec"))
    if isinstance(parsed, Verdict):
        verdict = parsed
    else:
        refusals = await ctx.credentials.check(body["metadata"]["name"], parsed)
        verdict = validate_workernode(
            parsed,
            namespace=namespace,
            policies=policies,
            default_policy=ctx.config.default_policy,
            credential_problems=[(r.reason, r.message) for r in refusals],
        )
    await _apply(ctx, WORKER_NODE, body, verdict)
    return verdict


async def reconcile_powerpolicy(
    ctx: HandlerContext, body: Mapping[str, Any], node_count: int
) -> Verdict:
    parsed = parse_spec(PowerPolicySpec, body.get("spec"))
    extra: dict[str, Any] = {"nodes": node_count}
    if isinstance(parsed, Verdict):
        verdict = parsed
    else:
        verdict = validate_powerpolicy(parsed)
        extra["contentHash"] = spec_hash(parsed)
    await _apply(ctx, POWER_POLICY, body, verdict, extra)
    return verdict


async def reconcile_powerintent(
    ctx: HandlerContext, body: Mapping[str, Any], nodes: Collection[str]
) -> Verdict:
    parsed = parse_spec(PowerIntentSpec, body.get("spec"))
    if isinstance(parsed, Verdict):
        verdict = parsed
    else:
        verdict = validate_powerintent(parsed, namespace=body["metadata"]["namespace"], nodes=nodes)
    extra: dict[str, Any] = {}
    if not (body.get("status") or {}).get("phase"):
        extra["phase"] = "Pending"
    await _apply(ctx, POWER_INTENT, body, verdict, extra)
    return verdict


async def reconcile_containerdispatch(ctx: HandlerContext, body: Mapping[str, Any]) -> Verdict:
    parsed = parse_spec(ContainerDispatchSpec, body.get("spec"))
    verdict = parsed if isinstance(parsed, Verdict) else validate_containerdispatch(parsed)
    await _apply(ctx, CONTAINER_DISPATCH, body, verdict)
    return verdict


def _timed(kind: Kind, fn: Callable[..., Awaitable[Verdict]]) -> Callable[..., Awaitable[Verdict]]:
    async def wrapper(*args: Any, **kwargs: Any) -> Verdict:
        start = time.perf_counter()
        try:
            return await fn(*args, **kwargs)
        except KubeError:
            RECONCILE_TOTAL.labels(kind.kind, "error").inc()
            raise
        finally:
            RECONCILE_SECONDS.labels(kind.kind).observe(time.perf_counter() - start)

    return wrapper


async def resync_loop(ctx: HandlerContext, namespace: str) -> None:
    """Re-validate every WorkerNode, PowerPolicy and PowerIntent every `resync_interval`."""
    interval = max(1.0, parse_duration(ctx.config.resync_interval).total_seconds())
    node_reconcile = _timed(WORKER_NODE, reconcile_workernode)
    policy_reconcile = _timed(POWER_POLICY, reconcile_powerpolicy)
    intent_reconcile = _timed(POWER_INTENT, reconcile_powerintent)
    while True:
        await asyncio.sleep(interval)
        try:
            policies = await ctx.kube.list(POWER_POLICY, namespace)
            nodes = await ctx.kube.list(WORKER_NODE, namespace)
            intents = await ctx.kube.list(POWER_INTENT, namespace)
        except KubeError as exc:
            log.warning("re-validation skipped: %s", exc)
            continue
        policy_set = {p["metadata"]["name"] for p in policies}
        node_set = {n["metadata"]["name"] for n in nodes}
        invalid = {WORKER_NODE.kind: 0, POWER_POLICY.kind: 0, POWER_INTENT.kind: 0}
        for node in nodes:
            if DISPATCHER_LABEL in (node["metadata"].get("labels") or {}):
                continue
            node["metadata"].setdefault("namespace", namespace)
            with contextlib.suppress(KubeError):
                if not (await node_reconcile(ctx, node, policy_set)).valid:
                    invalid[WORKER_NODE.kind] += 1
        for policy in policies:
            policy["metadata"].setdefault("namespace", namespace)
            name = policy["metadata"]["name"]
            users = sum(
                1
                for n in nodes
                if ((n.get("spec") or {}).get("policyRef") or {}).get("name") == name
            )
            with contextlib.suppress(KubeError):
                if not (await policy_reconcile(ctx, policy, users)).valid:
                    invalid[POWER_POLICY.kind] += 1
        for intent in intents:
            intent["metadata"].setdefault("namespace", namespace)
            with contextlib.suppress(KubeError):
                if not (await intent_reconcile(ctx, intent, node_set)).valid:
                    invalid[POWER_INTENT.kind] += 1
        for kind, count in invalid.items():
            INVALID_OBJECTS.labels(kind).set(count)


def register(registry: kopf.OperatorRegistry, ctx: HandlerContext, containers: bool = True) -> None:
    """Register the validation handlers into `registry` (ContainerDispatch only if asked)."""
    wn = (GROUP, VERSION, WORKER_NODE.plural)
    pp = (GROUP, VERSION, POWER_POLICY.plural)
    pi = (GROUP, VERSION, POWER_INTENT.plural)
    cd = (GROUP, VERSION, CONTAINER_DISPATCH.plural)
    node_reconcile = _timed(WORKER_NODE, reconcile_workernode)
    policy_reconcile = _timed(POWER_POLICY, reconcile_powerpolicy)
    intent_reconcile = _timed(POWER_INTENT, reconcile_powerintent)
    dispatch_reconcile = _timed(CONTAINER_DISPATCH, reconcile_containerdispatch)

    @kopf.index(*pp, id="nw_policies", registry=registry)  # type: ignore[arg-type]
    def nw_policies(namespace: str, name: str, **_: Any) -> dict[str, str]:
        return {namespace: name}

    @kopf.index(*wn, id="nw_nodes", registry=registry)  # type: ignore[arg-type]
    def nw_nodes(
        namespace: str, name: str, spec: Mapping[str, Any], **_: Any
    ) -> dict[str, tuple[str, str | None]]:
        ref = (spec.get("policyRef") or {}).get("name")
        return {namespace: (name, ref)}

    def policy_names(index: Any, namespace: str) -> set[str]:
        return set(index.get(namespace, []))

    def node_names(index: Any, namespace: str) -> set[str]:
        return {n for n, _ in index.get(namespace, [])}

    # --- WorkerNode ---------------------------------------------------------------------
    unmanaged = {DISPATCHER_LABEL: kopf.ABSENT}

    @kopf.on.resume(*wn, id="workernode_valid", labels=unmanaged, registry=registry)
    @kopf.on.create(*wn, id="workernode_valid", labels=unmanaged, registry=registry)
    @kopf.on.update(*wn, id="workernode_valid", labels=unmanaged, registry=registry)
    async def workernode_valid(body: kopf.Body, **kw: Any) -> None:
        namespace = body.metadata.namespace or ""
        await node_reconcile(ctx, body, policy_names(kw["nw_policies"], namespace))

    # --- PowerPolicy --------------------------------------------------------------------
    @kopf.on.resume(*pp, id="powerpolicy_valid", registry=registry)
    @kopf.on.create(*pp, id="powerpolicy_valid", registry=registry)
    @kopf.on.update(*pp, id="powerpolicy_valid", registry=registry)
    async def powerpolicy_valid(body: kopf.Body, **kw: Any) -> None:
        nw_nodes = kw["nw_nodes"]
        namespace = body.metadata.namespace or ""
        name = body.metadata.name
        users = [n for n, ref in nw_nodes.get(namespace, []) if ref == name]
        await policy_reconcile(ctx, body, len(users))

    @kopf.on.create(*pp, id="powerpolicy_changed_nodes", registry=registry)
    @kopf.on.delete(*pp, id="powerpolicy_changed_nodes", registry=registry, optional=True)
    async def powerpolicy_changed_nodes(body: kopf.Body, reason: str, **kw: Any) -> None:
        """Re-validate the WorkerNodes that refer to a policy that appeared or went away."""
        nw_nodes, nw_policies = kw["nw_nodes"], kw["nw_policies"]
        namespace = body.metadata.namespace or ""
        name = body.metadata.name
        policies = policy_names(nw_policies, namespace)
        if reason == "delete":
            policies.discard(name)
        else:
            policies.add(name or "")
        for node_name, ref in list(nw_nodes.get(namespace, [])):
            if ref != name:
                continue
            node = await ctx.kube.get(WORKER_NODE, namespace, node_name)
            if node is not None:
                await node_reconcile(ctx, node, policies)

    # --- PowerIntent --------------------------------------------------------------------
    @kopf.on.resume(*pi, id="powerintent_valid", registry=registry)
    @kopf.on.create(*pi, id="powerintent_valid", registry=registry)
    async def powerintent_valid(body: kopf.Body, **kw: Any) -> None:
        namespace = body.metadata.namespace or ""
        await intent_reconcile(ctx, body, node_names(kw["nw_nodes"], namespace))

    if not containers:
        return

    # --- ContainerDispatch --------------------------------------------------------------
    @kopf.on.resume(*cd, id="containerdispatch_valid", registry=registry)
    @kopf.on.create(*cd, id="containerdispatch_valid", registry=registry)
    @kopf.on.update(*cd, id="containerdispatch_valid", registry=registry)
    async def containerdispatch_valid(body: kopf.Body, **_: Any) -> None:
        await dispatch_reconcile(ctx, body)
