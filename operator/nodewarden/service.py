"""The operator process: configuration, logging, HTTP endpoint, leader election, kopf.

`nodewarden run` calls `run()`. Order: load config → structured logging → connect to the
API server → serve /healthz /readyz /metrics → wait until the CRDs are served (not ready
meanwhile) → wait for the dispatcher's Lease (standby until then) → run kopf with the
handler registry (PowerPolicy, PowerIntent) and the feed's informers (WorkerNode,
ContainerDispatch: the dispatcher and the power controller start once both have synced)
while renewing the Lease. Losing the Lease stops the handlers and exits non-zero so the
Deployment restarts the replica as a standby; two replicas never both act. Leadership is
this replica's own monotonic view (`nodewarden.fence.Leadership`), and every action port
asks it before acting: the Kubernetes writes (`Kube.fence`, whose token rides in every
status write), the runner client, the cloud layers and the power control, composed once
here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import uuid
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import kopf

from nodewarden.compose import build_controller, build_dispatcher
from nodewarden.config import ConfigError, OperatorConfig
from nodewarden.credential_setup import build_resolver
from nodewarden.dispatch import Dispatcher
from nodewarden.drain import drain
from nodewarden.endpoints import Health, serve
from nodewarden.exitdeadline import ExitDeadline
from nodewarden.fence import Fence
from nodewarden.fleet.board import PowerBoard
from nodewarden.fleet.policies import PolicyBook
from nodewarden.fleet.status import NodeStatusWriter
from nodewarden.handlers import build_registry
from nodewarden.handlers.context import HandlerContext
from nodewarden.handlers.feed import Feed
from nodewarden.handlers.validation import ContainerValidator, resync_loop
from nodewarden.heap import tune as tune_heap
from nodewarden.kube.client import Kube, KubeError, api_client_from
from nodewarden.kube.discovery import wait_for_crds
from nodewarden.kube.identity import username_of
from nodewarden.kube.lease import LeaderElector
from nodewarden.kube.pacing import pace
from nodewarden.kube.requesters import check as check_requesters
from nodewarden.kube.requesters import keep_checking
from nodewarden.limits import raise_open_files
from nodewarden.logs import setup_logging
from nodewarden.metrics import LEADER, LOOP_LAG
from nodewarden.ownership import DISPATCHER_LABEL
from nodewarden.shards.elector import ShardElector
from nodewarden.shards.release import run_releases
from nodewarden.shards.resharder import run_resharder
from nodewarden.shards.scope import ShardedPowerControl, ShardScope
from nodewarden.stallwatch import StallWatch, describe
from nodewarden.units import parse_duration

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
EXIT_MARGIN = 15.0
"""Seconds past `shutdown_grace` a stopping process may take before it is ended
(`exitdeadline.py`); with the chart's 10 s grace, 25 s: below its 30 s
terminationGracePeriodSeconds."""


class LeadershipLost(Exception):
    pass


def resolve_namespace(config: OperatorConfig, kube_default: str | None) -> str:
    if config.namespace:
        return config.namespace
    if SERVICE_ACCOUNT_NAMESPACE.exists():
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
    return kube_default or "default"


def kopf_settings(config: OperatorConfig) -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    settings.persistence.finalizer = "nodewarden.io/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="nodewarden.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="nodewarden.io", key="last-handled-configuration"
    )
    settings.posting.enabled = False  # nodewarden posts its own Events with stable reasons
    settings.scanning.disabled = True  # no cluster-wide CRD/namespace listing needed
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 10
    settings.networking.request_timeout = 30
    settings.execution.max_workers = 8
    settings.peering.standalone = True  # leadership comes from our Lease, not kopf peering
    return settings


def _login_handler(api_config: Any, namespace: str) -> Any:
    def login(**_: Any) -> kopf.ConnectionInfo:
        token = None
        auth = (api_config.api_key or {}).get("authorization") or (api_config.api_key or {}).get(
            "BearerToken"
        )
        if auth:
            token = auth.split(" ", 1)[1] if auth.lower().startswith("bearer ") else auth
        return kopf.ConnectionInfo(
            server=api_config.host,
            ca_path=api_config.ssl_ca_cert,
            insecure=not api_config.verify_ssl,
            token=token,
            certificate_path=api_config.cert_file,
            private_key_path=api_config.key_file,
            default_namespace=namespace,
        )

    return login


async def run(config: OperatorConfig) -> int:
    """Run one operator process until SIGINT/SIGTERM (0) or loss of leadership (1)."""
    setup_logging(config.log_format, config.log_level)
    tune_heap()
    files = raise_open_files(config.open_files)
    if files is not None:
        log.info("open-files limit", extra={"before": files[0], "after": files[1]})
    api = await api_client_from(config.kubeconfig)
    pace(api, config.kube_api)  # the writes' client; the feed's watches have their own
    kube = Kube(api, field_manager=f"nodewarden-{config.dispatcher_id}")
    kube_default = None
    if config.kubeconfig is not None:
        kube_default = _kubeconfig_namespace(config.kubeconfig)
    namespace = resolve_namespace(config, kube_default)
    identity = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    health = Health(
        extra={"dispatcherId": config.dispatcher_id, "identity": identity},
        metrics_auth=config.http.metrics_auth,
        token_refresh=config.http.token_refresh,
    )
    health.identity = identity
    if token_secret := config.management.token_secret_name:  # standbys check and relay too
        key = config.management.token_secret_key
        health.token_loader = partial(kube.read_secret, namespace, token_secret, key)
    http = config.http
    served = await serve(
        health, http.host, http.port, http.metrics_port, http.probe_port, http.limits()
    )
    port = served.port
    log.info(
        "nodewarden starting",
        extra={
            "dispatcher_id": config.dispatcher_id,
            "namespace": "*" if config.all_namespaces else namespace,
            "http_port": port,
            "identity": identity,
        },
    )

    stop = asyncio.Event()
    _handle_stop_signals(stop)
    # whatever hangs while stopping, the process ends (a lost Lease must restart the Pod)
    forced = ExitDeadline(parse_duration(config.shutdown_grace).total_seconds() + EXIT_MARGIN)

    async def arm_exit_deadline() -> None:
        await stop.wait()
        forced.arm(asyncio.get_running_loop())

    arming = asyncio.create_task(arm_exit_deadline())

    elector: LeaderElector | None = None
    keeping: asyncio.Task[None] | None = None
    lost = asyncio.Event()
    exit_code = 0

    def on_lost() -> None:
        lost.set()
        stop.set()

    shard_elector: ShardElector | None = None
    watching_shards: asyncio.Task[None] | None = None
    shards_watched = asyncio.Event()

    try:
        # not ready (/readyz 503, role "starting") until the CRDs are served
        if not await wait_for_crds(api, stop, health.extra):
            return 0
        if config.sharding.enabled:
            shard_elector = await _shard_elector(config, namespace, identity)
            # a standby watches the shard Leases (reads only: no membership, no shard), so
            # once it leads it judges a dead leader's shards expired from when it first
            # saw them, not from its first round: one Lease duration, not two
            watching_shards = asyncio.create_task(shard_elector.watch(shards_watched))
        if config.leader_election.enabled:
            # its own client (connection pool), so a burst of status writes never delays it
            lease_api = await api_client_from(config.kubeconfig)
            elector = LeaderElector(
                lease_api,
                namespace,
                config.lease_name,
                identity,
                lease_duration=config.leader_election.lease_duration,
                renew_interval=config.leader_election.renew_interval,
                retry_interval=config.leader_election.retry_interval,
                annotations=health.lease_annotations,
                labels={DISPATCHER_LABEL: config.dispatcher_id},
            )
            health.leader_lookup = elector.holder
            LEADER.labels(config.dispatcher_id).set(0)

            def standing_by() -> None:
                health.role = "standby"

            # role stays "starting" (not ready) until the first lease attempt has answered
            acquired = await elector.acquire(stop, on_standby=standing_by)
            shards_watched.set()
            if not acquired:
                return 0
            # renewals and the heartbeat start at once: leadership is counted from the
            # acquiring write, and every fenced action asks it from now on
            # both tasks begun here, before kopf starts (`LeaderElector.keep`)
            keeping = asyncio.create_task(
                elector.keep(on_lost, asyncio.create_task(elector.heartbeat()))
            )
            kube.fence = elector.leadership
        health.role = "leader"
        LEADER.labels(config.dispatcher_id).set(1)
        shards_watched.set()
        if watching_shards is not None:
            await watching_shards
        exit_code = await _act(
            config, kube, api, namespace, health, stop, lost, identity, shard_elector
        )
    finally:
        health.role = "stopping"
        LEADER.labels(config.dispatcher_id).set(0)
        if keeping is not None:
            keeping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeping
        if elector is not None:
            await elector.release()
            await elector.api.close()
        shards_watched.set()
        if watching_shards is not None:
            await asyncio.gather(watching_shards, return_exceptions=True)
        if shard_elector is not None:
            await shard_elector.api.close()
        await served.cleanup()
        await kube.close()
        arming.cancel()
        forced.disarm()
        log.info("nodewarden stopped", extra={"exit_code": exit_code})
    return exit_code


async def _act(
    config: OperatorConfig,
    kube: Kube,
    api: Any,
    namespace: str,
    health: Health,
    stop: asyncio.Event,
    lost: asyncio.Event,
    identity: str,
    shard_elector: ShardElector | None = None,
) -> int:
    """Act as the leader until `stop` (`lost`: set when leadership ended). Every action
    port is fenced by `kube.fence` (this replica's leadership, `nodewarden.fence`); with
    sharding on, power requests also by their node's shard Lease (`shard_elector`)."""
    fence = kube.fence
    try:
        credentials = await build_resolver(config, kube, namespace)
    except ConfigError as exc:
        log.error("cannot start: %s", exc)
        return 2
    ctx = HandlerContext(config=config, kube=kube, credentials=credentials)
    policies = PolicyBook(namespace=namespace, default_name=config.default_policy)
    board = PowerBoard()
    status = NodeStatusWriter(kube, namespace, config.dispatch.max_concurrent_writes)
    dispatcher: Dispatcher | None = None
    if config.dispatch.enabled:
        try:
            dispatcher = await build_dispatcher(
                config,
                kube,
                namespace,
                credentials,
                policies=policies,
                board=board,
                status=status,
                fence=fence,
            )
        except ConfigError as exc:
            log.error("cannot start the dispatcher: %s", exc)
            return 2
        health.status_provider = dispatcher.snapshot
    sharding = _sharding(config, shard_elector, fence) if shard_elector is not None else None
    controller = build_controller(
        config,
        kube,
        namespace,
        credentials,
        policies,
        board,
        status,
        dispatcher,
        fence=fence,
        replica=identity,
        scope=sharding.scope if sharding is not None else None,
    )
    if sharding is not None and isinstance(controller.control, ShardedPowerControl):
        sharding.elector.drain = controller.control.drain  # a release waits for requests
        sharding.control = controller.control  # and a node's RELEASE too (shards.release)
    health.explain_provider = controller.explain
    # who the API server knows us by: the requestedBy of policy-made intents, the only
    # requester the admission policy admits for source Policy (docs/security.md)
    username = config.requesters.operator_username or username_of(api.configuration)
    controller.intents.set_requester(username)
    if username is None:
        log.warning(
            "the operator's user name could not be read from its credentials; set "
            "requesters.operator_username, or the requester admission policy refuses the "
            "PowerIntents it makes"
        )
    if config.management.token_secret_name:
        try:
            token = await kube.read_secret(
                namespace, config.management.token_secret_name, config.management.token_secret_key
            )
            health.status_token = token
        except KubeError as exc:
            log.error("management status endpoint disabled: %s", exc)
    registry = build_registry(ctx, dispatcher, controller, policies)
    kopf.on.login(registry=registry)(_login_handler(api.configuration, namespace))
    # The hot kinds come from informers, on their own client (a burst of status writes
    # never holds up a watch); the consumers start once both have their first LIST.
    feed_api = await api_client_from(config.kubeconfig)
    feed = Feed(
        feed_api,
        None if config.all_namespaces else namespace,
        kube=kube,
        policies=policies,
        controller=controller,
        status=status,
        dispatcher=dispatcher,
        validator=ContainerValidator(ctx) if dispatcher is None else None,
        scope=sharding.scope if sharding is not None else None,
    )
    ready = asyncio.Event()
    failed = asyncio.Event()
    # kopf stops only after the dispatcher and the power controller have: it cancels every
    # task it did not start after a 5 s grace, which would cut runner starts and power
    # requests short at a point the service does not choose (see `nodewarden.drain`)
    kopf_stop = asyncio.Event()
    grace = parse_duration(config.shutdown_grace).total_seconds()

    async def mark_ready() -> None:
        await ready.wait()
        # kopf has installed its own SIGINT/SIGTERM handlers by now: take them back, so a
        # signal stops the service's components first (`act`), and kopf after them
        _handle_stop_signals(stop)
        health.handlers_ready = True
        log.info("handlers running")

    async def stop_kopf_last() -> None:
        await stop.wait()
        # `act` winds down within the grace; a start-up still under way (the dispatcher's
        # first probe round) is cancelled once the grace is over
        await asyncio.wait([acting], timeout=grace + 5.0)
        if not acting.done():
            acting.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await acting
        await feed.stop()  # its watches too: kopf would wait 5 s for them
        # and so for every task begun after it started (the requester checks): ours end now
        current = asyncio.current_task()
        others = [t for t in tasks if t is not current and not t.done()]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)
        kopf_stop.set()

    async def wind_down(loops: list[asyncio.Task[None]]) -> None:
        """Stop acting: no new rounds; the round, writes, runner starts and power requests
        under way finish within `shutdown_grace` (none after a lost lease); then the rest
        is cancelled."""
        budget = 0.0 if lost.is_set() else grace
        deadline = asyncio.get_running_loop().time() + budget
        controller.halt()
        if dispatcher is not None:
            dispatcher.halt()
        await drain(loops, budget)
        left = max(0.0, deadline - asyncio.get_running_loop().time())
        stops = [controller.stop(left)]
        if dispatcher is not None:
            stops.append(dispatcher.stop(left))
        await asyncio.gather(*stops)

    async def act() -> None:
        """The power controller starts at once and decides from what it has (a node whose
        telemetry is missing is a DEFER; until the dispatcher's first plan, every node's
        work is unknown, never idle: `await_ledger`); the dispatcher recovers beside it
        (queue, cloud, a first probe of every node) and then runs its rounds."""
        starting = asyncio.ensure_future(ready.wait())
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait([starting, stopping], return_when=asyncio.FIRST_COMPLETED)
        starting.cancel()
        if stop.is_set():
            stopping.cancel()
            return
        try:
            await feed.start()
            if sharding is not None:  # after the feed: a shard taken re-routes its nodes
                tasks.extend(sharding.start(kube, stop))
            controller.requester_admission(await check_requesters(kube, namespace, username))
            if dispatcher is not None:
                controller.await_ledger()  # work is unknown until the first plan
            await controller.start()
            loops = [asyncio.create_task(controller.run())]
            if dispatcher is not None:
                try:
                    await dispatcher.start()
                except BaseException:
                    await wind_down(loops)
                    raise
            tasks.append(
                asyncio.create_task(
                    keep_checking(
                        kube,
                        namespace,
                        username,
                        controller.requester_admission,
                        config.requesters.check_interval,
                    )
                )
            )
            if dispatcher is not None:
                loops.append(asyncio.create_task(dispatcher.run()))
            done, _ = await asyncio.wait([*loops, stopping], return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            await wind_down(loops)
            for finished in done:
                if finished is stopping:
                    continue
                if finished.cancelled():
                    continue
                error = finished.exception()
                if error is not None:
                    raise error
                if not stop.is_set():
                    raise RuntimeError("a loop of the dispatcher or power controller ended")
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("the dispatcher or power controller stopped with an error; stopping")
            failed.set()
            stop.set()

    async def watch_loop_lag() -> None:
        loop = asyncio.get_running_loop()
        stalls = StallWatch()
        stalls.start(loop)
        try:
            while True:
                before = loop.time()
                await asyncio.sleep(1.0)
                lag = loop.time() - before - 1.0
                LOOP_LAG.set(lag)
                if lag > 1.0:
                    log.warning(
                        "event loop blocked for %.1fs (in: %s)", lag, describe(stalls.take())
                    )
        finally:
            stalls.stop()

    tasks = [
        asyncio.create_task(mark_ready()),
        asyncio.create_task(watch_loop_lag()),
        asyncio.create_task(resync_loop(ctx, namespace, controller)),
    ]
    acting = asyncio.create_task(act())
    tasks += [acting, asyncio.create_task(stop_kopf_last())]
    try:
        await kopf.operator(
            registry=registry,
            settings=kopf_settings(config),
            standalone=True,
            clusterwide=config.all_namespaces,
            namespaces=() if config.all_namespaces else [namespace],
            stop_flag=kopf_stop,
            ready_flag=ready,
        )
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await controller.stop()
        if dispatcher is not None:
            await dispatcher.stop()
        await feed.stop()
        await feed_api.close()
        if sharding is not None:
            await sharding.elector.close()
    return 1 if lost.is_set() or failed.is_set() else 0


@dataclass
class _Sharding:
    """Sharding on: this replica's shard elector and the scope of its power path."""

    elector: ShardElector
    scope: ShardScope
    labeller_interval: float
    control: ShardedPowerControl | None = None

    def start(self, kube: Kube, stop: asyncio.Event) -> list[asyncio.Task[None]]:
        """The balance rounds, the resharder (labels new nodes, moves nodes on a count
        change; conditional writes, harmless twice) and this owner's RELEASEs."""
        namespace, dispatcher_id = self.elector.namespace, self.elector.dispatcher_id
        tasks = [
            asyncio.create_task(self.elector.run(stop), name="shard-elector"),
            asyncio.create_task(
                run_resharder(
                    kube,
                    namespace,
                    self.elector.shards,
                    dispatcher_id,
                    stop,
                    self.labeller_interval,
                ),
                name="shard-resharder",
            ),
        ]
        if self.control is not None:
            releases = run_releases(kube, namespace, self.scope, self.control, stop)
            tasks.append(asyncio.create_task(releases, name="shard-releases"))
        return tasks


async def _shard_elector(config: OperatorConfig, namespace: str, identity: str) -> ShardElector:
    """The shard elector, on its own client (a burst of writes never delays it)."""
    election = config.leader_election
    return ShardElector(
        await api_client_from(config.kubeconfig),
        namespace,
        config.dispatcher_id,
        identity,
        config.sharding.shards,
        lease_duration=election.lease_duration,
        renew_interval=election.renew_interval,
        retry_interval=election.retry_interval,
    )


def _sharding(config: OperatorConfig, elector: ShardElector, fence: Fence) -> _Sharding:
    """Sharding on: the scope of the power path. The replica holding the dispatcher Lease
    holds the shards, so every power request asks both that Lease (`fence`) and its
    node's shard Lease (docs/sharding.md: not yet active-active)."""
    scope = ShardScope(elector.leadership, also=fence)
    elector.on_acquired = lambda shard, _leadership: scope.acquired(shard)
    elector.on_released = lambda shard, _reason: scope.released(shard)
    return _Sharding(elector, scope, config.sharding.labeller_interval)


def _handle_stop_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)


def _kubeconfig_namespace(path: Path) -> str | None:
    import yaml

    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return None
    current = data.get("current-context")
    for ctx in data.get("contexts", []) or []:
        if ctx.get("name") == current:
            ns = (ctx.get("context") or {}).get("namespace")
            return str(ns) if ns else None
    return None
