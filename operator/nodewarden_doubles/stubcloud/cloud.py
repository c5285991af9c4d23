"""The stub cloud: fake VMs, each backed by a real SSH server on a loopback port.

A `StubCloud` is the provider behind `StubNodeDriver` (libcloud provider
"nodewarden-stub"). It keeps its VMs in memory and owns an asyncio event loop running in
its own thread; each VM's worker (by default a `nodewarden_doubles.stubworker.StubWorker`, an
asyncssh server imitating a worker node) runs on that loop.

Threading design: libcloud drivers are synchronous and run in the cloud adapter's worker
threads, so the `api_*` methods are thread-safe (one lock around the VM table) and never
block on the loop: a create records the VM and schedules its boot with
`asyncio.run_coroutine_threadsafe`; a destroy marks it and schedules its teardown. The
boot coroutine starts the worker after `ssh_start_delay` and records its port under the
lock. The caller's own event loop (the operator's) is never used, so the stub works the
same whether the caller is sync or async and the operator's loop measures only itself.

Addresses: VMs report private addresses from 198.18.0.0/15 (RFC 2544 benchmarking range,
never routed) -- nothing ever connects to them. `resolver` maps such an address to
("127.0.0.1", port of the VM's SSH server); any other non-loopback address is refused.

Errors are raised the way libcloud drivers raise them (`BaseHTTPError` with EC2-style
"Code: message" text, `RateLimitReachedError` with Retry-After, `InvalidCredsError`), so
the adapter's classification is exercised on realistic shapes.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import itertools
import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Coroutine, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, ClassVar, Protocol, TypeVar

from libcloud.common.exceptions import exception_from_message
from libcloud.common.types import InvalidCredsError
from pydantic import SecretStr

from nodewarden.cloud.initscript import parse_init_script
from nodewarden.scheduling.instancetypes import InstanceType
from nodewarden.ssh.addressing import Endpoint, ResolutionRefused, is_loopback
from nodewarden_doubles.stubcloud.faults import StubFaults

log = logging.getLogger(__name__)

ADDRESS_NETWORK = ipaddress.IPv4Network("198.18.0.0/15")

T = TypeVar("T")


class WorkerHandle(Protocol):
    """What the stub cloud needs from a VM's worker."""

    async def start(self) -> int:
        """Start listening on 127.0.0.1; return the port."""
        ...

    async def stop(self) -> None: ...


@dataclass(frozen=True)
class WorkerSpec:
    """What a VM's worker is told: who may log in, its secret and its faults."""

    instance_id: str
    hostname: str
    authorized_key: str | None
    login_user: str
    instance_secret: SecretStr | None
    boot_delay: float
    broken: bool
    hung: bool
    hung_mode: str
    runner_crash_rate: float
    seed: int
    on_poweroff: Callable[[], None] | None = None
    """Called (on the stub loop) when the node powers itself off."""


WorkerFactory = Callable[[WorkerSpec], WorkerHandle]


@dataclass
class StubVM:
    """One fake VM (internal, guarded by the cloud's lock)."""

    id: str
    name: str
    size: str
    image: str
    tags: dict[str, str]
    private_ip: str
    created_at: datetime
    vcpus: int
    quota_group: str | None
    spot: bool
    user_data: SecretStr
    broken: bool
    hung: bool
    state: str = "pending"
    port: int | None = None
    previous_tags: dict[str, str] | None = None
    tags_changed_at: float = 0.0
    destroying: bool = False
    worker: WorkerHandle | None = None
    boot_future: Future[None] | None = field(default=None, repr=False)


@dataclass(frozen=True)
class StubVMView:
    """A consistent copy of a VM as the API reports it."""

    id: str
    name: str
    size: str
    image: str
    tags: dict[str, str]
    private_ip: str
    created_at: datetime
    state: str
    price: float | None
    port: int | None
    broken: bool
    hung: bool


