"""Validation handlers: acknowledge PowerPolicies and PowerIntents and keep their `Valid` condition.

Checks come from `nodewarden.validation` (pure); this module fetches the facts they need
(which nodes exist and which policy each uses -- from the power controller, which holds
every WorkerNode), writes one status patch per reconcile only when something changed, and
posts a Warning Event when an object becomes invalid. A PowerIntent for a node that does
not exist is Failed. `resync_loop` re-validates both kinds every `resync_interval` (one
LIST per kind). WorkerNodes are validated by the power controller (their status has one
writer). ContainerDispatches are validated by the dispatcher in its first write, or, when
no dispatcher runs, by `ContainerValidator` from the ContainerDispatch informer (never by
kopf: it holds no watch on the hot kinds).

One object never stops the others: an error nobody foresaw while judging one object
(`guarded`) is logged with its trace, that object gets `Valid=False
reason=ProcessingFailed` naming the error, and the handler, the resync round or the
validator goes on; the next resync judges it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any, Protocol, TypeVar

import kopf

from nodewarden.api.base import GROUP, VERSION, Condition, set_condition
from nodewarden.api.containerdispatch import ContainerDispatchSpec
from nodewarden.api.kinds import CONTAINER_DISPATCH, POWER_INTENT, POWER_POLICY, Kind
from nodewarden.api.powerintent import TERMINAL_INTENT_PHASES, PowerIntentSpec
from nodewarden.api.powerpolicy import PowerPolicySpec, spec_hash
from nodewarden.handlers.context import HandlerContext
from nodewarden.kube.client import KubeError
from nodewarden.kube.informer import Informer
from nodewarden.kube.store import EventType, ObjectKey
from nodewarden.metrics import INVALID_OBJECTS, RECONCILE_SECONDS, RECONCILE_TOTAL
from nodewarden.units import parse_duration
from nodewarden.validation import (
    Verdict,
    failure_verdict,
    parse_spec,
    validate_containerdispatch,
    validate_powerintent,
    validate_powerpolicy,
)

log = logging.getLogger(__name__)

VALID = "Valid"


async def guarded(
    ctx: HandlerContext, kind: Kind, body: Mapping[str, Any], work: Awaitable[Verdict]
) -> Verdict:
    """`work`'s verdict; if it raises anything but a Kubernetes error, the object is marked
    with `failure_verdict` instead (best effort) and that verdict returned."""
    try:
        return await work
    except (KubeError, asyncio.CancelledError):
        raise
    except Exception as exc:
        return await mark_failed(ctx, kind, body, exc)


async def mark_failed(
    ctx: HandlerContext, kind: Kind, body: Mapping[str, Any], exc: Exception
) -> Verdict:
    """Log `exc` with its trace and mark the object with `failure_verdict` (best effort)."""
    meta = body.get("metadata") or {}
    log.error(
        "%s %s/%s could not be processed",
        kind.kind,
        meta.get("namespace"),
        meta.get("name"),
        exc_info=exc,
    )
    verdict = failure_verdict(exc)
    try:
        await _apply(ctx, kind, body, verdict)
    except Exception as again:  # its status cannot be written either: the log says so
        log.warning("could not mark %s %s: %s", kind.kind, meta.get("name"), type(again).__name__)
    return verdict


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
) -> dict[str, Any] | None:
    """Write the status `verdict` calls for, if it differs; the written object, or None."""
    meta = body.get("metadata", {})
    patch = status_patch(ctx, body, verdict, extra or {})
    RECONCILE_TOTAL.labels(kind.kind, "ok" if verdict.valid else "invalid").inc()
    if not patch:
        return None
    written = await ctx.kube.patch_status(kind, meta["namespace"], meta["name"], patch)
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
    return written


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
    # The power controller owns the phase; validation only fails an intent that cannot be
    # carried out (its node does not exist), which the controller never touches.
    extra: dict[str, Any] = {}
    phase = (body.get("status") or {}).get("phase")
    if not verdict.valid and phase not in TERMINAL_INTENT_PHASES:
        extra["phase"] = "Failed"
        extra["message"] = verdict.message
    await _apply(ctx, POWER_INTENT, body, verdict, extra)
    return verdict


async def reconcile_containerdispatch(
    ctx: HandlerContext, body: Mapping[str, Any]
) -> tuple[Verdict, dict[str, Any] | None]:
    """The verdict on one ContainerDispatch and the object as written (None: no write)."""
    parsed = parse_spec(ContainerDispatchSpec, body.get("spec"))
    verdict = parsed if isinstance(parsed, Verdict) else validate_containerdispatch(parsed)
    return verdict, await _apply(ctx, CONTAINER_DISPATCH, body, verdict)


R = TypeVar("R")


def _timed(kind: Kind, fn: Callable[..., Awaitable[R]]) -> Callable[..., Awaitable[R]]:
    async def wrapper(*args: Any, **kwargs: Any) -> R:
        start = time.perf_counter()
        try:
            return await fn(*args, **kwargs)
        except KubeError:
            RECONCILE_TOTAL.labels(kind.kind, "error").inc()
            raise
        finally:
            RECONCILE_SECONDS.labels(kind.kind).observe(time.perf_counter() - start)

    return wrapper


async def resync_loop(ctx: HandlerContext, namespace: str, fleet: NodeIndex) -> None:
    """Re-validate every PowerPolicy and PowerIntent every `resync_interval`; one object
    (or one round) that fails is logged and marked, never the end of the loop."""
    interval = max(1.0, parse_duration(ctx.config.resync_interval).total_seconds())
    while True:
        await asyncio.sleep(interval)
        try:
            await resync_once(ctx, namespace, fleet)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("re-validation round failed; the next one runs in %.0fs", interval)


async def resync_once(ctx: HandlerContext, namespace: str, fleet: NodeIndex) -> None:
    """One re-validation of every PowerPolicy and PowerIntent (one LIST per kind)."""
    policy_reconcile = _timed(POWER_POLICY, reconcile_powerpolicy)
    intent_reconcile = _timed(POWER_INTENT, reconcile_powerintent)
    try:
        policies = await ctx.kube.list(POWER_POLICY, namespace)
        intents = await ctx.kube.list(POWER_INTENT, namespace)
    except KubeError as exc:
        log.warning("re-validation skipped: %s", exc)
        return
    await fleet.synced()
    users = fleet.policy_users()
    invalid = {POWER_POLICY.kind: 0, POWER_INTENT.kind: 0}
    for policy in policies:
        policy["metadata"].setdefault("namespace", namespace)
        name = policy["metadata"].get("name")
        with contextlib.suppress(KubeError):
            work = policy_reconcile(ctx, policy, users.get(name, 0))
            if not (await guarded(ctx, POWER_POLICY, policy, work)).valid:
                invalid[POWER_POLICY.kind] += 1
    for intent in intents:
        intent["metadata"].setdefault("namespace", namespace)
        with contextlib.suppress(KubeError):
            work = _judge_intent(intent_reconcile, ctx, fleet, intent)
            if not (await guarded(ctx, POWER_INTENT, intent, work)).valid:
                invalid[POWER_INTENT.kind] += 1
    for kind, count in invalid.items():
        INVALID_OBJECTS.labels(kind).set(count)


async def _judge_intent(
    reconcile: Callable[..., Awaitable[Verdict]],
    ctx: HandlerContext,
    fleet: NodeIndex,
    body: Mapping[str, Any],
) -> Verdict:
    return await reconcile(ctx, body, await _nodes_for(fleet, body))


async def _nodes_for(fleet: NodeIndex, body: Mapping[str, Any]) -> set[str]:
    """The intent's node, if it exists (never judged before the fleet is known: an intent
    failed for a node the operator had not listed yet could never recover)."""
    name = (body.get("spec") or {}).get("nodeName")
    if not isinstance(name, str) or not name:
        return set()
    phase = (body.get("status") or {}).get("phase")
    if phase in TERMINAL_INTENT_PHASES and phase != "Failed":
        return {name}  # history (e.g. the shutdown of a VM since destroyed): not judged again
    return {name} if await fleet.node_exists(name) else set()


class NodeIndex(Protocol):
    """What validation needs to know of the WorkerNodes (the power controller holds them)."""

    def node_names(self) -> set[str]: ...

    def policy_users(self) -> dict[str, int]: ...

    async def synced(self) -> None:
        """Return once the index holds the whole fleet."""

    async def node_exists(self, name: str) -> bool:
        """Known, or found by a live read (an event still on its way)."""


class ContainerValidator:
    """ContainerDispatch validation from the informer, for an operator without a dispatcher.

    The informer's handler only notes which containers changed; `run` reads each one's
    latest compact body from the store and writes its `Valid` condition and
    observedGeneration through `_apply` when they differ from what the verdict calls for,
    then folds the written object back into the store. A container is never handled twice
    at once, and the fold makes the next look at it see the write, so each change costs
    at most one write (none when the status already says it).
    """

    def __init__(self, ctx: HandlerContext, concurrency: int = 8, retry_after: float = 5.0) -> None:
        self.ctx = ctx
        self.concurrency = concurrency
        self.retry_after = retry_after
        self._informer: Informer[dict[str, Any]] | None = None
        self._changed: set[ObjectKey] = set()
        self._wake = asyncio.Event()
        self._reconcile = _timed(CONTAINER_DISPATCH, reconcile_containerdispatch)

    def attach(self, informer: Informer[dict[str, Any]]) -> None:
        """Read containers from `informer` (whose handler is `on_change`)."""
        self._informer = informer

    def on_change(
        self, etype: EventType, old: dict[str, Any] | None, new: dict[str, Any] | None
    ) -> None:
        body = new if new is not None else old
        assert body is not None
        meta = body["metadata"]
        key = ObjectKey(meta.get("namespace") or "", meta["name"])
        if new is None:
            self._changed.discard(key)
            return
        self._changed.add(key)
        self._wake.set()

    def _retry(self, key: ObjectKey) -> None:
        self._changed.add(key)
        self._wake.set()

    async def run(self) -> None:
        """Validate changed containers until cancelled."""
        gate = asyncio.Semaphore(self.concurrency)

        async def one(key: ObjectKey) -> None:
            async with gate:
                await self._validate(key)

        while True:
            await self._wake.wait()
            self._wake.clear()
            batch, self._changed = self._changed, set()
            await asyncio.gather(*(one(key) for key in batch))

    async def _validate(self, key: ObjectKey) -> None:
        assert self._informer is not None
        body = self._informer.store.get(key.namespace, key.name)
        if body is None:
            return
        try:
            _, written = await self._reconcile(self.ctx, body)
        except KubeError as exc:
            log.warning(
                "validation of ContainerDispatch %s/%s failed (retrying in %.0fs): %s",
                *key,
                self.retry_after,
                exc,
            )
            asyncio.get_running_loop().call_later(self.retry_after, self._retry, key)
            return
        except Exception as exc:
            await mark_failed(self.ctx, CONTAINER_DISPATCH, body, exc)
            return
        if written is not None:
            self._informer.fold(written)


def register(
    registry: kopf.OperatorRegistry,
    ctx: HandlerContext,
    fleet: NodeIndex,
) -> None:
    """Register the PowerPolicy and PowerIntent validation handlers into `registry`."""
    pp = (GROUP, VERSION, POWER_POLICY.plural)
    pi = (GROUP, VERSION, POWER_INTENT.plural)
    policy_reconcile = _timed(POWER_POLICY, reconcile_powerpolicy)
    intent_reconcile = _timed(POWER_INTENT, reconcile_powerintent)

    # --- PowerPolicy --------------------------------------------------------------------
    @kopf.on.resume(*pp, id="powerpolicy_valid", registry=registry)
    @kopf.on.create(*pp, id="powerpolicy_valid", registry=registry)
    @kopf.on.update(*pp, id="powerpolicy_valid", registry=registry)
    async def powerpolicy_valid(body: kopf.Body, **_: Any) -> None:
        name = body.metadata.name or ""
        work = policy_reconcile(ctx, body, fleet.policy_users().get(name, 0))
        await guarded(ctx, POWER_POLICY, body, work)

    # --- PowerIntent --------------------------------------------------------------------
    @kopf.on.resume(*pi, id="powerintent_valid", registry=registry)
    @kopf.on.create(*pi, id="powerintent_valid", registry=registry)
    async def powerintent_valid(body: kopf.Body, **_: Any) -> None:
        await guarded(ctx, POWER_INTENT, body, _judge_intent(intent_reconcile, ctx, fleet, body))
