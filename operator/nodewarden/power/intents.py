"""PowerIntents: the manual ones people create, the policy-made ones the controller opens.

Every transition of the state machine has a PowerIntent whose status is its Safety Record:
a person's intent (source Manual) when one asked for it, else one the controller creates
(source Policy, named `<node>-<transition id>`). `IntentBook` keeps the live manual
intents per node in creation order -- the first one not finished is the node's active
intent (the machine's `facts.intent`), later ones wait behind it (phase Pending, with a
message naming the one ahead) -- and writes intent status only when something a person
reads changed (phase, decision, reasons, message), so a transition waiting for its
confirmation costs no writes.

Phases (docs/state-machine.md, "PowerIntent phases"): Pending -> Deferred / InProgress ->
Succeeded | Blocked | Aborted | Superseded | Failed, and Shadow for decisions a policy in
Shadow mode records without acting. A manual Drain intent keeps the node's admission
closed for as long as it exists; its phase becomes Succeeded once the node has drained.
Finished policy-made intents are kept (`keep_finished` per node) and then deleted.

Per-node work is bounded by the node's own intents: an index by node holds only the
manual intents still applied to it (not finished, or a drained Drain), so finding a
node's active and waiting intents never looks at the rest of the fleet's. Finished
manual intents are audit records (a person's override, a ForceOff): they stay, unless
deleting them is switched on (`ManualRetention`), then each is deleted once it has been
finished for the retention (90 days by default), found through a heap ordered by when
it finished -- never by scanning.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import re
from collections import deque
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from pydantic import ValidationError

from nodewarden.api.kinds import POWER_INTENT
from nodewarden.api.powerintent import TERMINAL_INTENT_PHASES, PowerAction, PowerIntentSpec
from nodewarden.kube.client import Kube, KubeError, NotFound
from nodewarden.kube.requesters import NOT_CHECKED, RequesterAdmission
from nodewarden.metrics import STATUS_WRITES
from nodewarden.policy.facts import ManualIntent, OverrideRequest
from nodewarden.policy.reasons import ReasonCode
from nodewarden.policy.record import SafetyRecord
from nodewarden.units import parse_rfc3339, rfc3339

log = logging.getLogger(__name__)

_NAME_OK = re.compile(r"[^a-z0-9.-]+")


_iso = rfc3339
_parse_time = parse_rfc3339


@dataclass
class Intent:
    """One PowerIntent as the controller tracks it."""

    name: str
    node: str
    action: PowerAction
    source: str
    requested_by: str
    reason: str
    override: OverrideRequest | None
    created: datetime
    phase: str | None = None
    written: dict[str, Any] = field(default_factory=dict)
    started_at: datetime | None = None
    finished_at: datetime | None = None
    asked_phase: str | None = None
    """The phase last decided for it (its write may still be in flight): `settled`."""

    @property
    def finished(self) -> bool:
        return self.phase in TERMINAL_INTENT_PHASES

    @property
    def settled(self) -> bool:
        """Finished, or a finishing phase was decided and its write is on its way: no
        later step may give it another phase (writes land in the order asked, so a
        later one would replace the finishing phase on the server)."""
        return self.finished or self.asked_phase in TERMINAL_INTENT_PHASES

    @property
    def holds(self) -> bool:
        """Still applied to its node: not finished, or a Drain that exists."""
        return not self.finished or (self.action == "Drain" and self.phase == "Succeeded")

    def manual(self, requester_verified: bool = False) -> ManualIntent:
        """The machine's view of this intent; `requester_verified`: the requester
        admission policy is in force (requested_by is the authenticated user)."""
        return ManualIntent(
            source=f"PowerIntent/{self.name}",
            observed_at=self.created,
            name=self.name,
            action=self.action,
            requested_by=self.requested_by,
            requester_verified=requester_verified,
            reason=self.reason[:2048],
            override=self.override,
        )


@dataclass(frozen=True, slots=True)
class ManualRetention:
    """Whether finished manual intents are deleted, and after how long (operator config
    `power.delete_finished_manual_intents` / `power.finished_manual_intent_retention`)."""

    delete: bool = False
    after: timedelta = timedelta(days=90)


class IntentBook:
    """See the module docstring. One per controller."""

    def __init__(
        self,
        kube: Kube,
        namespace: str,
        dispatcher_id: str,
        keep_finished: int = 5,
        manual_retention: ManualRetention | None = None,
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.dispatcher_id = dispatcher_id
        self.keep_finished = keep_finished
        self.manual_retention = manual_retention or ManualRetention()
        self.intents: dict[str, Intent] = {}
        self._applied: dict[str, dict[str, Intent]] = {}
        """node -> the manual intents still applied to it, by name (see `_index`)."""
        self._applied_node: dict[str, str] = {}
        """name -> the node whose entry of `_applied` holds it."""
        self._finished_manual: list[tuple[datetime, str]] = []
        """Heap of (finished at, name) of finished manual intents (deleted on opt-in)."""
        self._filed_finished: dict[str, datetime] = {}
        """name -> the time it is filed under in `_finished_manual`."""
        self.requester = f"nodewarden/{dispatcher_id}"
        """spec.requestedBy of the intents the controller makes: the operator's user name
        (`set_requester`), which the requester admission policy admits for source Policy."""
        self.admission: RequesterAdmission = NOT_CHECKED
        """Whether manual intents' requesters are verified at admission (last check)."""
        self._finished_policy: dict[str, deque[str]] = {}
        self._gone_since: dict[str, datetime] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._open_policy: set[str] = set()
        """Names of the policy-made intents not finished (see `abandoned`)."""
        self._created: set[str] = set()
        """Names of the policy-made intents this book created (this replica's)."""
        self.writes = 0

    # -- the watch ----------------------------------------------------------------------

    def observe(self, body: Mapping[str, Any], deleted: bool = False) -> str | None:
        """Fold a PowerIntent event in; returns the node it concerns (None if invalid)."""
        meta = body.get("metadata") or {}
        name = meta.get("name")
        if not name:
            return None
        if deleted:
            self._locks.pop(name, None)
            gone = self._drop(name)
            return gone.node if gone is not None else None
        try:
            spec = PowerIntentSpec.model_validate(body.get("spec") or {})
        except ValidationError:
            return None  # its Valid condition (validation handler) says why
        status = body.get("status") or {}
        created = _parse_time(meta.get("creationTimestamp")) or datetime.now().astimezone()
        known = self.intents.get(name)
        override = None
        if spec.override is not None:
            override = OverrideRequest(
                inhibitors=spec.override.inhibitors,
                force_off=spec.override.force_off,
                recorded_identity=spec.override.recorded_identity,
                justification=spec.override.justification,
            )
        intent = Intent(
            name=name,
            node=spec.node_name,
            action=spec.action,
            source=spec.source,
            requested_by=spec.requested_by,
            reason=spec.reason,
            override=override,
            created=created,
            phase=status.get("phase"),
            # what the server holds of the records: a later record replaces it key by key
            written=(
                known.written
                if known is not None
                else {k: status[k] for k in RECORD_KEYS if isinstance(status.get(k), dict)}
            ),
            started_at=_parse_time(status.get("startedAt")),
            finished_at=_parse_time(status.get("finishedAt")),
            asked_phase=known.asked_phase if known is not None else None,
        )
        if known is not None and known.phase in TERMINAL_INTENT_PHASES and not intent.phase:
            intent.phase = known.phase  # our own write not seen yet
        if known is not None and intent.finished_at is None:
            intent.finished_at = known.finished_at
        self.intents[name] = intent
        self._index(intent)
        self._file_policy(intent)
        if intent.source == "Policy" and intent.finished:
            self._remember_finished(intent)
        return intent.node

    # -- the index by node ----------------------------------------------------------------

    def _index(self, intent: Intent) -> None:
        """File `intent` (the book's current object for its name) by what it is now: in
        its node's entry of the index while it is a manual intent still applied, in the
        heap of finished manual intents once it is finished and no longer applied."""
        name = intent.name
        indexed = self._applied_node.get(name)
        if indexed is not None and (indexed != intent.node or not intent.holds):
            self._unindex(name)
        if intent.source != "Manual":
            return
        if intent.holds:
            self._applied.setdefault(intent.node, {})[name] = intent
            self._applied_node[name] = intent.node
        elif self.manual_retention.delete:
            at = intent.finished_at or intent.created
            if self._filed_finished.get(name) != at:
                self._filed_finished[name] = at
                heapq.heappush(self._finished_manual, (at, name))

    def _unindex(self, name: str) -> None:
        node = self._applied_node.pop(name, None)
        if node is None:
            return
        entry = self._applied.get(node)
        if entry is not None:
            entry.pop(name, None)
            if not entry:
                del self._applied[node]

    def _file_policy(self, intent: Intent) -> None:
        if intent.source == "Policy" and not intent.finished:
            self._open_policy.add(intent.name)
        else:
            self._open_policy.discard(intent.name)

    def _drop(self, name: str) -> Intent | None:
        """Forget an intent (deleted, or gone from the API server)."""
        self._unindex(name)
        self._open_policy.discard(name)
        self._created.discard(name)
        self._filed_finished.pop(name, None)
        return self.intents.pop(name, None)

    def set_requester(self, username: str | None) -> None:
        if username:
            self.requester = username

    def manual_fact(self, intent: Intent) -> ManualIntent:
        return intent.manual(requester_verified=self.admission.enforced)

    # -- who is active --------------------------------------------------------------------

    def manual_for(self, node: str) -> list[Intent]:
        """The node's manual intents still applied (not finished, or a drained Drain), in
        creation order: O(the node's own), whatever the book holds."""
        out = list(self._applied.get(node, {}).values())
        out.sort(key=lambda i: (i.created, i.name))
        return out

    def active(self, node: str) -> Intent | None:
        """The manual intent the node's machine acts on (first still applied)."""
        applied = self.manual_for(node)
        return applied[0] if applied else None

    def waiting(self, node: str) -> list[Intent]:
        """Live manual intents queued behind the active one."""
        applied = self.manual_for(node)
        return [i for i in applied[1:] if not i.finished]

    # -- writes ---------------------------------------------------------------------------

    async def write(self, intent: Intent, fields: Mapping[str, Any]) -> None:
        """Patch the intent's status with the fields that changed (none: no write).
        Writes of one intent run one at a time, in the order they were asked for: two in
        flight at once could land in the wrong order and leave an older phase or record."""
        lock = self._locks.setdefault(intent.name, asyncio.Lock())
        async with lock:
            await self._write(intent, fields)

    async def _write(self, intent: Intent, fields: Mapping[str, Any]) -> None:
        changed = {k: v for k, v in fields.items() if intent.written.get(k) != v}
        if not changed:
            return
        patch = dict(changed)
        for key in RECORD_KEYS:
            old = intent.written.get(key)
            if key in patch and isinstance(old, dict) and isinstance(patch[key], dict):
                patch[key] = replacing(old, patch[key])
        try:
            self.writes += 1
            STATUS_WRITES.labels("PowerIntent").inc()
            await self.kube.patch_status(POWER_INTENT, self.namespace, intent.name, patch)
        except NotFound:
            self._drop(intent.name)
            return
        except KubeError as exc:
            log.warning("status write of PowerIntent %s failed: %s", intent.name, exc)
            if intent.asked_phase == changed.get("phase"):
                intent.asked_phase = intent.phase  # not settled: the next step writes it
            return
        intent.written.update(changed)
        finished_at = _parse_time(changed.get("finishedAt"))
        if finished_at is not None:
            intent.finished_at = finished_at
        if "phase" in changed:
            intent.phase = changed["phase"]
            current = self.intents.get(intent.name)
            if current is not None:
                current.phase = changed["phase"]
                current.finished_at = intent.finished_at or current.finished_at
                self._index(current)
                self._file_policy(current)
        if intent.source == "Policy" and intent.finished:
            self._remember_finished(intent)
            await self._expire(intent.node)

    async def create_policy_intent(
        self, node: str, transition_id: str, action: PowerAction, reason: str, at: datetime
    ) -> Intent:
        """A policy-made PowerIntent for a transition the controller opened."""
        name = policy_intent_name(node, transition_id)
        body = {
            "metadata": {
                "name": name,
                "labels": {
                    "app.kubernetes.io/managed-by": "nodewarden",
                    "nodewarden.io/node": node[:63],
                },
            },
            "spec": {
                "nodeName": node,
                "action": action,
                "source": "Policy",
                "requestedBy": self.requester,
                "reason": reason[:2048],
            },
        }
        intent = Intent(
            name=name,
            node=node,
            action=action,
            source="Policy",
            requested_by=self.requester,
            reason=reason,
            override=None,
            created=at,
            started_at=at,
        )
        self.intents[name] = intent
        self._created.add(name)
        self._open_policy.add(name)
        try:
            await self.kube.create(POWER_INTENT, self.namespace, body)
        except KubeError as exc:
            if getattr(exc, "status", None) != 409:  # exists: a resumed transition
                log.warning("could not create PowerIntent %s: %s", name, exc)
        return intent

    # -- abandoned transitions --------------------------------------------------------------

    def abandoned(self, transition_intent: Callable[[str], str | bool | None]) -> list[Intent]:
        """Open policy-made intents that no transition stands for: a replica created the
        intent and stopped (SIGKILL, lost Lease) before it recorded the transition on the
        WorkerNode, so the replica that took over never resumes it and no power request
        of it was ever sent (requests are persisted on the WorkerNode first).
        `transition_intent(node)`: the intent of the node's current transition, None if
        it has none, False if the node is not one of this install's (left alone).
        Intents this book created, and those being written, are never abandoned: their
        transitions are this replica's own. O(open policy-made intents)."""
        out = []
        for name in sorted(self._open_policy - self._created):
            intent = self.intents.get(name)
            lock = self._locks.get(name)
            if intent is None or intent.finished or (lock is not None and lock.locked()):
                continue
            current = transition_intent(intent.node)
            if current is not False and current != name:
                out.append(intent)
        return out

    async def abandon(self, intent: Intent, now: datetime) -> None:
        """Close an abandoned intent (`abandoned`) as Aborted, TRANSITION_ABORTED."""
        lock = self._locks.setdefault(intent.name, asyncio.Lock())
        async with lock:
            current = self.intents.get(intent.name)
            if current is None or current.finished:
                return  # finished meanwhile
            log.info("PowerIntent %s: its transition was never recorded; aborted", intent.name)
            await self._write(
                current,
                {
                    "phase": "Aborted",
                    "finishedAt": _iso(now),
                    "reasons": [ReasonCode.TRANSITION_ABORTED.value],
                    "message": (
                        "aborted: the replica that opened this transition stopped before "
                        f"recording it on WorkerNode {current.node}, so no power request "
                        "of it was sent; the node's machine decides afresh"
                    ),
                },
            )

    async def expire_manual(self, now: datetime) -> int:
        """Delete the finished manual intents whose retention is over, when deleting them
        is switched on; returns how many were deleted. Cost: those due, never the rest."""
        retention = self.manual_retention
        deleted = 0
        while (
            retention.delete
            and self._finished_manual
            and now - self._finished_manual[0][0] >= retention.after
        ):
            at, name = heapq.heappop(self._finished_manual)
            intent = self.intents.get(name)
            if self._filed_finished.get(name) != at or intent is None or intent.holds:
                continue  # gone, or filed again under another time
            self._drop(name)
            try:
                await self.kube.delete(POWER_INTENT, self.namespace, name)
                deleted += 1
                log.info("deleted PowerIntent %s: finished at %s, retention over", name, at)
            except KubeError as exc:
                log.info("could not delete finished PowerIntent %s: %s", name, exc)
        return deleted

    def _remember_finished(self, intent: Intent) -> None:
        done = self._finished_policy.setdefault(intent.node, deque())
        if intent.name not in done:
            done.append(intent.name)

    async def expire_gone(
        self, live_nodes: Collection[str], now: datetime, keep_for: timedelta
    ) -> int:
        """Delete the finished policy-made intents of nodes that no longer exist once they
        have been gone for `keep_for` (a churning cloud fleet would otherwise pile them up;
        manual intents are a person's and are kept). Returns how many were deleted."""
        nodes = {i.node for i in self.intents.values() if i.source == "Policy" and i.finished}
        for node in list(self._gone_since):
            if node in live_nodes:
                del self._gone_since[node]
        deleted = 0
        for node in nodes - set(live_nodes):
            since = self._gone_since.setdefault(node, now)
            if now - since < keep_for:
                continue
            for intent in [
                i
                for i in self.intents.values()
                if i.node == node and i.source == "Policy" and i.finished
            ]:
                self.intents.pop(intent.name, None)
                try:
                    await self.kube.delete(POWER_INTENT, self.namespace, intent.name)
                    deleted += 1
                except KubeError as exc:
                    log.info("could not delete PowerIntent %s: %s", intent.name, exc)
            self._finished_policy.pop(node, None)
            self._gone_since.pop(node, None)
        return deleted

    async def _expire(self, node: str) -> None:
        done = self._finished_policy.get(node)
        while done is not None and len(done) > self.keep_finished:
            name = done.popleft()
            self.intents.pop(name, None)
            try:
                await self.kube.delete(POWER_INTENT, self.namespace, name)
            except KubeError as exc:
                log.info("could not delete finished PowerIntent %s: %s", name, exc)


