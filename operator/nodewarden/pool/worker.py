"""One node of the worker pool: the `Worker` record and its lifecycle table.

A worker's own lifecycle is `Worker.state` (a `PoolState`), changed only by
`Worker.move`, which allows exactly the transitions of `TRANSITIONS`:

    from           to                       when
    Booting        Ready                    a probe finds the node ready
    Booting        ShuttingDown             its destroy is requested (lame, idle, unwanted)
    Booting        Gone                     create failed / instance left the cloud list
    Ready          Booting                  a side node stops answering ready (powered off)
    Ready          ShuttingDown             its destroy is requested
    Ready          Gone                     its instance left the cloud list / node dropped
    ShuttingDown   Gone                     its instance is gone and its WorkerNode removed

A refused move (a probe that finishes after its node was destroyed or removed: the
background tasks of one worker race by design) is logged and leaves the state as it
was; it never raises, so a late task cannot bring down a probe loop or a round. The
state is internal: what users see as a node's state (WorkerNode status, metrics, the
management snapshot) is the power controller's (`policy.state.api_state`).

The record's fields are the pool's; the dispatcher tells it what happened through its
methods (`runner_started`, `container_finished`, `runner_signalled`) and never writes
them. `idle_since` has the power controller's meaning (the one rule,
`rules.readings.idle_since`): the time of the first runner listing that found no runner
after the node had one (or after it came up), kept while no runner runs.
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from nodewarden.api.workernode import WorkerNodeSpec
from nodewarden.cloud.model import CloudInstance, InstanceState
from nodewarden.fleet.ports import WorkerSnapshot
from nodewarden.rules import readings
from nodewarden.scheduling.instancetypes import InstanceType
from nodewarden.ssh.facts import RunnerProcess, RunnersFact

log = logging.getLogger(__name__)


def node_name_for(dispatcher_id: str, instance_type: str) -> str:
    """A fresh DNS-safe WorkerNode name, e.g. 'demo-m5-large-x7k2q9'."""
    slug = re.sub(r"[^a-z0-9-]+", "-", instance_type.lower()).strip("-")[:30] or "vm"
    suffix = "".join(secrets.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(6))
    return f"{dispatcher_id}-{slug}-{suffix}"[:63].strip("-")


class PoolState(StrEnum):
    """Where a worker is in the pool's lifecycle (transitions: `TRANSITIONS`)."""

    BOOTING = "Booting"
    """Known, not (or no longer) answering ready: its instance is being created or boots,
    or a side node is off."""
    READY = "Ready"
    """The last probe found it ready."""
    SHUTTING_DOWN = "ShuttingDown"
    """Its destroy was requested; it is not probed any more."""
    GONE = "Gone"
    """Removed from the pool (its instance is gone, its create failed, or it was dropped)."""


TRANSITIONS: Mapping[PoolState, frozenset[PoolState]] = {
    PoolState.BOOTING: frozenset({PoolState.READY, PoolState.SHUTTING_DOWN, PoolState.GONE}),
    PoolState.READY: frozenset({PoolState.BOOTING, PoolState.SHUTTING_DOWN, PoolState.GONE}),
    PoolState.SHUTTING_DOWN: frozenset({PoolState.GONE}),
    PoolState.GONE: frozenset(),
}
"""The only allowed changes of `Worker.state` (the table of the module docstring)."""


