"""The composition root: the dispatcher, the worker pool and the power controller built
once per namespace from the configuration, sharing one fleet state (board, policy book,
status writer).

`build_dispatcher(config, kube, namespace)` reads the Secrets it needs (SSH key, cloud
credentials) and composes the dispatcher and its pool. The dispatcher sees its parts
through the Protocols of `dispatch.ports`; `adapters_of` gives the concrete adapters back
to wire the same parts to the power controller (`build_controller`) and the informers.
Nothing else in the package builds these objects.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from pydantic import SecretStr

from nodewarden.clock import utc_now
from nodewarden.cloud.config import CloudCredentials
from nodewarden.cloud.facade import CloudFacade, build_cloud
from nodewarden.cloud.plugins import wire_plugin
from nodewarden.cloud.protocol import CloudMetricsHook
from nodewarden.config import ConfigError, OperatorConfig
from nodewarden.credentials import CredentialResolver
from nodewarden.dispatch.admitting import ApiAdmission
from nodewarden.dispatch.dispatcher import Dispatcher
from nodewarden.dispatch.queue import ContainerQueue
from nodewarden.fence import Fence, Unfenced
from nodewarden.fleet.board import PowerBoard
from nodewarden.fleet.policies import PolicyBook
from nodewarden.fleet.status import NodeStatusWriter
from nodewarden.kube.client import Kube, KubeError
from nodewarden.kube.useragent import user_agent
from nodewarden.metrics import CLOUD_ERRORS, CLOUD_OPERATIONS
from nodewarden.pool.identity import master_secret
from nodewarden.pool.workers import WorkerPool
from nodewarden.power.control import PowerControl
from nodewarden.power.controller import PowerController
from nodewarden.power.runtime import ControllerSettings, EnergyBook
from nodewarden.scheduling.instancetypes import Catalogue
from nodewarden.shards.scope import ShardedPowerControl, ShardScope
from nodewarden.ssh.addressing import DirectResolver
from nodewarden.ssh.fenced import FencedRunners
from nodewarden.ssh.prober import SshProber
from nodewarden.ssh.throttle import ProbeThrottle
from nodewarden.units import parse_duration

log = logging.getLogger(__name__)

__all__ = ["Adapters", "adapters_of", "build_controller", "build_dispatcher"]


def _no_change_hook() -> None:
    """The pool's change hook until its dispatcher exists (then `dispatcher.poke`)."""


class _Metrics(CloudMetricsHook):
    """Feeds the cloud layer's call outcomes into nodewarden's own metrics."""

    def observe(self, operation: str, outcome: str, seconds: float) -> None:
        CLOUD_OPERATIONS.labels(operation, "ok" if outcome == "ok" else "error").inc()
        if outcome != "ok":
            CLOUD_ERRORS.labels(outcome).inc()


async def _secret(kube: Kube, namespace: str, name: str, key: str, what: str) -> SecretStr:
    try:
        return await kube.read_secret(namespace, name, key)
    except KubeError as exc:
        raise ConfigError(f"{what}: {exc}; create the Secret or fix the reference") from exc


