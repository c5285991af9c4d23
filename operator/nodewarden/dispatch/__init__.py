"""The container dispatcher (Arvados crunch-dispatch-cloud lineage), wired from its parts.

- `queue`       ContainerDispatch cache and status writes (lock with a precondition)
- `workers`     the worker pool: cloud instances <-> WorkerNodes, probes, create/destroy
- `policies`    PowerPolicy views (default policy, built-in fallback)
- `identity`    per-instance secrets derived from the operator's SSH key
- `ports`       the Protocols the dispatcher depends on (queue, pool, cloud, prober)
- `dispatcher`  the main loop: recover, reconcile runners, cancel, plan, execute, lifecycle

`build_dispatcher(config, kube, namespace)` reads the Secrets it needs (SSH key, cloud
credentials) and composes everything once. The dispatcher sees its parts through the
Protocols of `ports`; the composition code that wires the same parts to the power
controller and the informers gets the concrete adapters back with `adapters_of`.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from pydantic import SecretStr

from nodewarden.cloud.config import CloudCredentials
from nodewarden.cloud.facade import CloudFacade, build_cloud
from nodewarden.cloud.protocol import CloudMetricsHook
from nodewarden.config import ConfigError, OperatorConfig
from nodewarden.credentials import CredentialResolver
from nodewarden.dispatch.dispatcher import Dispatcher, utc_now
from nodewarden.dispatch.identity import master_secret
from nodewarden.dispatch.policies import PolicyBook
from nodewarden.dispatch.queue import ContainerQueue
from nodewarden.dispatch.workers import WorkerPool
from nodewarden.fence import Fence, Unfenced
from nodewarden.kube.client import Kube, KubeError
from nodewarden.metrics import CLOUD_ERRORS, CLOUD_OPERATIONS
from nodewarden.power.board import PowerBoard
from nodewarden.power.status import NodeStatusWriter
from nodewarden.ssh.addressing import DirectResolver
from nodewarden.ssh.fenced import FencedRunners
from nodewarden.ssh.prober import SshProber
from nodewarden.ssh.throttle import ProbeThrottle
from nodewarden.units import parse_duration

log = logging.getLogger(__name__)

__all__ = ["Adapters", "Dispatcher", "adapters_of", "build_dispatcher"]


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
) -> Dispatcher:
    """Compose the dispatcher; ConfigError names what is missing. The operator's SSH key
    comes from the credential resolver (`credentials.operator_key`). The worker pool
    serves side nodes with or without a cloud; `board` and `status` are shared with the
    power controller. `fence` (this replica's leadership) wraps the action ports once:
    the cloud layers (`cloud.fence`) and the runner client (`ssh.fenced`)."""
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
    dispatcher_holder: list[Dispatcher] = []

    def poke() -> None:
        if dispatcher_holder:
            dispatcher_holder[0].poke()

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
    prober = SshProber(
        config.ssh,
        resolver=cloud.resolver if cloud is not None else DirectResolver(),
        throttle=ProbeThrottle(settings.max_probes_per_second),
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
        clock=_now,
        on_change=poke,
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
    )
    dispatcher_holder.append(dispatcher)
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


def _now() -> datetime:
    return utc_now()
