"""In-memory fakes of the dispatcher's seams (`nodewarden.dispatch.ports`) and a rig that
drives `Dispatcher.step()` with a fake clock: no cluster, no cloud, no SSH.

These are fakes by design (the cluster tests in `tests/dispatch/` run the real peers):

- `FakeApi` holds the ContainerDispatch objects as an API server would (resourceVersion,
  merge patches of the status, finalizers, deletion). What it holds reaches the
  dispatcher only through `deliver` (the watch), so a test can let the API and the
  dispatcher's cache disagree, as they do between a write and its watch event.
- `FakeQueue` is the real `ContainerQueue` cache (parsing, newest-version-wins) with its
  two writes (`write`, `drop_legacy_finalizer`) sent to the `FakeApi` instead of Kubernetes.
- `FakeCloud` and `FakeVM`: the catalogue, back-off answers, and VMs whose readiness and
  runners the test sets.
- `FakePool`: workers for the fake VMs; probes run when the rig says so, not on timers.
- `FakeProber`: starts, signals and reports runners on the fake VMs. A VM with
  `slow_starts` parks every start (the SSH command is on its way) until the test releases
  it with a fate: the runner starts and the answer arrives, the runner starts but the
  answer times out, or it never starts.
- `Rig.round()`: advance the clock, probe every node, publish power views (what the power
  controller would: a ready node is On with admission open), run one `step()`, and wait
  for the background writes and starts it spawned (a parked start is not waited for).
"""

from __future__ import annotations

import asyncio
import copy
import itertools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from pydantic import SecretStr

from nodewarden.api.workernode import WorkerNodeSpec
from nodewarden.cloud.backoff import CloudBackoff, CreatePermission
from nodewarden.cloud.errors import CloudErrorKind
from nodewarden.cloud.model import CloudInstance, InstanceState
from nodewarden.config import DispatchSettings
from nodewarden.dispatch.dispatcher import Dispatcher
from nodewarden.dispatch.queue import LEGACY_FINALIZER, Container, ContainerQueue
from nodewarden.fleet.board import NodePowerView, PowerBoard
from nodewarden.fleet.policies import PolicyBook
from nodewarden.kube.client import Kube
from nodewarden.policy.state import PowerState
from nodewarden.pool.worker import PoolState, Worker
from nodewarden.scheduling.instancetypes import InstanceType, InstanceTypePolicy
from nodewarden.ssh.credentials import InstanceSecretTrust, SshClientKey, SshTarget
from nodewarden.ssh.errors import CommandTimeout, ConnectionFailed
from nodewarden.ssh.facts import (
    ProbeReport,
    RunnerOutcome,
    RunnerProcess,
    RunnerStarted,
    RunnerState,
)

NS = "nw"
ME = "disp-a"
OTHER = "disp-b"
T0 = datetime(2026, 1, 1, tzinfo=UTC)
KEY = SshClientKey.generate()

SMALL = InstanceType(name="small", provider_type="s1", vcpus=2, ram="8Gi", price=0.10)
MEDIUM = InstanceType(name="medium", provider_type="m1", vcpus=2, ram="8Gi", price=0.14)
LARGE = InstanceType(name="large", provider_type="l1", vcpus=8, ram="32Gi", price=0.50)


class FakeClock:
    def __init__(self, start: datetime = T0) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


# --- containers ---------------------------------------------------------------------------


def uuid_of(name: str) -> str:
    """The container uuid of the object `name` (lowercase letters and digits only)."""
    return f"zzzzz-dz642-{name:0>15}"


def name_of(uuid: str) -> str:
    return uuid.rsplit("-", 1)[1].lstrip("0")


def container(
    name: str,
    *,
    priority: int = 1,
    vcpus: int = 1,
    ram: str = "1Gi",
    status: Mapping[str, Any] | None = None,
    finalizers: tuple[str, ...] = (),
) -> dict[str, Any]:
    """A ContainerDispatch body (uuid: `uuid_of(name)`)."""
    return {
        "metadata": {
            "name": name,
            "namespace": NS,
            "generation": 1,
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "finalizers": list(finalizers),
        },
        "spec": {
            "uuid": uuid_of(name),
            "priority": priority,
            "resources": {"vcpus": vcpus, "ram": ram},
            "command": ["true"],
        },
        "status": dict(status or {}),
    }


