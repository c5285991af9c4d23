"""Composing the power controller beside the dispatcher (shared pool, board, status writer)."""

from __future__ import annotations

from datetime import UTC, datetime

from nodewarden.config import OperatorConfig
from nodewarden.credentials import CredentialResolver
from nodewarden.dispatch import Dispatcher, adapters_of
from nodewarden.dispatch.policies import PolicyBook
from nodewarden.fence import Fence
from nodewarden.kube.client import Kube
from nodewarden.kube.useragent import user_agent
from nodewarden.power.board import PowerBoard
from nodewarden.power.control import PowerControl
from nodewarden.power.controller import PowerController
from nodewarden.power.runtime import ControllerSettings
from nodewarden.power.status import NodeStatusWriter
from nodewarden.scheduling.instancetypes import Catalogue
from nodewarden.units import parse_duration


def _now() -> datetime:
    return datetime.now(tz=UTC)


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
) -> PowerController:
    """The power controller for `namespace`, wired to the dispatcher's pool (if any);
    its power requests are fenced by `fence` and name `replica` in their User-Agent."""
    parts = adapters_of(dispatcher) if dispatcher is not None else None
    pool = parts.pool if parts is not None else None
    cloud = parts.cloud if parts is not None else None
    control = PowerControl(
        credentials,
        parts.prober if parts is not None else None,
        pool,
        _now,
        request_timeout=config.power.request_timeout,
        observation_concurrency=config.power.bmc_observation_concurrency,
        fence=fence,
        user_agent=power_user_agent(config.dispatcher_id, replica),
    )
    settings = ControllerSettings(
        power_poll_interval=config.power.power_poll_interval,
        capability_interval=config.power.capability_interval,
        evaluate_interval=config.power.evaluate_interval,
        resync_interval=parse_duration(config.resync_interval).total_seconds(),
        keep_finished_intents=config.power.keep_finished_intents,
        keep_intents_of_gone_nodes=config.power.keep_intents_of_gone_nodes,
        delete_finished_manual_intents=config.power.delete_finished_manual_intents,
        finished_manual_intent_retention=config.power.finished_manual_intent_retention,
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
        clock=_now,
        catalogue=Catalogue(types=tuple(cloud.catalogue)) if cloud is not None else None,
        type_policy=cloud.config.instance_type_policy if cloud is not None else None,
    )
    if pool is not None:
        pool.observer = controller
    if dispatcher is not None:
        dispatcher.planned = controller.planned
    return controller
