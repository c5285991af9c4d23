"""The capacity ledger: which containers hold capacity on which node, by one rule.

A container holds its node's capacity from the moment it is chosen for that node (before
its Locked write) until its runner is *seen gone* there (a probe's runner list or the
runner's status), whatever its phase:

* chosen for the node, its Locked write or its runner start under way (`Claim`);
* Locked there, its runner not yet known not to run (a lock from before a restart is
  checked first: the node's runner list is read and the node asked);
* Running there, until the container is finished or requeued from what the node said;
* cancelled or deleted, until its runner is seen gone;
* listed by the node's runner list, whatever its container says (requeued, finished,
  placed elsewhere, deleted: its resources as last known, else the whole node).

What it holds is the resources snapshotted into `status.resources` by the Locked write (a
container chosen but not yet locked: the spec the plan read; an object locked by an
older release without a snapshot: its spec).

Only a Locked container whose node said its runner never ran (`Placement.checked`) holds
nothing by itself: it is placed again on its own node like any placement, when it fits
(`Phase.LOCKED` with `runner_absent`); the rest is overflow and is unlocked, never started.

`account` turns the facts into the scheduler's input (`Ledger.views`): holdings as
`Phase.RUNNING` (the node is known to run it: Running, or listed) or `Phase.LOCKED`
(held, not known to run), relock candidates as `Phase.LOCKED` with `runner_absent`, and
the queued containers that hold nothing anywhere as `Phase.QUEUED`. `with_starts` is the
ledger once a plan's starts are chosen (what the power controller's work evidence
counts). The dispatcher and the simulator build their plan inputs with these two and
nothing else. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from nodewarden.api.containerdispatch import ContainerResources
from nodewarden.scheduling.views import ContainerView, Phase

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class Claim:
    """A container this dispatcher chose for `node`: its Locked write or its runner start
    (and, when that failed, the question to the node whether it started) is under way."""

    node: str
    resources: ContainerResources


@dataclass(frozen=True, slots=True)
class Placement:
    """A container with a node (Locked or Running there) or a claim, as the ledger needs it.

    `view` is the container as its status says (phase, node, and the resources it holds:
    the snapshot of its lock)."""

    view: ContainerView
    cancelling: bool = False
    """`spec.cancel` set or the object deleted: it holds until its runner is seen gone."""
    claim: Claim | None = None
    checked: bool = False
    """Locked: the node's runner list was read without it and the node said its runner
    never ran, so it may be started again under the same lock (if it fits)."""


@dataclass
class Ledger:
    """The plan input and what holds capacity (see the module docstring)."""

    views: list[ContainerView] = field(default_factory=list)
    held: dict[str, ContainerResources] = field(default_factory=dict)
    """uuid -> resources of every container holding capacity somewhere (a caller keeps
    them to count a runner whose container is deleted meanwhile)."""
    unknown: dict[str, list[str]] = field(default_factory=dict)
    """node -> runners it lists of no container known here (each holds the whole node)."""


def account(
    placed: Iterable[Placement],
    queued: Iterable[ContainerView],
    listings: Mapping[str, Collection[str]],
    resources_of: Callable[[str], ContainerResources | None],
) -> Ledger:
    """The ledger of one round.

    `placed`: the containers with a node or a claim; `queued`: the Queued containers the
    plan may place this round; `listings`: node -> uuids in its latest runner list (only
    nodes whose list was read); `resources_of`: what a listed runner's container holds
    (its snapshot, its spec, or what it held when last seen; None: unknown)."""
    out = Ledger()
    views = out.views
    holding: set[tuple[str, str]] = set()  # (uuid, node)
    by_uuid: dict[str, ContainerView] = {}

    def hold(view: ContainerView, node: str) -> None:
        holding.add((view.uuid, node))
        out.held[view.uuid] = view.resources
        views.append(view)

    for p in placed:
        v = p.view
        by_uuid[v.uuid] = v
        claim = p.claim
        if claim is not None:
            hold(
                replace(v, phase=Phase.LOCKED, node=claim.node, resources=claim.resources),
                claim.node,
            )
        node = v.node
        if node is None or v.phase is Phase.QUEUED or (claim is not None and claim.node == node):
            continue
        if v.phase is Phase.RUNNING:
            hold(v, node)
        elif v.uuid in listings.get(node, ()):
            hold(replace(v, phase=Phase.RUNNING), node)  # it runs: adopted this round
        elif p.checked and not p.cancelling:
            views.append(replace(v, runner_absent=True))  # holds only if it fits again
        else:
            hold(replace(v, runner_absent=False), node)

    candidates = list(queued)
    for node, uuids in listings.items():
        for uuid in uuids:
            if (uuid, node) in holding:
                continue
            known = by_uuid.get(uuid)
            resources = known.resources if known is not None else resources_of(uuid)
            if resources is None:
                out.unknown.setdefault(node, []).append(uuid)
                views.append(
                    ContainerView(
                        uuid, Phase.RUNNING, 0, _EPOCH, ContainerResources(), node, whole_node=True
                    )
                )
                holding.add((uuid, node))
                continue
            priority = known.priority if known is not None else 0
            first_seen = known.first_seen if known is not None else _EPOCH
            hold(ContainerView(uuid, Phase.RUNNING, priority, first_seen, resources, node), node)
    held = out.held
    views.extend(c for c in candidates if c.uuid not in held)
    return out


def with_starts(views: list[ContainerView], chosen: Mapping[str, str]) -> list[ContainerView]:
    """The ledger once starts are chosen (`chosen`: uuid -> node, the claims): each holds
    its node from now on, and is no longer queued demand."""
    if not chosen:
        return views
    out: list[ContainerView] = []
    for v in views:
        node = chosen.get(v.uuid)
        if node is not None and v.phase is not Phase.RUNNING:
            v = replace(v, phase=Phase.LOCKED, node=node, runner_absent=False)
        out.append(v)
    return out