def _merge(target: dict[str, Any], patch: Mapping[str, Any]) -> None:
    """JSON merge patch (RFC 7386): None deletes a key."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


@dataclass
class FakeApi:
    """ContainerDispatch objects as the API server holds them (see the module docstring)."""

    objects: dict[str, dict[str, Any]] = field(default_factory=dict)
    status_writes: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    conflicts: int = 0
    _rv: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    _uids: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    watchers: list[FakeQueue] = field(default_factory=list)

    def _bump(self, body: dict[str, Any]) -> dict[str, Any]:
        body["metadata"]["resourceVersion"] = str(next(self._rv))
        return copy.deepcopy(body)

    def deliver(self, name: str) -> None:
        """The watch event for `name` reaches every queue (deleted if it is gone)."""
        body = self.objects.get(name)
        for queue in self.watchers:
            if body is None:
                queue.observe(
                    {"metadata": {"name": name, "namespace": NS, "resourceVersion": "999999999"}},
                    deleted=True,
                )
            else:
                queue.observe(copy.deepcopy(body))

    def create(self, body: dict[str, Any], deliver: bool = True) -> None:
        self.objects[body["metadata"]["name"]] = copy.deepcopy(body)
        # the API server gives every object its own metadata.uid (never reused)
        self.objects[body["metadata"]["name"]]["metadata"].setdefault(
            "uid", f"uid-{next(self._uids)}"
        )
        self._bump(self.objects[body["metadata"]["name"]])
        if deliver:
            self.deliver(body["metadata"]["name"])

    def change(self, name: str, deliver: bool = True, **patch: Any) -> None:
        """Someone else merge-patches the object (`status=`, `spec=`, `metadata=`)."""
        body = self.objects[name]
        _merge(body, patch)
        if "spec" in patch:
            body["metadata"]["generation"] = int(body["metadata"]["generation"]) + 1
        self._bump(body)
        if deliver:
            self.deliver(name)

    def cancel(self, name: str) -> None:
        self.change(name, spec={"cancel": True})

    def delete(self, name: str) -> None:
        body = self.objects[name]
        if body["metadata"].get("finalizers"):
            body["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
            self._bump(body)
        else:
            del self.objects[name]
        self.deliver(name)

    def status(self, name: str) -> dict[str, Any]:
        return dict(self.objects[name].get("status") or {})

    def phase(self, name: str) -> str | None:
        return self.status(name).get("phase")

    # the writes a queue sends

    def patch_status(
        self, name: str, status: Mapping[str, Any], resource_version: str | None
    ) -> dict[str, Any] | None:
        body = self.objects.get(name)
        if body is None:
            return None
        if resource_version is not None and body["metadata"]["resourceVersion"] != resource_version:
            self.conflicts += 1
            return None
        body.setdefault("status", {})
        _merge(body["status"], status)
        self.status_writes.append((name, dict(status)))
        return self._bump(body)

    def patch_finalizers(
        self, name: str, finalizers: list[str], resource_version: str
    ) -> dict[str, Any] | None:
        body = self.objects.get(name)
        if body is None or body["metadata"]["resourceVersion"] != resource_version:
            self.conflicts += body is not None
            return None
        body["metadata"]["finalizers"] = list(finalizers)
        out = self._bump(body)
        if body["metadata"].get("deletionTimestamp") and not finalizers:
            del self.objects[name]
        return out


class FakeQueue:
    """The real `ContainerQueue` cache with its writes sent to a `FakeApi`."""

    def __init__(self, api: FakeApi) -> None:
        self.api = api
        # the cache never calls Kubernetes; `write` and `drop_legacy_finalizer` are replaced below
        self.cache = ContainerQueue(kube=Kube.__new__(Kube), namespace=NS, dispatcher_id=ME)
        self.cache.write = self.write  # type: ignore[method-assign]  # the queue's own writes too
        api.watchers.append(self)

    @property
    def marks_due(self) -> bool:
        return self.cache.marks_due

    async def mark_duplicates(self) -> None:
        await self.cache.mark_duplicates()

    @property
    def by_name(self) -> Mapping[str, Container]:
        return self.cache.by_name

    @property
    def version(self) -> int:
        return self.cache.version

    def observe(self, body: Mapping[str, Any], deleted: bool = False) -> None:
        self.cache.observe(body, deleted)

    def get(self, name: str) -> Container | None:
        return self.cache.get(name)

    def by_uuid(self) -> dict[str, Container]:
        return self.cache.by_uuid()

    def __iter__(self) -> Iterator[Container]:
        return iter(self.cache)

    def conditions(self, c: Container, valid: bool, reason: str, message: str) -> list[Any]:
        return self.cache.conditions(c, valid, reason, message)

    async def write(
        self,
        c: Container,
        status: Mapping[str, Any],
        *,
        precondition: bool = False,
        background: bool = False,
        unless: Callable[[], bool] | None = None,
    ) -> bool:
        await asyncio.sleep(0)  # an API call yields to the loop
        if unless is not None and unless():
            return False
        out = self.api.patch_status(c.name, status, c.resource_version if precondition else None)
        if out is None:
            return False
        self.cache.observe(out)
        return True

    async def drop_legacy_finalizer(self, c: Container) -> bool:
        await asyncio.sleep(0)
        c = self.cache.get(c.name) or c
        finalizers = [f for f in c.finalizers if f != LEGACY_FINALIZER]
        if finalizers == c.finalizers:
            return True
        out = self.api.patch_finalizers(c.name, finalizers, c.resource_version)
        if out is None:
            return False
        gone = bool(out["metadata"].get("deletionTimestamp")) and not finalizers
        self.cache.observe(out, deleted=gone)
        return True


# --- cloud, VMs, runners ------------------------------------------------------------------


StartFate = Literal["start", "timeout", "fail"]
"""How a parked start ends: the runner starts and its pid comes back (`start`), the runner
starts but the answer never arrives (`timeout`: CommandTimeout), or it never starts
(`fail`: the connection drops)."""


@dataclass
class ParkedStart:
    uuid: str
    task: asyncio.Task[Any] | None
    config: Mapping[str, Any]
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    fate: StartFate = "start"


@dataclass
class FakeVM:
    name: str
    itype: InstanceType
    instance: CloudInstance
    ready: bool = False
    runners: dict[str, int] = field(default_factory=dict)
    owners: dict[str, str | None] = field(default_factory=dict)
    uids: dict[str, str | None] = field(default_factory=dict)
    """The metadata.uid each runner was started for (absent: not recorded)."""
    """The owner a runner names (`--list`); absent: this rig's dispatcher (`ME`)."""
    ended: dict[str, tuple[RunnerState, int | None]] = field(default_factory=dict)
    signals: list[tuple[str, str]] = field(default_factory=list)
    started: list[str] = field(default_factory=list)
    """Container uuids of every runner start asked for, in order."""
    term_stops: bool = True
    """A TERM ends the runner (False: only KILL does)."""
    start_fails: bool = False
    start_times_out: bool = False
    """The runner starts, but the answer to the start command times out."""
    slow_starts: bool = False
    """Every start is parked until `release` (see `ParkedStart`)."""
    parked: list[ParkedStart] = field(default_factory=list)
    runner_vcpus: dict[str, int] = field(default_factory=dict)
    """vCPUs each runner was started with (the config it was given)."""
    most_vcpus: int = 0
    """The most vCPUs the VM's runners ever used at once (set by the prober)."""

    def release(self, uuid: str | None = None, fate: StartFate = "start") -> None:
        """Let one parked start (or all of them) reach the node, with `fate`."""
        for parked in self.parked:
            if uuid is None or parked.uuid == uuid:
                parked.fate = fate
                parked.gate.set()

    def exit(self, uuid: str, code: int) -> None:
        del self.runners[uuid]
        self.ended[uuid] = ("exited", code)

    def lose(self, uuid: str) -> None:
        """The runner vanishes without a trace of how it ended."""
        del self.runners[uuid]
        self.ended[uuid] = ("lost", None)