@dataclass
class Worker:
    """One cloud node: its instance, its WorkerNode, what the probes found."""

    name: str
    instance_type: InstanceType | None
    created_at: datetime
    instance: CloudInstance | None = None
    instance_known_at: datetime | None = None
    """When our create call returned the instance (None for adopted instances)."""
    found_at: datetime | None = None
    """When this process first learned of a VM it did not create (its WorkerNode or its
    instance found at start-up, after a takeover, an adoption); None for VMs it created.
    A new process has no probe history of a found VM, so its boot grace and lameAfter
    count from here, not from the launch (`rules.vm`; Arvados counts a found instance's
    boot timeout from when the dispatcher first saw it)."""
    body: Mapping[str, Any] | None = None
    """The WorkerNode's compact body (shared with the informer's store: read-only); set
    through `take`, which parses the spec once per body."""
    state: PoolState = PoolState.BOOTING
    """Changed only by `move` (see `TRANSITIONS`)."""
    last_success: datetime | None = None
    last_attempt: datetime | None = None
    attempts_since_success: int = 0
    attempts_total: int = 0
    probe_result: str | None = None
    probe_message: str | None = None
    runners: dict[str, int] | None = None
    """Every runner the node listed last (container uuid -> pid), whoever owns it."""
    runners_at: datetime | None = None
    listed_runners: dict[str, RunnerProcess] = field(default_factory=dict)
    """The last listing in full: owner (dispatcher id), object uid and token per uuid."""
    idle_since: datetime | None = None
    """Since when the node has run no runner (see the module docstring); None while one
    runs or before its first runner listing."""
    broken: bool = False
    destroy_requested_at: datetime | None = None
    destroy_reason: str | None = None
    destroy_error: str | None = None
    host_key: str | None = None
    last_tag_at: datetime | None = None
    creating: bool = False
    last_container: str | None = None
    """The container started or finished on this node last."""
    probe_task: asyncio.Task[None] | None = None
    probe_now: asyncio.Event = field(default_factory=asyncio.Event)
    side: bool = False
    """A side node (fixed hardware, powered by the power controller), not a cloud VM."""
    unowned_runners: tuple[str, ...] = ()
    """Container uuids of the runners listed without an owner (reported, never killed)."""
    target_refusal: str | None = None
    """Why the credential resolver refused this side node's SSH login (None: it did not)."""
    _spec: WorkerNodeSpec | None = None

    def __post_init__(self) -> None:
        if self.body is not None and self._spec is None:  # made with a body: parse its spec
            body, self.body = self.body, None
            self.take(body)

    def take(self, body: Mapping[str, Any] | None, spec: WorkerNodeSpec | None = None) -> None:
        """A new version of the WorkerNode (None: deleted), with its spec as the feed
        parsed it (None: parsed here)."""
        previous = self.body
        self.body = body
        if body is None:
            self._spec = None
            return
        edited = previous is None or previous.get("spec") != body.get("spec")
        if spec is not None:
            self._spec = spec
        elif edited:  # else a status write: the spec (and its parse) stays
            try:
                self._spec = WorkerNodeSpec.model_validate(body.get("spec") or {})
            except ValueError:
                self._spec = None
        if edited and previous is not None:
            self.probe_now.set()  # an edit (an address, a Secret named) is tried at once

    @property
    def spec(self) -> WorkerNodeSpec | None:
        return self._spec

    def move(self, to: PoolState, why: str) -> bool:
        """Change `state` to `to` if `TRANSITIONS` allows it (staying put is allowed);
        otherwise log the refusal and keep the state. True when the state is `to` now."""
        if to is self.state:
            return True
        if to not in TRANSITIONS[self.state]:
            log.info(
                "WorkerNode %s: refused state change %s -> %s (%s)",
                self.name,
                self.state.value,
                to.value,
                why,
            )
            return False
        self.state = to
        return True

    @property
    def ready(self) -> bool:
        """The last probe found the node ready (and nothing moved it on since)."""
        return self.state is PoolState.READY

    @property
    def probing(self) -> bool:
        """Probes are wanted: neither shutting down nor gone."""
        return self.state in (PoolState.BOOTING, PoolState.READY)

    @property
    def idle_behavior(self) -> str:
        spec = self.spec
        return spec.idle_behavior if spec else "run"

    @property
    def policy_name(self) -> str | None:
        spec = self.spec
        return spec.policy_ref.name if spec and spec.policy_ref else None

    @property
    def deletion_requested(self) -> bool:
        return bool((self.body or {}).get("metadata", {}).get("deletionTimestamp"))

    @property
    def booted_at(self) -> datetime:
        if self.instance is not None and self.instance.created_at is not None:
            return self.instance.created_at
        return self.created_at

    @property
    def price(self) -> float:
        if self.side:
            spec = self.spec
            return spec.cost_per_hour or 0.0 if spec is not None else 0.0
        if self.instance is not None and self.instance.price is not None:
            return self.instance.price
        return self.instance_type.price if self.instance_type else 0.0

    @property
    def reachable(self) -> bool:
        """Something may answer SSH: a cloud instance exists, or a side node's login was
        not refused by the credential resolver."""
        return self.target_refusal is None if self.side else self.instance is not None

    # --- what happened (the pool's probes; the dispatcher through these) ---------------

    def runners_listed(self, fact: RunnersFact) -> None:
        """A probe listed the node's runners (`fact`): every runner, and since when none runs."""
        self.runners = {r.uuid: r.pid for r in fact.runners}
        self.listed_runners = {r.uuid: r for r in fact.runners}
        self.runners_at = fact.observed_at
        self.idle_since = readings.idle_since(len(fact.runners), fact.observed_at, self.idle_since)

    def runner_started(self, uuid: str, pid: int) -> None:
        """The dispatcher started the runner of container `uuid` here (pid `pid`)."""
        if self.runners is not None:
            self.runners[uuid] = pid
        self.last_container = uuid
        self.idle_since = None

    def container_finished(self, uuid: str) -> None:
        """Container `uuid`, placed here, reached a terminal phase."""
        self.last_container = uuid

    def runner_signalled(self) -> None:
        """A runner here was sent a signal: list the runners again soon."""
        self.probe_now.set()

    def snapshot(self, listed_at: datetime | None) -> WorkerSnapshot:
        """This worker frozen as the power rules read it (`fleet.ports.WorkerSnapshot`);
        `listed_at`: the pool's last cloud list."""
        instance = self.instance
        return WorkerSnapshot(
            name=self.name,
            side=self.side,
            booted_at=self.booted_at,
            found_at=None if self.side else self.found_at,
            last_attempt=self.last_attempt,
            last_success=self.last_success,
            attempts_since_success=self.attempts_since_success,
            attempts_total=self.attempts_total,
            broken=self.broken,
            deletion_requested=self.deletion_requested,
            instance_id=instance.id if instance is not None else None,
            instance_stopped=instance is not None and instance.state is InstanceState.STOPPED,
            listed_at=listed_at,
        )