async def build_dispatcher(
    config: OperatorConfig,
    kube: Kube,
    namespace: str,
    credentials: CredentialResolver,
    *,
    policies: PolicyBook | None = None,
    board: PowerBoard | None = None,
    status: NodeStatusWriter | None = None,
    fence: Fence | None = None,
    replica: str | None = None,
) -> Dispatcher:
    """Compose the dispatcher; ConfigError names what is missing. The operator's SSH key
    comes from the credential resolver (`credentials.operator_key`). The worker pool
    serves side nodes with or without a cloud; `board` and `status` are shared with the
    power controller. `fence` (this replica's leadership) wraps the action ports once:
    the cloud layers (`cloud.fence`) and the runner client (`ssh.fenced`). A cloud driver
    plugin that provides the nodes' wires (`cloud.plugins.wire_plugin`: a hollow fleet)
    gives the prober its dialer, told `replica` (the Lease holder identity)."""
    fence = fence or Unfenced()
    settings = config.dispatch
    queue = ContainerQueue(
        kube=kube,
        namespace=namespace,
        dispatcher_id=config.dispatcher_id,
        writes=asyncio.Semaphore(settings.max_concurrent_writes),
    )
    policies = policies or PolicyBook(namespace=namespace, default_name=config.default_policy)
    board = board or PowerBoard()
    cloud: CloudFacade | None = None

    if config.cloud is not None:
        if credentials.operator_key is None:
            raise ConfigError(
                "dispatch.ssh_private_key_secret: a cloud is configured, so nodewarden needs an "
                "SSH private key Secret to reach its nodes; set {name, key}"
            )
        cloud_credentials = None
        if config.cloud.credentials is not None:
            cref = config.cloud.credentials
            key = await _secret(
                kube, namespace, cref.key_ref.name, cref.key_ref.key, "cloud.credentials.key_ref"
            )
            secret = None
            if cref.secret_ref is not None:
                secret = await _secret(
                    kube,
                    namespace,
                    cref.secret_ref.name,
                    cref.secret_ref.key,
                    "cloud.credentials.secret_ref",
                )
            cloud_credentials = CloudCredentials(key=key, secret=secret)
        cloud = build_cloud(
            config.cloud, cloud_credentials, config.dispatcher_id, metrics=_Metrics(), fence=fence
        )
    else:
        log.info("no cloud configured: containers run on side nodes only")
    wires = wire_plugin(config.cloud)
    prober = SshProber(
        config.ssh,
        resolver=cloud.resolver if cloud is not None else DirectResolver(),
        throttle=ProbeThrottle(settings.max_probes_per_second),
        dialer=(
            wires.dialer(config.cloud.driver_params, replica)
            if wires is not None and config.cloud is not None
            else None
        ),
    )

    def takeover_after() -> timedelta:
        return parse_duration(policies.default.spec.dispatch.takeover_after)

    operator_key = credentials.operator_key
    pool = WorkerPool(
        kube=kube,
        cloud=cloud,
        prober=prober,
        namespace=namespace,
        dispatcher_id=config.dispatcher_id,
        settings=settings,
        client_key=operator_key,
        master=master_secret(operator_key) if operator_key is not None else None,
        takeover_after=takeover_after,
        default_policy=None,
        clock=utc_now,
        on_change=_no_change_hook,
        credentials=credentials,
        status=status,
        policies=policies,
    )
    dispatcher = Dispatcher(
        namespace=namespace,
        dispatcher_id=config.dispatcher_id,
        settings=settings,
        queue=queue,
        policies=policies,
        pool=pool,
        cloud=cloud,
        prober=FencedRunners(prober, fence, config.dispatcher_id),
        board=board,
        admission=(
            ApiAdmission(kube, namespace) if config.sharding.cross_process_admission else None
        ),
    )
    pool.on_change = dispatcher.poke
    return dispatcher


@dataclass(frozen=True)
class Adapters:
    """The concrete parts a dispatcher made by `build_dispatcher` runs on."""

    queue: ContainerQueue
    pool: WorkerPool | None
    cloud: CloudFacade | None
    prober: SshProber | None
    """The prober itself (probes, power-off); the dispatcher holds it behind its fence."""


def adapters_of(dispatcher: Dispatcher) -> Adapters:
    """The concrete adapters behind `dispatcher`'s Protocol-typed parts, for wiring the
    power controller and the informers to the same objects. TypeError for a dispatcher
    composed from other implementations (in-process test fakes): it has no such wiring."""
    runners = dispatcher.prober
    prober = runners.prober if isinstance(runners, FencedRunners) else runners
    queue, pool, cloud = dispatcher.queue, dispatcher.pool, dispatcher.cloud
    if (
        not isinstance(queue, ContainerQueue)
        or not isinstance(pool, WorkerPool | None)
        or not isinstance(cloud, CloudFacade | None)
        or not isinstance(prober, SshProber | None)
    ):
        raise TypeError("adapters_of: the dispatcher was not composed by build_dispatcher")
    return Adapters(queue, pool, cloud, prober)