@dataclass(frozen=True)
class _CloudConfig:
    instance_type_policy: InstanceTypePolicy


class FakeCloud:
    """The catalogue and create permissions; `launch` makes a VM as a create would."""

    def __init__(
        self, clock: FakeClock, catalogue: list[InstanceType], price_factor: float
    ) -> None:
        self.clock = clock
        self.catalogue = list(catalogue)
        self.config = _CloudConfig(InstanceTypePolicy(price_factor=price_factor))
        self.backoff = CloudBackoff()
        self.at_capacity: set[str] = set()
        self.vms: dict[str, FakeVM] = {}
        self.created: list[str] = []
        self._ids = itertools.count(1)

    def instance_type(self, name: str) -> InstanceType | None:
        return next((t for t in self.catalogue if t.name == name), None)

    def may_create(
        self, instance_type: InstanceType, now: datetime | None = None
    ) -> CreatePermission:
        if instance_type.name in self.at_capacity:
            return CreatePermission(
                False, f"{instance_type.name} at capacity", CloudErrorKind.CAPACITY
            )
        return self.backoff.may_create(instance_type, now or self.clock())

    async def close(self) -> None:
        return None

    def launch(self, name: str, itype: InstanceType, ready: bool = False) -> FakeVM:
        inst = CloudInstance(
            id=f"i-{next(self._ids)}",
            name=name,
            instance_type=itype.name,
            provider_type=itype.provider_type,
            state=InstanceState.RUNNING,
            price=itype.price,
            created_at=self.clock(),
            observed_at=self.clock(),
            source="cloud:fake",
        )
        vm = FakeVM(name, itype, inst, ready=ready)
        self.vms[name] = vm
        return vm