def policy_intent_name(node: str, transition_id: str) -> str:
    """`<node>-<transition id>`, DNS-subdomain safe and at most 253 characters."""
    name = _NAME_OK.sub("-", f"{node}-{transition_id}".lower()).strip("-.")
    return name[:253].rstrip("-.")


RECORD_KEYS = ("safetyRecord", "requestRecord")
"""Status fields holding a whole Safety Record (replaced, never merged, by a later one)."""


def replacing(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON merge patch turning `old` into exactly `new`: keys `new` lacks become null
    (a merge patch would otherwise keep them), nested objects likewise."""
    out: dict[str, Any] = {}
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            out[key] = replacing(before, value)
        else:
            out[key] = value
    for key in old:
        if key not in new:
            out[key] = None
    return out


def record_fields(record: SafetyRecord) -> dict[str, Any]:
    """The intent status fields of a record (the full record and its headline)."""
    return {
        "decision": record.decision.value,
        "reasons": [r.value for r in record.reasons],
        "safetyRecord": record.to_status(),
        "transitionId": record.transition_id,
        "deadline": _iso(record.deadline),
        "recheckAt": _iso(record.recheck_at),
        "retries": record.request.retries_used if record.request is not None else 0,
    }


def shadow_fields(record: SafetyRecord, message: str, at: datetime) -> dict[str, Any]:
    """The status of a PowerIntent in phase Shadow: the record of what would have been
    done, its reasons with SHADOW_MODE, started and finished at once."""
    fields = record_fields(record)
    fields["reasons"] = [*fields["reasons"], "SHADOW_MODE"]
    fields.update(phase="Shadow", message=message, startedAt=_iso(at), finishedAt=_iso(at))
    return fields