def power_user_agent(dispatcher_id: str, replica: str | None) -> str:
    """`nodewarden/0.1.0 (power; dispatcher=ID; replica=NAME)`: what a BMC's audit log
    shows of each request (the replica is the Lease holder identity)."""
    parts = ["power", f"dispatcher={dispatcher_id}"]
    if replica:
        parts.append(f"replica={replica}")
    return user_agent("; ".join(parts))


def build_controller(
    config: OperatorConfig,
    kube: Kube,
    namespace: str,
    credentials: CredentialResolver,
    policies: PolicyBook,
    board: PowerBoard,
    status: NodeStatusWriter,
    dispatcher: Dispatcher | None,
    *,
    fence: Fence | None = None,
    replica: str | None = None,
    scope: ShardScope | None = None,
) -> PowerController:
    """The power controller for `namespace`, wired to the dispatcher's pool (if any);
    its power requests are fenced by `fence` and name `replica` in their User-Agent.
    Sharding on (`scope`): each request is fenced by the Leadership of its node's shard
    (`shards.scope.ShardedPowerControl`; the scope's fence asks `fence` too)."""
    parts = adapters_of(dispatcher) if dispatcher is not None else None
    pool = parts.pool if parts is not None else None
    cloud = parts.cloud if parts is not None else None
    wires = wire_plugin(config.cloud)
    control_args = (credentials, parts.prober if parts is not None else None, pool, utc_now)
    control_kwargs: dict[str, Any] = {
        "request_timeout": config.power.request_timeout,
        "observation_concurrency": config.power.bmc_observation_concurrency,
        "user_agent": power_user_agent(config.dispatcher_id, replica),
        "bmc_transport": (
            wires.bmc_transport(config.cloud.driver_params)
            if wires is not None and config.cloud is not None
            else None
        ),
    }
    control = (
        PowerControl(*control_args, fence=fence, **control_kwargs)
        if scope is None
        else ShardedPowerControl(scope, *control_args, **control_kwargs)
    )
    settings = ControllerSettings(
        cross_process_admission=config.sharding.cross_process_admission,
        power_poll_interval=config.power.power_poll_interval,
        power_poll_interval_at_rest=config.power.power_poll_interval_at_rest,
        capability_interval=config.power.capability_interval,
        evaluate_interval=config.power.evaluate_interval,
        first_write_hold=config.power.first_write_hold,
        resync_interval=parse_duration(config.resync_interval).total_seconds(),
        keep_finished_intents=config.power.keep_finished_intents,
        keep_intents_of_gone_nodes=config.power.keep_intents_of_gone_nodes,
        delete_finished_manual_intents=config.power.delete_finished_manual_intents,
        finished_manual_intent_retention=config.power.finished_manual_intent_retention,
        energy=EnergyBook(
            classes=dict(config.power.energy.classes),
            currency=config.cloud.currency if config.cloud is not None else "USD",
            read_interval=config.power.energy.read_interval,
            status_interval=config.power.energy.status_interval,
            idle_measure=config.power.energy.idle_measure,
        ),
    )
    controller = PowerController(
        kube=kube,
        namespace=namespace,
        dispatcher_id=config.dispatcher_id,
        default_policy=config.default_policy,
        credentials=credentials,
        policies=policies,
        pool=pool,
        board=board,
        status=status,
        control=control,
        settings=settings,
        clock=utc_now,
        catalogue=Catalogue(types=tuple(cloud.catalogue)) if cloud is not None else None,
        type_policy=cloud.config.instance_type_policy if cloud is not None else None,
    )
    if pool is not None:
        pool.observer = controller
    if dispatcher is not None:
        dispatcher.planned = controller.planned
        dispatcher.unchanged = controller.plan_unchanged
    return controller