class FakeProber:
    def __init__(self, cloud: FakeCloud, clock: FakeClock) -> None:
        self.cloud = cloud
        self.clock = clock
        self._pids = itertools.count(100)
        self.vcpus: Callable[[str], int] = lambda uuid: 1
        """vCPUs of a container (for `FakeVM.most_vcpus`); the rig sets it from the API."""
        self.parked_changed = asyncio.Event()

    def land(self, vm: FakeVM, parked: ParkedStart) -> None:
        """The start command reached the node (its sender may be gone): the runner runs."""
        self._run(vm, parked.uuid, parked.config)

    def parked_tasks(self) -> set[asyncio.Task[Any]]:
        return {
            p.task
            for vm in self.cloud.vms.values()
            for p in vm.parked
            if p.task is not None and not p.gate.is_set()
        }

    def _run(self, vm: FakeVM, uuid: str, config: Mapping[str, Any]) -> int:
        if uuid not in vm.runners:
            vm.runners[uuid] = next(self._pids)
            vm.runner_vcpus[uuid] = int(config.get("resources", {}).get("vcpus", 1))
        used = sum(vm.runner_vcpus.get(u) or self.vcpus(u) for u in vm.runners)
        vm.most_vcpus = max(vm.most_vcpus, used)
        return vm.runners[uuid]

    def _vm(self, target: SshTarget) -> FakeVM:
        vm = self.cloud.vms.get(target.node)
        if vm is None:
            raise ConnectionFailed(target.node, target.address, "no such VM")
        return vm

    async def start_runner(
        self, target: SshTarget, config: Mapping[str, Any], uid: str | None = None
    ) -> RunnerStarted:
        await asyncio.sleep(0)
        vm = self._vm(target)
        uuid = str(config["uuid"])
        vm.started.append(uuid)  # every start asked for, even of a runner already there
        if uuid not in vm.runners:
            vm.uids[uuid] = uid
        if vm.start_fails:
            raise ConnectionFailed(target.node, target.address, "runner start failed")
        if vm.slow_starts:
            parked = ParkedStart(uuid, asyncio.current_task(), config)
            vm.parked.append(parked)
            self.parked_changed.set()
            try:
                await parked.gate.wait()
            finally:
                vm.parked.remove(parked)
            if parked.fate == "fail":
                raise ConnectionFailed(target.node, target.address, "connection dropped")
            pid = self._run(vm, uuid, config)
            if parked.fate == "timeout":
                raise CommandTimeout(target.node, target.address, "runner start timed out")
            return RunnerStarted(target.node, uuid, pid, self.clock(), "fake")
        pid = self._run(vm, uuid, config)
        if vm.start_times_out:
            raise CommandTimeout(target.node, target.address, "runner start timed out")
        return RunnerStarted(target.node, uuid, pid, self.clock(), "fake")

    async def kill_runner(self, target: SshTarget, uuid: str, signal: str | int = "TERM") -> None:
        await asyncio.sleep(0)
        vm = self._vm(target)
        vm.signals.append((uuid, str(signal)))
        if uuid in vm.runners and (signal == "KILL" or vm.term_stops):
            del vm.runners[uuid]
            vm.ended[uuid] = ("killed", None)

    async def runner_status(self, target: SshTarget, uuid: str) -> RunnerOutcome:
        await asyncio.sleep(0)
        vm = self._vm(target)
        if uuid in vm.runners:
            state: RunnerState = "running"
            code = None
        else:
            state, code = vm.ended.get(uuid, ("unknown", None))
        pid = vm.runners.get(uuid)
        owner = vm.owners.get(uuid, ME) if pid is not None else None
        return RunnerOutcome(
            target.node,
            uuid,
            state,
            pid,
            code,
            None,
            self.clock(),
            "fake",
            dispatcher_id=owner,
            uid=vm.uids.get(uuid) if (pid is not None or uuid in vm.ended) else None,
        )

    async def aclose(self) -> None:
        return None


