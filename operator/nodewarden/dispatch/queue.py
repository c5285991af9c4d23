"""The container queue: an in-memory view of ContainerDispatch objects and their status writes.

Objects arrive from the ContainerDispatch informer (`observe`, compact bodies shared
with the informer's store: read-only); a newer resourceVersion always wins, so an event
older than a write we already applied is ignored. Every status change goes through
`write`, which sends one merge patch (with a resourceVersion precondition when locking,
so two dispatchers can never both lock a container) and folds the answer back: into the
informer (`fold`), which hands it to `observe`.

Phases: Queued -> Locked -> Running -> Complete / Cancelled / Failed. A Locked container
has a node. No finalizer is set (a finalizer cannot ride on a status write, so it would
cost two writes per container): deleting a ContainerDispatch leaves no runner behind
because the dispatcher kills any runner whose container is in no ContainerDispatch, at
once on the DELETED event and at the first probe round after a restart. Objects from
before that still carry `LEGACY_FINALIZER` lose it once terminal or deleting.

Unique uuids: nothing but the dispatcher can make a container's uuid unique (CEL sees one
object), so the queue judges it. Of the objects that share a `spec.uuid`, the first
(earliest creationTimestamp; within the same second one the dispatcher already acted on,
then the name) is the container; every later one is a *duplicate*: marked
`Valid=False DuplicateUuid` (`mark_duplicates`) and invisible to the dispatcher (never
scheduled, adopted or cancelled: iteration and `by_uuid` skip it), so a copy of another
user's uuid cannot act on that container's runner. When the first is deleted the
duplicates are judged again: the next becomes the container -- unless the first was
deleted while a runner may still run for it (Locked/Running), whose uuid a newcomer must
not inherit; those stay duplicates (delete and re-create them once it has ended).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from nodewarden.api.base import GROUP, VERSION, Condition, set_condition
from nodewarden.api.containerdispatch import (
    TERMINAL_PHASES,
    ContainerDispatchSpec,
    ContainerDispatchStatus,
)
from nodewarden.api.kinds import CONTAINER_DISPATCH
from nodewarden.kube.client import Conflict, FencedOut, Kube, KubeError, NotFound
from nodewarden.metrics import KUBE_CONFLICTS, KUBE_REQUESTS

log = logging.getLogger(__name__)

LEGACY_FINALIZER = "nodewarden.io/runner-cleanup"
"""Set on Locked containers by earlier releases; only ever removed now."""
DUPLICATE_UUID = "DuplicateUuid"
"""Reason of the `Valid=False` condition of a container whose uuid another one holds."""
_MAY_HAVE_RUNNER = frozenset({"Locked", "Running"})


def _rv(body: Mapping[str, Any]) -> int:
    try:
        return int(body.get("metadata", {}).get("resourceVersion") or 0)
    except ValueError:
        return 0


@dataclass
class Container:
    """One ContainerDispatch as the dispatcher knows it."""

    name: str
    namespace: str
    body: Mapping[str, Any]
    """The compact body (shared with the informer's store: read-only)."""
    spec: ContainerDispatchSpec | None
    status: ContainerDispatchStatus
    problem: str | None = None  # spec did not parse (the schema should prevent this)
    first_term_at: datetime | None = None
    last_term_at: datetime | None = None
    status_written_at: datetime | None = None
    """When this dispatcher last wrote this container's status (in memory only)."""
    duplicate_of: str | None = None
    """The name of the container that holds this one's uuid (None: this one holds it)."""
    duplicate_reason: str = ""

    @property
    def uuid(self) -> str:
        return self.spec.uuid if self.spec else f"invalid:{self.name}"

    @property
    def uid(self) -> str | None:
        """metadata.uid: the runner records it (one object, one runner)."""
        uid = self.body.get("metadata", {}).get("uid")
        return str(uid) if uid else None

    @property
    def phase(self) -> str | None:
        return self.status.phase

    @property
    def terminal(self) -> bool:
        return self.status.phase in TERMINAL_PHASES

    @property
    def deleting(self) -> bool:
        return bool(self.body.get("metadata", {}).get("deletionTimestamp"))

    @property
    def finalizers(self) -> list[str]:
        return list(self.body.get("metadata", {}).get("finalizers") or [])

    @property
    def generation(self) -> int | None:
        gen = self.body.get("metadata", {}).get("generation")
        return int(gen) if gen is not None else None

    @property
    def cancel_requested(self) -> bool:
        return bool(self.spec and self.spec.cancel) or self.deleting

    @property
    def resource_version(self) -> str:
        return str(self.body.get("metadata", {}).get("resourceVersion", ""))

    def seniority(self) -> tuple[str, int, str]:
        """Order among objects of one uuid: created first, then acted on, then by name."""
        created = str(self.body.get("metadata", {}).get("creationTimestamp") or "")
        return created, 0 if self.phase not in (None, "Queued") else 1, self.name

    def valid_condition(self) -> tuple[str, str, str] | None:
        """(status, reason, message) of the Valid condition this generation carries."""
        for cond in self.status.conditions:
            if cond.type == "Valid" and cond.observed_generation == self.generation:
                return str(cond.status), cond.reason, cond.message
        return None


@dataclass
class ContainerQueue:
    kube: Kube
    namespace: str
    dispatcher_id: str
    writes: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(16))
    background_writes: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(4))
    """A lane for acknowledgements and scheduling-status chatter, so a burst of them (a
    thousand new containers) never delays the writes that start or finish containers."""
    by_name: dict[str, Container] = field(default_factory=dict)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    version: int = 0
    """Bumped whenever the cache changes (`observe`): the dispatcher plans again only
    when it moved (`dispatch.replan`)."""
    api_writes: int = 0
    fold: Callable[[Mapping[str, Any]], bool] | None = None
    """Where an object returned by a write goes (the ContainerDispatch informer, which
    hands it back through `observe`); None: straight to `observe`."""
    _names_by_uuid: dict[str, set[str]] = field(default_factory=dict)
    _inherited: set[str] = field(default_factory=set)
    """uuids whose first object was deleted while a runner may still run for it."""
    _marking: set[str] = field(default_factory=set)
    marks_due: bool = False
    """Some object's DuplicateUuid mark may need writing or clearing (`mark_duplicates`)."""

    # --- cache --------------------------------------------------------------------------

    def observe(self, body: Mapping[str, Any], deleted: bool = False) -> None:
        """Fold a watched or listed object into the cache (newer resourceVersion wins)."""
        meta = body.get("metadata", {})
        name = meta.get("name")
        if not name or (meta.get("namespace") or self.namespace) != self.namespace:
            return
        current = self.by_name.get(name)
        if deleted:
            if current is not None and _rv(body) >= _rv(current.body):
                del self.by_name[name]
                self._unindex(current)
                self.version += 1
                self.changed.set()
            return
        if current is not None and _rv(body) < _rv(current.body):
            return
        if current is None or not (_rv(body) == _rv(current.body) > 0):
            self.version += 1  # not a resync's copy of the version held
        parsed = self._parse(body, current)
        self.by_name[name] = parsed
        if current is not None and current.spec is not None and current.uuid != parsed.uuid:
            self._unindex(current)
        if parsed.spec is not None:
            self._names_by_uuid.setdefault(parsed.uuid, set()).add(name)
            self._judge(parsed.uuid)
            marked = parsed.valid_condition()
            if marked is not None and marked[1] == DUPLICATE_UUID:
                self.marks_due = True
        self.changed.set()

    # --- unique uuids -------------------------------------------------------------------

    def _unindex(self, c: Container) -> None:
        if c.spec is None:
            return
        names = self._names_by_uuid.get(c.uuid)
        if names is None:
            return
        names.discard(c.name)
        if not names:
            del self._names_by_uuid[c.uuid]
            self._inherited.discard(c.uuid)
            return
        if c.duplicate_of is None and c.phase in _MAY_HAVE_RUNNER:
            self._inherited.add(c.uuid)  # its runner may outlive it: nobody inherits it
        self._judge(c.uuid)

    def _judge(self, uuid: str) -> None:
        members = sorted(
            (self.by_name[n] for n in self._names_by_uuid.get(uuid, ()) if n in self.by_name),
            key=Container.seniority,
        )
        if not members:
            return
        first = members[0]
        if len(members) == 1 and uuid not in self._inherited and first.duplicate_of is None:
            return  # the common case: one object, one uuid
        self.marks_due = True
        if uuid in self._inherited and first.phase not in _MAY_HAVE_RUNNER:
            for c in members:
                c.duplicate_of, c.duplicate_reason = (
                    "(deleted)",
                    (
                        f"spec.uuid: {uuid} was the uuid of a ContainerDispatch deleted while it "
                        "was Locked or Running; its runner may still run, so this object never "
                        "takes it over. Delete this object and create it again once that "
                        "container has ended"
                    ),
                )
            return
        first.duplicate_of, first.duplicate_reason = None, ""
        for c in members[1:]:
            c.duplicate_of = first.name
            c.duplicate_reason = (
                f"spec.uuid: {uuid} is the uuid of ContainerDispatch {first.name!r}, created "
                "earlier; this object is never scheduled, adopted or cancelled. Delete it, "
                "or create it again with a uuid of its own"
            )

    def duplicates(self) -> list[Container]:
        """The objects whose uuid another one holds (see the module docstring)."""
        return [c for c in self.by_name.values() if c.duplicate_of is not None]

    async def mark_duplicates(self) -> None:
        """Write `Valid=False DuplicateUuid` on each duplicate that does not carry it yet,
        and `Valid=True` on a former duplicate that now holds its uuid (background lane)."""
        self.marks_due = False
        for c in list(self.by_name.values()):
            if c.spec is None or c.name in self._marking:
                continue
            current = c.valid_condition()
            if c.duplicate_of is not None:
                if current == ("False", DUPLICATE_UUID, c.duplicate_reason):
                    continue
                valid, reason, message = False, DUPLICATE_UUID, c.duplicate_reason
            elif current is not None and current[1] == DUPLICATE_UUID:
                valid, reason, message = True, "Valid", "spec is valid"
            else:
                continue
            self._marking.add(c.name)
            try:
                status: dict[str, Any] = {
                    "observedGeneration": c.generation,
                    "conditions": self.conditions(c, valid, reason, message),
                }
                await self.write(c, status, background=True)
            except KubeError as exc:
                log.info("marking %s as a duplicate failed: %s", c.name, exc)
            finally:
                self._marking.discard(c.name)

    def _take(self, body: Mapping[str, Any], deleted: bool = False) -> None:
        """An object returned by one of our writes."""
        if self.fold is not None:
            self.fold(body)
        if self.fold is None or deleted:
            self.observe(body, deleted)

    def _parse(self, body: Mapping[str, Any], previous: Container | None) -> Container:
        problem = None
        try:
            spec: ContainerDispatchSpec | None = ContainerDispatchSpec.model_validate(
                body.get("spec") or {}
            )
        except ValidationError as exc:
            spec = None
            problem = "; ".join(
                f"spec.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
            )
        status = ContainerDispatchStatus.model_validate(body.get("status") or {})
        out = Container(
            name=body["metadata"]["name"],
            namespace=body["metadata"].get("namespace") or self.namespace,
            body=body,
            spec=spec,
            status=status,
            problem=problem,
        )
        if previous is not None:
            out.first_term_at = previous.first_term_at
            out.last_term_at = previous.last_term_at
            out.status_written_at = previous.status_written_at
            out.duplicate_of = previous.duplicate_of
            out.duplicate_reason = previous.duplicate_reason
        return out

    def __iter__(self) -> Iterator[Container]:
        """Every container the dispatcher acts on (duplicates left out)."""
        return iter([c for c in self.by_name.values() if c.duplicate_of is None])

    def by_uuid(self) -> dict[str, Container]:
        return {
            c.uuid: c
            for c in self.by_name.values()
            if c.spec is not None and c.duplicate_of is None
        }

    def get(self, name: str) -> Container | None:
        return self.by_name.get(name)

    # --- writes -------------------------------------------------------------------------

    async def write(
        self,
        c: Container,
        status: Mapping[str, Any],
        *,
        precondition: bool = False,
        background: bool = False,
        unless: Callable[[], bool] | None = None,
    ) -> bool:
        """Merge-patch the status; True on success, False if the object changed or vanished.

        Checked once the write's lane is free, so a write that waited is not sent in vain:
        `unless()` true drops it (a background write for a container being started
        meanwhile), and a preconditioned write whose object the cache already shows
        changed or gone is dropped too (the API server would refuse it with a conflict)."""
        patch: dict[str, Any] = {"status": dict(status)}
        if precondition:
            patch["metadata"] = {"resourceVersion": c.resource_version}
        async with self.background_writes if background else self.writes:
            if unless is not None and unless():
                return False
            if precondition:
                current = self.by_name.get(c.name)
                if current is None or current.resource_version != c.resource_version:
                    log.debug("status write to %s skipped: changed meanwhile", c.name)
                    return False
            patch["status"] = self.kube.fenced_status(patch["status"])  # FencedOut
            self.api_writes += 1
            KUBE_REQUESTS.labels("patch_status").inc()
            try:
                obj = await self.kube.custom.patch_namespaced_custom_object_status(
                    GROUP,
                    VERSION,
                    c.namespace,
                    CONTAINER_DISPATCH.plural,
                    c.name,
                    patch,
                    field_manager=self.kube.field_manager,
                    _content_type="application/merge-patch+json",  # type: ignore[call-arg]
                )
            except Exception as exc:
                err = self.kube.refused(_as_kube_error(exc, c), f"ContainerDispatch {c.name}")
                if isinstance(err, Conflict | NotFound):
                    if isinstance(err, Conflict):
                        KUBE_CONFLICTS.labels(CONTAINER_DISPATCH.kind, "patch_status").inc()
                    log.debug("status write to %s skipped: %s", c.name, err)
                    return False
                raise err from exc
        self._take(obj)
        return True

    async def drop_legacy_finalizer(self, c: Container) -> bool:
        """Remove `LEGACY_FINALIZER` (metadata patch; list replaced as a whole)."""
        c = self.by_name.get(c.name, c)
        finalizers = c.finalizers
        if LEGACY_FINALIZER not in finalizers:
            return True
        finalizers = [f for f in finalizers if f != LEGACY_FINALIZER]
        async with self.writes:
            self.api_writes += 1
            try:
                obj = await self.kube.patch(
                    CONTAINER_DISPATCH,
                    c.namespace,
                    c.name,
                    {
                        "metadata": {
                            "finalizers": finalizers,
                            "resourceVersion": c.resource_version,
                        }
                    },
                )
            except (Conflict, NotFound) as exc:
                if isinstance(exc, Conflict):
                    KUBE_CONFLICTS.labels(CONTAINER_DISPATCH.kind, "patch").inc()
                log.debug("finalizer update of %s skipped: %s", c.name, exc)
                return False
        # deleted as soon as the last finalizer is gone: out of the queue now
        self._take(
            obj, deleted=bool(obj.get("metadata", {}).get("deletionTimestamp")) and not finalizers
        )
        return True

    # --- status vocabulary -------------------------------------------------------------

    def conditions(self, c: Container, valid: bool, reason: str, message: str) -> list[Any]:
        conds: list[Condition] = set_condition(
            list(c.status.conditions),
            "Valid",
            valid,
            reason,
            message,
            c.generation,
            datetime.now(tz=UTC),
        )
        return [x.to_wire() for x in conds]


def _as_kube_error(exc: Exception, c: Container) -> KubeError:
    status = getattr(exc, "status", None)
    what = f"patch status of ContainerDispatch {c.namespace}/{c.name}"
    if status == 409:
        return Conflict(f"{what}: conflict", 409)
    if status == 404:
        return NotFound(f"{what}: not found", 404)
    if status == 422 and "status.fence" in str(getattr(exc, "body", "") or ""):
        return FencedOut(f"{what}: the object holds a newer fencing token", 422)
    if isinstance(exc, KubeError):
        return exc
    return KubeError(f"{what}: {type(exc).__name__} {status or ''}".strip(), status)
