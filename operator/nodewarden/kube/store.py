"""The informer's store: compact models of one kind, keyed by namespace/name, ordered by resourceVersion.

Pure (no I/O, no asyncio): every mutation returns the `Delta`s it caused, and the caller
(`nodewarden.kube.informer`) hands them to its handlers. Rules:

- Each object is held with the resourceVersion it was seen at. An update whose
  resourceVersion is not newer than the held one changes nothing (a stale watch event
  never overwrites a newer status the operator folded in from its own write).
- A delete removes the object unless the held version is newer than the delete (the
  object was recreated and folded in before the old incarnation's delete arrived).
- `fold` (an object the operator got back from a write) also respects the stream
  horizon: an object not held whose version is at or below the resourceVersion the
  stream has already covered was deleted (or dropped) since, and is not resurrected.
- `replace` (a relist) diffs the snapshot against the store: DELETED for objects that
  vanished, MODIFIED for changed ones, ADDED for new ones, nothing for the unchanged.
- A MODIFIED delta is produced only when the compact model changed (`old != new`); a
  write that touched only fields the model does not keep updates the held version
  silently.

resourceVersions are compared as decimal integers (Kubernetes' comparable resource
versions); `parse_resource_version` rejects anything else with a clear error.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Generic, Literal, NamedTuple, TypeVar

T = TypeVar("T")

EventType = Literal["ADDED", "MODIFIED", "DELETED"]


class ObjectKey(NamedTuple):
    namespace: str
    name: str


class Delta(NamedTuple, Generic[T]):
    """One change of the store, in the order it happened."""

    type: EventType
    key: ObjectKey
    old: T | None
    new: T | None


class Entry(NamedTuple, Generic[T]):
    resource_version: int
    model: T


def parse_resource_version(value: object) -> int:
    """A resourceVersion as an integer; ValueError naming the field if it is not one."""
    if isinstance(value, str) and value.isdigit():
        return int(value)
    raise ValueError(
        f"metadata.resourceVersion {value!r} is not a decimal integer; nodewarden orders "
        "events by resourceVersion and needs an API server whose versions are comparable"
    )


class Store(Generic[T]):
    """Compact models of one kind in one namespace (or all), with their resourceVersions."""

    def __init__(self) -> None:
        self._items: dict[ObjectKey, Entry[T]] = {}

    # --- reads (what consumers call) ----------------------------------------------------

    def get(self, namespace: str, name: str) -> T | None:
        entry = self._items.get(ObjectKey(namespace, name))
        return None if entry is None else entry.model

    def entry(self, key: ObjectKey) -> Entry[T] | None:
        """The held model with its resourceVersion (as an integer)."""
        return self._items.get(key)

    def resource_version(self, namespace: str, name: str) -> str | None:
        """The resourceVersion the held model was seen at (for write preconditions)."""
        entry = self._items.get(ObjectKey(namespace, name))
        return None if entry is None else str(entry.resource_version)

    def items(self) -> list[tuple[ObjectKey, T]]:
        """A snapshot list: safe to keep iterating across awaits while the store changes."""
        return [(key, entry.model) for key, entry in self._items.items()]

    def values(self) -> list[T]:
        return [entry.model for entry in self._items.values()]

    def __iter__(self) -> Iterator[ObjectKey]:
        """The keys, as a snapshot."""
        return iter(list(self._items))

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    # --- mutations (what the informer calls) --------------------------------------------

    def upsert(self, key: ObjectKey, rv: int, model: T) -> Delta[T] | None:
        """An ADDED or MODIFIED object; nothing if the held version is as new or newer."""
        held = self._items.get(key)
        if held is not None and held.resource_version >= rv:
            return None
        self._items[key] = Entry(rv, model)
        if held is None:
            return Delta("ADDED", key, None, model)
        if held.model == model:
            return None
        return Delta("MODIFIED", key, held.model, model)

    def delete(self, key: ObjectKey, rv: int) -> Delta[T] | None:
        """A DELETED object (or one the transform now drops) at version `rv`."""
        held = self._items.get(key)
        if held is None or held.resource_version > rv:
            return None
        del self._items[key]
        return Delta("DELETED", key, held.model, None)

    def fold(
        self, key: ObjectKey, rv: int, model: T | None, horizon: int | None
    ) -> Delta[T] | None:
        """An object the operator received from its own write (None: the transform drops it).

        `horizon` is the resourceVersion up to which the watch stream has been seen."""
        if key not in self._items and horizon is not None and rv <= horizon:
            return None
        if model is None:
            return self.delete(key, rv)
        return self.upsert(key, rv, model)

    def replace(self, snapshot: Mapping[ObjectKey, Entry[T]], list_rv: int) -> list[Delta[T]]:
        """Reconcile with a full LIST taken at `list_rv`; the deltas that make the store equal it.

        Objects held at a version newer than the list (folded in from a write after the
        snapshot) are kept."""
        deltas: list[Delta[T]] = []
        for key in [k for k in self._items if k not in snapshot]:
            delta = self.delete(key, list_rv)
            if delta is not None:
                deltas.append(delta)
        for key, entry in snapshot.items():
            delta = self.upsert(key, entry.resource_version, entry.model)
            if delta is not None:
                deltas.append(delta)
        return deltas
