"""The cloud list against the last one: which instances are new, changed or vanished.

An instance is the same as before when what the pool acts on is
(`CloudInstance.same_as`: state, tags, addresses, name, type and launch time;
`observed_at` changes with every list and is no change). Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from nodewarden.cloud.model import CloudInstance


@dataclass(frozen=True)
class ListChange:
    """One list against the previous view (instance id -> instance)."""

    view: dict[str, CloudInstance]
    """The instances of this list by id (the view the next list is diffed against)."""
    added: list[CloudInstance] = field(default_factory=list)
    changed: list[CloudInstance] = field(default_factory=list)
    vanished: list[CloudInstance] = field(default_factory=list)
    """Instances of the previous view not in this list (as last seen)."""

    @property
    def arrivals(self) -> list[CloudInstance]:
        """New and changed instances: what the adopt and takeover paths look at."""
        return [*self.added, *self.changed]

    @property
    def empty(self) -> bool:
        """Nothing changed: the list confirms the previous view, at its own time."""
        return not (self.added or self.changed or self.vanished)


def same(before: CloudInstance, after: CloudInstance) -> bool:
    """What the pool acts on is unchanged (`CloudInstance.same_as`)."""
    return before.same_as(after)


def diff_list(previous: Mapping[str, CloudInstance], listed: Iterable[CloudInstance]) -> ListChange:
    """`listed` against `previous` (see `ListChange`)."""
    view: dict[str, CloudInstance] = {}
    added: list[CloudInstance] = []
    changed: list[CloudInstance] = []
    for inst in listed:
        view[inst.id] = inst
        before = previous.get(inst.id)
        if before is None:
            added.append(inst)
        elif not same(before, inst):
            changed.append(inst)
    vanished = [inst for iid, inst in previous.items() if iid not in view]
    return ListChange(view=view, added=added, changed=changed, vanished=vanished)