class FakePool:
    """Workers for the fake VMs; `probe_all` is the probe loops' work, done on demand."""

    def __init__(self, cloud: FakeCloud, clock: FakeClock) -> None:
        self.cloud = cloud
        self.clock = clock
        self.workers: dict[str, Worker] = {}
        self.declared: dict[str, Mapping[str, Any]] = {}
        self.sync_wanted = False
        self.statuses: Mapping[str, list[str]] = {}
        self._names = itertools.count(1)

    def observe_node(
        self, body: Mapping[str, Any], deleted: bool = False, spec: WorkerNodeSpec | None = None
    ) -> None:
        return None

    def sync_requested(self) -> bool:
        wanted, self.sync_wanted = self.sync_wanted, False
        return wanted

    async def sync_cloud(self) -> None:
        for name, vm in self.cloud.vms.items():
            if name not in self.workers:
                self.workers[name] = Worker(
                    name=name, instance_type=vm.itype, created_at=self.clock(), instance=vm.instance
                )
        for name, worker in list(self.workers.items()):
            if name not in self.cloud.vms and not worker.creating and not worker.side:
                worker.move(PoolState.GONE, "instance left the cloud list")
                del self.workers[name]

    async def adopt_declared(self) -> None:
        return None

    async def probe_once(self, worker: Worker) -> ProbeReport | None:
        vm = self.cloud.vms.get(worker.name)
        worker.last_attempt = self.clock()
        if vm is None or not vm.ready:
            worker.attempts_since_success += 1
            return None
        worker.move(PoolState.READY, "probe")
        worker.last_success = self.clock()
        worker.attempts_since_success = 0
        worker.runners = dict(vm.runners)
        worker.listed_runners = {
            u: RunnerProcess(pid, u, dispatcher_id=vm.owners.get(u, ME), uid=vm.uids.get(u))
            for u, pid in vm.runners.items()
        }
        worker.runners_at = self.clock()
        return None

    async def probe_all(self) -> None:
        for worker in list(self.workers.values()):
            if worker.instance is not None and worker.probing:
                await self.probe_once(worker)

    def ensure_probes(self) -> None:
        return None

    async def target(self, worker: Worker) -> SshTarget | None:
        if worker.instance is None:
            return None
        return SshTarget(
            node=worker.name,
            host="127.0.0.1",
            client_key=KEY,
            trust=InstanceSecretTrust(SecretStr("0" * 64)),
        )

    def create(self, itype: InstanceType) -> Worker:
        name = f"vm-{itype.name}-{next(self._names)}"
        vm = self.cloud.launch(name, itype)
        self.cloud.created.append(itype.name)
        worker = Worker(
            name=name, instance_type=itype, created_at=self.clock(), instance=vm.instance
        )
        self.workers[name] = worker
        return worker

    def pending_creates(self) -> int:
        return sum(1 for w in self.workers.values() if w.creating)

    def contribute_statuses(self, containers_by_node: Mapping[str, list[str]]) -> None:
        self.statuses = containers_by_node

    async def close(self) -> None:
        return None


# --- the rig ------------------------------------------------------------------------------


def policy(**dispatch: Any) -> dict[str, Any]:
    """The default PowerPolicy body with `spec.dispatch` fields (camelCase), limits and
    `placement` (a dict of its fields)."""
    limits = {
        k: dispatch.pop(k) for k in ("maxNodes", "minWarmNodes", "placement") if k in dispatch
    }
    return {
        "metadata": {"name": "default", "namespace": NS, "generation": 1},
        "spec": {"dispatch": dispatch, **limits},
    }