class StubCloud:
    """An in-process fake cloud; see the module docstring. Use as a context manager."""

    _registry: ClassVar[dict[str, StubCloud]] = {}
    _registry_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(
        self,
        name: str = "default",
        *,
        faults: StubFaults | None = None,
        catalogue: list[InstanceType] | None = None,
        credentials: tuple[str, str | None] | None = None,
        worker_factory: WorkerFactory | None = None,
    ) -> None:
        self.name = name
        self._faults = faults or StubFaults()
        self._dice = random.Random(self._faults.seed)
        self._catalogue = {t.provider_type: t for t in (catalogue or [])}
        self._credentials = credentials
        self._worker_factory = worker_factory
        self._lock = threading.Lock()
        self._vms: dict[str, StubVM] = {}
        self._run_ledger: list[dict[str, object]] = []
        self._ip_counter = itertools.count(1)
        self._id_counter = itertools.count(1)
        self._forced_rate_limits = 0
        self._forced_retry_after: float | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pending: set[Future[None]] = set()
        self.api_calls: dict[str, int] = {}
        self.api_log: deque[tuple[str, bool]] = deque(maxlen=100_000)
        """API calls in arrival order (the latest 100,000): (operation, refused as rate
        limited)."""
        self.resolver = StubAddressResolver(self)

    # ---- lifecycle -----------------------------------------------------------------------

    def start(self) -> StubCloud:
        """Start the worker loop thread and register under `name` for the driver."""
        with self._registry_lock:
            if self.name in self._registry:
                raise ValueError(f"a stub cloud named {self.name!r} is already running")
            self._registry[self.name] = self
        loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(ready.set)
            loop.run_forever()

        self._loop = loop
        self._thread = threading.Thread(target=run, name=f"stub-cloud-{self.name}", daemon=True)
        self._thread.start()
        ready.wait()
        log.info("stub cloud started", extra={"stub_cloud": self.name})
        return self

    def close(self, timeout: float = 60.0) -> None:
        """Stop every VM's worker, the loop and the thread; unregister."""
        with self._registry_lock:
            if self._registry.get(self.name) is self:
                del self._registry[self.name]
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        with self._lock:
            vms = list(self._vms.values())
            self._vms.clear()
            pending = list(self._pending)
        # Boots and teardowns in flight are cancelled (they mostly sleep: start delay,
        # destroy delay) and awaited; then every worker that was started is stopped.
        for future in pending:
            future.cancel()
        for future in pending:
            with contextlib.suppress(BaseException):
                future.result(timeout)
        stop_all = asyncio.run_coroutine_threadsafe(self._stop_workers(vms), loop)
        with contextlib.suppress(Exception):
            stop_all.result(timeout)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout)
        if not thread.is_alive():
            loop.close()
        self._loop = None
        self._thread = None
        log.info("stub cloud closed", extra={"stub_cloud": self.name})

    def __enter__(self) -> StubCloud:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @classmethod
    def get(cls, name: str) -> StubCloud:
        with cls._registry_lock:
            cloud = cls._registry.get(name)
        if cloud is None:
            raise LookupError(
                f"no stub cloud named {name!r} is running; start one with "
                f"StubCloud({name!r}).start() before creating the driver"
            )
        return cloud

    # ---- test and demo controls -----------------------------------------------------------

    @property
    def faults(self) -> StubFaults:
        return self._faults

    def set_faults(self, **changes: object) -> None:
        """Change fault knobs at run time (the seed keeps its dice)."""
        with self._lock:
            self._faults = StubFaults.model_validate({**self._faults.model_dump(), **changes})

    def force_rate_limit(self, calls: int, retry_after: float | None = None) -> None:
        """Refuse the next `calls` API calls as rate limited."""
        with self._lock:
            self._forced_rate_limits = calls
            self._forced_retry_after = retry_after

    def catalogue(self) -> list[InstanceType]:
        """The instance types the cloud offers (empty = any size accepted, 1 vCPU each)."""
        return list(self._catalogue.values())

    def vms(self) -> list[StubVMView]:
        with self._lock:
            return [self._view(vm, tags=vm.tags) for vm in self._vms.values()]

    def vm(self, instance_id: str) -> StubVMView | None:
        with self._lock:
            vm = self._vms.get(instance_id)
            return self._view(vm, tags=vm.tags) if vm else None

    def worker(self, instance_id: str) -> WorkerHandle | None:
        """The worker behind a VM once its SSH server listens (tests read its host key)."""
        with self._lock:
            vm = self._vms.get(instance_id)
            return vm.worker if vm is not None else None

    def wait_for_workers(self, count: int, timeout: float) -> int:
        """Block until `count` VMs have a listening SSH server (or timeout); return how many."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                up = sum(1 for vm in self._vms.values() if vm.port is not None)
            if up >= count or time.monotonic() >= deadline:
                return up
            time.sleep(0.02)

    def endpoints(self) -> dict[str, int]:
        """Address -> loopback SSH port of every VM whose SSH server listens."""
        with self._lock:
            return {
                vm.private_ip: vm.port
                for vm in self._vms.values()
                if vm.port is not None and not vm.destroying
            }

    def submit(self, make: Callable[[], Coroutine[Any, Any, T]]) -> Future[T]:
        """Run a coroutine on the stub loop (where the workers live); its future.

        For controls of live workers from other threads (the stub server's handlers):
        the coroutine runs next to the worker, so no state is touched from two threads.
        """
        loop = self._loop
        if loop is None:
            raise RuntimeError(f"stub cloud {self.name!r} is not started")

        async def run() -> T:
            return await make()

        return asyncio.run_coroutine_threadsafe(run(), loop)

    def endpoint(self, address: str) -> Endpoint | None:
        """The loopback endpoint of the VM with this address, when its SSH server listens."""
        with self._lock:
            for vm in self._vms.values():
                if vm.private_ip == address:
                    return Endpoint("127.0.0.1", vm.port) if vm.port is not None else None
        return None

    # ---- API (called from driver threads) -------------------------------------------------

    def check_credentials(self, key: str, secret: str | None) -> None:
        if self._credentials is None:
            return
        want_key, want_secret = self._credentials
        ok = hmac.compare_digest(key.encode(), want_key.encode()) and hmac.compare_digest(
            (secret or "").encode(), (want_secret or "").encode()
        )
        if not ok:
            raise InvalidCredsError(
                "AuthFailure: AWS was not able to validate the provided access credentials"
            )

    def api_list(self, filters: Mapping[str, str | list[str]] | None) -> list[StubVMView]:
        """EC2-style filters: {"tag:KEY": value or [values], "tag-key": key or [keys]}."""
        self._api_call("list")
        now = time.monotonic()
        tag_filters: dict[str, set[str]] = {}
        keys_present: set[str] = set()
        for name, value in (filters or {}).items():
            values = {value} if isinstance(value, str) else set(value)
            if name.startswith("tag:"):
                tag_filters[name[4:]] = values
            elif name == "tag-key":
                keys_present |= values
            else:
                raise _http_error(400, f"InvalidParameterValue: unsupported filter {name!r}")
        with self._lock:
            out = []
            for vm in self._vms.values():
                tags = vm.tags
                if (
                    vm.previous_tags is not None
                    and now - vm.tags_changed_at < self._faults.stale_tags_for
                ):
                    tags = vm.previous_tags
                if all(tags.get(k) in v for k, v in tag_filters.items()) and keys_present <= set(
                    tags
                ):
                    out.append(self._view(vm, tags=tags))
            return out

    def api_create(
        self,
        *,
        name: str,
        size: str,
        image: str,
        user_data: str | None,
        tags: Mapping[str, str],
        spot: bool,
    ) -> StubVMView:
        self._api_call("create")
        with self._lock:
            faults = self._faults
            itype = self._catalogue.get(size)
            if self._catalogue and itype is None:
                raise _http_error(
                    400, f"InvalidParameterValue: Invalid value '{size}' for InstanceType."
                )
            vcpus = itype.vcpus if itype else 1
            group = itype.quota_group if itype else None
            live = [vm for vm in self._vms.values() if not vm.destroying]
            if self._dice.random() < faults.create_error_rate:
                raise _http_error(
                    500, "InternalError: An internal error has occurred (stub fault)."
                )
            if faults.instance_quota is not None and len(live) >= faults.instance_quota:
                raise _http_error(
                    400,
                    "InstanceLimitExceeded: Your quota allows for 0 more running instance(s). "
                    "You requested at least 1.",
                )
            if group is not None and group in faults.vcpu_quota:
                used = sum(vm.vcpus for vm in live if vm.quota_group == group)
                if used + vcpus > faults.vcpu_quota[group]:
                    raise _http_error(
                        400,
                        f"VcpuLimitExceeded: You have requested more vCPU capacity than your "
                        f"current vCPU limit of {faults.vcpu_quota[group]} allows for the "
                        f"instance bucket that the specified instance type belongs to.",
                    )
            if size in faults.type_capacity:
                same = sum(1 for vm in live if vm.size == size)
                if same >= faults.type_capacity[size]:
                    raise _http_error(
                        500,
                        f"InsufficientInstanceCapacity: We currently do not have sufficient "
                        f"{size} capacity in the Availability Zone you requested.",
                    )
            instance_id = f"i-stub{next(self._id_counter):012x}"
            offset = next(self._ip_counter)
            if offset >= ADDRESS_NETWORK.num_addresses - 1:
                raise _http_error(
                    400, "InsufficientFreeAddressesInSubnet: stub address range exhausted"
                )
            vm = StubVM(
                id=instance_id,
                name=name,
                size=size,
                image=image,
                tags={"Name": name, **tags},
                private_ip=str(ADDRESS_NETWORK.network_address + offset),
                created_at=datetime.now(tz=UTC),
                vcpus=vcpus,
                quota_group=group,
                spot=spot,
                user_data=SecretStr(user_data or ""),
                broken=self._dice.random() < faults.broken_rate,
                hung=self._dice.random() < faults.hung_ssh_rate,
            )
            self._vms[instance_id] = vm
            seed = self._dice.randrange(2**31)
            view = self._view(vm, tags=vm.tags)
        spec = self._worker_spec(vm, seed)
        self._schedule(self._boot(instance_id, spec, self._faults.ssh_start_delay))
        log.debug("stub VM created", extra={"instance_id": instance_id, "size": size})
        return view

    def api_create_tags(self, instance_id: str, tags: Mapping[str, str]) -> None:
        self._api_call("create_tags")
        with self._lock:
            vm = self._require(instance_id)
            self._remember_tags(vm)
            vm.tags.update(tags)

    def api_delete_tags(self, instance_id: str, keys: list[str]) -> None:
        self._api_call("delete_tags")
        with self._lock:
            vm = self._require(instance_id)
            self._remember_tags(vm)
            for key in keys:
                vm.tags.pop(key, None)

    def api_destroy(self, instance_id: str) -> None:
        self._api_call("destroy")
        with self._lock:
            vm = self._require(instance_id)
            if self._dice.random() < self._faults.destroy_error_rate:
                raise _http_error(
                    500, "InternalError: An internal error has occurred (stub fault)."
                )
            if vm.destroying:
                return
            vm.destroying = True
            vm.state = "stopping"
            delay = self._faults.destroy_delay
            if delay <= 0:
                # Gone from the API at once; its SSH server stops on the stub loop.
                del self._vms[instance_id]
        self._schedule(self._teardown(instance_id, delay, vm))

    # ---- internals -------------------------------------------------------------------------

    def _api_call(self, operation: str) -> None:
        with self._lock:
            self.api_calls[operation] = self.api_calls.get(operation, 0) + 1
            faults = self._faults
            forced = self._forced_rate_limits > 0
            if forced:
                self._forced_rate_limits -= 1
            limited = forced or self._dice.random() < faults.rate_limit_rate
            retry_after = self._forced_retry_after if forced else faults.rate_limit_retry_after
            self.api_log.append((operation, limited))
        if not limited:
            return
        headers = {"retry-after": f"{retry_after:g}"} if retry_after is not None else {}
        if faults.rate_limit_style == "http-429":
            raise _http_error(429, "Too Many Requests", headers=headers)
        raise _http_error(503, "RequestLimitExceeded: Request limit exceeded.", headers=headers)

    def _require(self, instance_id: str) -> StubVM:
        vm = self._vms.get(instance_id)
        if vm is None:
            raise _http_error(
                400,
                f"InvalidInstanceID.NotFound: The instance ID '{instance_id}' does not exist",
            )
        return vm

    def _remember_tags(self, vm: StubVM) -> None:
        # Keep the tags as last seen before the current stale window began.
        now = time.monotonic()
        if vm.previous_tags is None or now - vm.tags_changed_at >= self._faults.stale_tags_for:
            vm.previous_tags = dict(vm.tags)
        vm.tags_changed_at = now

    def _view(self, vm: StubVM, *, tags: Mapping[str, str]) -> StubVMView:
        itype = self._catalogue.get(vm.size)
        return StubVMView(
            id=vm.id,
            name=vm.name,
            size=vm.size,
            image=vm.image,
            tags=dict(tags),
            private_ip=vm.private_ip,
            created_at=vm.created_at,
            state=vm.state,
            price=itype.price if itype else None,
            port=vm.port,
            broken=vm.broken,
            hung=vm.hung,
        )

    def _worker_spec(self, vm: StubVM, seed: int) -> WorkerSpec:
        contents = parse_init_script(vm.user_data.get_secret_value())
        return WorkerSpec(
            instance_id=vm.id,
            hostname=vm.name,
            authorized_key=contents.ssh_public_key if contents else None,
            login_user=contents.user if contents else "root",
            instance_secret=contents.instance_secret if contents else None,
            boot_delay=self._faults.boot_delay,
            broken=vm.broken,
            hung=vm.hung,
            hung_mode=self._faults.hung_ssh_mode,
            runner_crash_rate=self._faults.runner_crash_rate,
            seed=seed,
            on_poweroff=lambda: self._powered_off(vm.id),
        )

    def _schedule(self, coro: object) -> None:
        loop = self._loop
        if loop is None:
            raise RuntimeError(f"stub cloud {self.name!r} is not started")
        future: Future[None] = asyncio.run_coroutine_threadsafe(coro, loop)  # type: ignore[arg-type]
        with self._lock:
            self._pending.add(future)
        future.add_done_callback(self._done)

    def _done(self, future: Future[None]) -> None:
        with self._lock:
            self._pending.discard(future)
        if not future.cancelled() and future.exception() is not None:
            log.error("stub cloud task failed", exc_info=future.exception())

    async def _boot(self, instance_id: str, spec: WorkerSpec, delay: float) -> None:
        if delay > 0:
            await asyncio.sleep(delay)
        with self._lock:
            vm = self._vms.get(instance_id)
            if vm is None or vm.destroying:
                return
        worker = (self._worker_factory or default_worker_factory)(spec)
        port = await worker.start()
        with self._lock:
            vm = self._vms.get(instance_id)
            alive = vm is not None and not vm.destroying
            if vm is not None and alive:
                vm.worker = worker
                vm.port = port
                vm.state = "running"
        if not alive:
            await worker.stop()

    def _powered_off(self, instance_id: str) -> None:
        # The node ran `poweroff`: the cloud sees it stopped; its SSH server is gone.
        with self._lock:
            vm = self._vms.get(instance_id)
            if vm is not None and not vm.destroying:
                vm.state = "stopped"
                vm.port = None

    async def _teardown(self, instance_id: str, delay: float, vm: StubVM) -> None:
        if delay > 0:
            await asyncio.sleep(delay)
            with self._lock:
                self._vms.pop(instance_id, None)
        with self._lock:
            worker = vm.worker
            self._run_ledger.extend(_runs_of(vm, worker, ending=True))
            vm.worker = None
        if worker is not None:
            await worker.stop()

    def finish_destroys(self) -> int:
        """Take every VM listed as stopping off the list now, as the end of its destroy
        delay would (a test decides when a destroyed instance leaves the list); returns
        how many. Their SSH workers stop when the delay ends, as usual."""
        with self._lock:
            gone = [iid for iid, vm in self._vms.items() if vm.destroying]
            for iid in gone:
                del self._vms[iid]
        return len(gone)

    def runs(self) -> list[dict[str, object]]:
        """Every run on every VM, destroyed ones included (test evidence of "no container
        ran twice" and of capacity): instance id and type (`size`), container uuid, pid,
        start and end time (`endedAt`/`end`, null while running), owner
        (`FakeContainer.record`)."""
        with self._lock:
            live = [r for vm in self._vms.values() for r in _runs_of(vm, vm.worker)]
            return [*self._run_ledger, *live]

    async def _stop_workers(self, vms: list[StubVM]) -> None:
        workers = [vm.worker for vm in vms if vm.worker is not None]
        await asyncio.gather(*(w.stop() for w in workers), return_exceptions=True)


def _runs_of(vm: StubVM, worker: object, ending: bool = False) -> list[dict[str, object]]:
    """The VM's run ledger (`FakeRunner.ledger`: start, end, owner) with its instance id
    and type; `ending`: the VM is destroyed now, so the runs still going end with it
    (powerLoss)."""
    runner = getattr(worker, "runner", None)
    if runner is None:
        return []
    if ending:
        runner.reboot()
    return [{"instanceId": vm.id, "size": vm.size, **record} for record in runner.ledger()]


def _http_error(code: int, message: str, headers: dict[str, str] | None = None) -> Exception:
    """The exception a libcloud driver raises for an HTTP error response."""
    error: Exception = exception_from_message(  # type: ignore[no-untyped-call]
        code=code, message=message, headers=headers
    )
    return error


class StubAddressResolver:
    """`nodewarden.ssh.addressing.AddressResolver` for the stub cloud's fake addresses.

    A VM address maps to its SSH server on 127.0.0.1 (the requested port is ignored: the
    server listens where it listens). Loopback addresses resolve as given; everything
    else is refused, so nothing ever dials a non-loopback address.
    """

    def __init__(self, cloud: StubCloud) -> None:
        self._cloud = cloud

    def resolve(self, host: str, port: int) -> Endpoint:
        endpoint = self._cloud.endpoint(host)
        if endpoint is not None:
            return endpoint
        if is_loopback(host):
            return Endpoint(host, port)
        raise ResolutionRefused(
            f"{host} is not the address of a stub VM with a listening SSH server"
        )


def default_worker_factory(spec: WorkerSpec) -> WorkerHandle:
    """A `nodewarden_doubles.stubworker.StubWorker` configured from the VM's init script and faults."""
    from nodewarden_doubles.stubcloud.worker import make_stub_worker

    return make_stub_worker(spec)