class Rig:
    def __init__(
        self,
        catalogue: list[InstanceType] | None = None,
        *,
        price_factor: float = 1.5,
        dispatcher_id: str = ME,
        api: FakeApi | None = None,
        cloud: FakeCloud | None = None,
        clock: FakeClock | None = None,
        **dispatch: Any,
    ) -> None:
        self.clock = clock or FakeClock()
        self.api = api or FakeApi()
        self.queue = FakeQueue(self.api)
        self.cloud = cloud or FakeCloud(self.clock, catalogue or [SMALL], price_factor)
        self.pool = FakePool(self.cloud, self.clock)
        self.prober = FakeProber(self.cloud, self.clock)
        self.board = PowerBoard()
        self.draining: set[str] = set()
        self.closed: set[str] = set()
        """Ready nodes whose admission the power controller closed (state unchanged)."""
        self.gpu_only: set[str] = set()
        """Nodes the power controller shows open to GPU work only (admission GPUOnly)."""
        self.policies = PolicyBook(namespace=NS, default_name="default")
        self.policies.observe(policy(**dispatch))
        self.dispatcher = Dispatcher(
            namespace=NS,
            dispatcher_id=dispatcher_id,
            settings=DispatchSettings(term_interval=5, term_timeout=30, sync_interval=1),
            queue=self.queue,
            policies=self.policies,
            pool=self.pool,
            cloud=self.cloud,
            prober=self.prober,
            board=self.board,
            clock=self.clock,
        )
        self.prober.vcpus = self._vcpus
        for name in self.api.objects:
            self.api.deliver(name)

    def _vcpus(self, uuid: str) -> int:
        for body in self.api.objects.values():
            if body["spec"]["uuid"] == uuid:
                return int(body["spec"].get("resources", {}).get("vcpus", 1))
        return 1

    def vm(self, name: str, itype: InstanceType = SMALL, ready: bool = True) -> FakeVM:
        """A VM of ours that already exists (adopted at `start`)."""
        return self.cloud.launch(name, itype, ready=ready)

    async def running(self, name: str = "c1", vm: str = "vm-a") -> str:
        """Start with one idle VM `vm`, run container `name` on it; its uuid."""
        self.vm(vm)
        await self.start()
        self.api.create(container(name))
        await self.rounds(2)
        assert self.runners() == {name: vm}
        return uuid_of(name)

    def power(self) -> None:
        """What the power controller would publish: a ready node is On, admission open
        (to GPU work only when in `gpu_only`); a node in `draining` is Draining, admission
        closed."""
        for w in self.pool.workers.values():
            if w.name in self.draining:
                self.board.set(w.name, NodePowerView(PowerState.DRAINING, False, w.ready))
            elif w.ready:
                vm = self.cloud.vms.get(w.name)
                busy = vm is not None and bool(vm.runners)
                state = PowerState.ACTIVE if busy else PowerState.ON_IDLE
                open_ = w.name not in self.closed
                only = w.name in self.gpu_only
                self.board.set(w.name, NodePowerView(state, open_, True, gpu_only=only))

    async def start(self) -> None:
        await self.dispatcher.start()
        self.power()

    async def settle(self) -> None:
        """Wait until every task the dispatcher spawned is done or parked at a slow start."""
        while True:
            busy = {t for t in self.dispatcher.ctx.tasks if not t.done()}
            busy -= self.prober.parked_tasks()
            if not busy:
                return
            self.prober.parked_changed.clear()
            parked = asyncio.ensure_future(self.prober.parked_changed.wait())
            await asyncio.wait({*busy, parked}, return_when=asyncio.FIRST_COMPLETED)
            parked.cancel()

    async def round(self, seconds: float = 1.0) -> None:
        self.clock.advance(seconds)
        await self.pool.probe_all()
        self.power()
        await self.dispatcher.step()
        await self.settle()

    async def rounds(self, n: int, seconds: float = 1.0) -> None:
        for _ in range(n):
            await self.round(seconds)

    async def unprobed_round(self, seconds: float = 1.0) -> None:
        """A round whose runner lists are those of the last probe (probes run on their
        own interval, so a round often plans with a listing some seconds old)."""
        self.clock.advance(seconds)
        self.power()
        await self.dispatcher.step()
        await self.settle()

    def runners(self) -> dict[str, str]:
        """Every runner on every VM: container name -> VM name."""
        return {name_of(u): vm.name for vm in self.cloud.vms.values() for u in vm.runners}

    def starts(self) -> list[str]:
        """Every runner start (container names), VM by VM."""
        return [name_of(u) for vm in self.cloud.vms.values() for u in vm.started]
