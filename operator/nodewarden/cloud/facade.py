"""The cloud facade: the layers composed once, plus the questions the dispatcher asks.

`build_cloud(config, credentials, dispatcher_id)` instantiates the libcloud driver named
in `CloudConfig.driver` and composes

    TagFilterLayer(DefaultTagsLayer(RateLimitLayer(MetricsLayer(LibcloudInstanceSet))))

(with the driver made from the config, the innermost list goes through a worker process
that sends back only changes: `cloud/listproc.py`, `cloud.list_in_process`)

The resulting `CloudFacade` is an `InstanceSet` (list / create / set_tags / destroy /
close) that only sees and creates instances tagged `<prefix>dispatcher=<dispatcher_id>`;
`list_managed_instances()` also shows other dispatchers' instances (takeover). It
answers:

- `may_create(instance_type)` / `blocked_types()` -- from `CloudBackoff`;
- `choose_instance_type(resources)` -- the pure choice with blocked types as at capacity;
- `ssh_endpoint(instance)` -- where to SSH to (the stub cloud maps its fake addresses to
  loopback ports; real clouds dial the address);
- `create_request(...)` -- a `CreateRequest` with a fresh per-instance secret rendered
  into the init script and its digest in the tags.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Collection, Mapping
from datetime import datetime
from typing import Any

from libcloud.compute.base import NodeDriver
from libcloud.compute.providers import get_driver
from pydantic import SecretStr

from nodewarden.api.containerdispatch import ContainerResources
from nodewarden.clock import utc_now
from nodewarden.cloud.backoff import CloudBackoff, CreatePermission
from nodewarden.cloud.config import CloudConfig, CloudCredentials
from nodewarden.cloud.errors import Redactor
from nodewarden.cloud.fence import FenceLayer
from nodewarden.cloud.initscript import new_instance_secret, render_init_script, secret_digest
from nodewarden.cloud.layers import (
    DefaultTagsLayer,
    MetricsLayer,
    NoMetrics,
    RateLimitLayer,
    TagFilterLayer,
)
from nodewarden.cloud.libcloudset import Clock, LibcloudInstanceSet
from nodewarden.cloud.listproc import ProcessListLayer
from nodewarden.cloud.model import CloudInstance, CreateRequest
from nodewarden.cloud.plugins import load_plugin
from nodewarden.cloud.protocol import CloudMetricsHook, InstanceSet
from nodewarden.cloud.tags import TagKeys
from nodewarden.fence import Fence, Unfenced
from nodewarden.scheduling.instancetypes import InstanceType, InstanceTypeChoice
from nodewarden.scheduling.instancetypes import choose_instance_type as choose_type
from nodewarden.ssh.addressing import AddressResolver, DirectResolver, Endpoint

log = logging.getLogger(__name__)


class CloudFacade:
    """The composed cloud adapter for one dispatcher; see the module docstring."""

    def __init__(
        self,
        instances: InstanceSet,
        *,
        managed: InstanceSet,
        config: CloudConfig,
        dispatcher_id: str,
        backoff: CloudBackoff,
        resolver: AddressResolver,
        clock: Clock = utc_now,
    ) -> None:
        self._instances = instances
        self._managed = managed
        self.config = config
        self.dispatcher_id = dispatcher_id
        self.backoff = backoff
        self.resolver = resolver
        self.tag_keys = TagKeys(config.tag_prefix)
        self.catalogue: list[InstanceType] = list(config.instance_types)
        self._clock = clock

    # ---- InstanceSet ----------------------------------------------------------------------

    async def list_instances(self) -> list[CloudInstance]:
        return await self._instances.list_instances()

    async def create(self, request: CreateRequest) -> CloudInstance:
        return await self._instances.create(request)

    async def list_managed_instances(self) -> list[CloudInstance]:
        """Instances of every dispatcher sharing the tag prefix (ours included).

        For takeover: an instance of another dispatcher that stopped probing it is
        claimed with `set_tags` (which writes our dispatcher id) or destroyed.
        """
        return await self._managed.list_instances()

    async def set_tags(self, instance: CloudInstance, tags: Mapping[str, str]) -> None:
        """Replace our tags (see `InstanceSet.set_tags`); also writes our dispatcher id, so
        calling it on another dispatcher's instance claims that instance."""
        await self._instances.set_tags(instance, tags)

    async def destroy(self, instance: CloudInstance) -> None:
        await self._instances.destroy(instance)

    async def close(self) -> None:
        await self._instances.close()

    # ---- questions ------------------------------------------------------------------------

    def instance_type(self, name: str) -> InstanceType | None:
        return next((t for t in self.catalogue if t.name == name), None)

    def may_create(
        self, instance_type: InstanceType, now: datetime | None = None
    ) -> CreatePermission:
        return self.backoff.may_create(instance_type, now or self._clock())

    def blocked_types(self, now: datetime | None = None) -> set[str]:
        return self.backoff.blocked_types(self.catalogue, now or self._clock())

    def choose_instance_type(
        self,
        resources: ContainerResources,
        *,
        at_capacity: Collection[str] = (),
        now: datetime | None = None,
    ) -> InstanceTypeChoice:
        """The pure choice, with every type the back-off blocks counted as at capacity."""
        blocked = self.blocked_types(now) | set(at_capacity)
        return choose_type(resources, self.catalogue, self.config.instance_type_policy, blocked)

    def ssh_endpoint(self, instance: CloudInstance) -> Endpoint:
        """Where to SSH to reach `instance`; ValueError when it has no address yet.

        May raise `nodewarden.ssh.addressing.ResolutionRefused` from the resolver.
        """
        address = instance.address(prefer_public=self.config.use_public_ip)
        if address is None:
            raise ValueError(f"instance {instance.id} has no address yet")
        return self.resolver.resolve(address, self.config.ssh_port)

    def create_request(
        self,
        *,
        name: str,
        instance_type: InstanceType,
        ssh_public_key: str,
        tags: Mapping[str, str] | None = None,
        login_user: str = "root",
        instance_secret: SecretStr | None = None,
    ) -> tuple[CreateRequest, SecretStr]:
        """A create request with a fresh instance secret; returns (request, secret).

        The secret is in the init script only; the tags carry its sha256. Pass
        `instance_secret` to use one derived by the caller (so it can be recomputed after
        a restart); otherwise a random one is made.
        """
        secret = instance_secret or new_instance_secret()
        all_tags = {
            self.tag_keys.instance_type: instance_type.name,
            self.tag_keys.secret_digest: secret_digest(secret),
            **(tags or {}),
        }
        request = CreateRequest(
            name=name,
            instance_type=instance_type,
            image=self.config.image,
            tags=all_tags,
            user_data=render_init_script(ssh_public_key, secret, user=login_user),
        )
        return request, secret


def instantiate_driver(config: CloudConfig, credentials: CloudCredentials | None) -> NodeDriver:
    """Create the libcloud driver named by `config.driver` with its params and credentials."""
    if config.driver_plugin is not None:
        load_plugin(config.driver_plugin, config.driver).register()
    try:
        driver_cls = get_driver(config.driver)
    except AttributeError as exc:
        raise ValueError(
            f"unknown libcloud driver {config.driver!r}; for a driver outside libcloud set "
            "cloud.driver_plugin to 'package.module:attribute'"
        ) from exc
    key = credentials.key.get_secret_value() if credentials else ""
    secret = (
        credentials.secret.get_secret_value()
        if credentials is not None and credentials.secret is not None
        else None
    )
    driver: NodeDriver = driver_cls(key, secret, **config.driver_params)
    return driver


def build_cloud(
    config: CloudConfig,
    credentials: CloudCredentials | None,
    dispatcher_id: str,
    *,
    metrics: CloudMetricsHook | None = None,
    resolver: AddressResolver | None = None,
    backoff: CloudBackoff | None = None,
    driver_factory: Callable[[], NodeDriver] | None = None,
    clock: Clock = utc_now,
    fence: Fence | None = None,
) -> CloudFacade:
    """Compose the cloud adapter for one dispatcher (the only place layers are stacked).
    `fence` is asked before every create, destroy and tag write (`cloud.fence`)."""
    tag_keys = TagKeys(config.tag_prefix)
    ours: dict[str, str | None] = {tag_keys.dispatcher: dispatcher_id}
    anyone: dict[str, str | None] = {tag_keys.dispatcher: None}
    redactor = Redactor(credentials.values() if credentials else ())
    _register_for_log_redaction(credentials)
    # a driver made from the config can be made again in a worker process (the list)
    maker = functools.partial(instantiate_driver, config, credentials)
    in_process = driver_factory is None and config.list_in_process
    backoff = backoff or CloudBackoff(config.backoff)
    options: dict[str, Any] = {
        "image": config.image,
        "catalogue": config.instance_types,
        "tag_keys": tag_keys,
        "list_filter": anyone,
        "redactor": redactor,
    }
    threads = LibcloudInstanceSet(
        driver_factory or maker, max_threads=config.max_threads, clock=clock, **options
    )
    in_process = in_process and not threads.process_local
    base: InstanceSet = ProcessListLayer(threads, maker, options, clock) if in_process else threads
    shared: InstanceSet = RateLimitLayer(
        FenceLayer(MetricsLayer(base, metrics or NoMetrics()), fence or Unfenced(), clock),
        backoff,
        ops_per_second=config.ops_per_second,
        max_concurrent_creates=config.max_concurrent_creates,
        tag_write_max_wait=config.tag_write_max_wait,
        clock=clock,
    )
    stack = TagFilterLayer(
        DefaultTagsLayer(shared, {**config.default_tags, tag_keys.dispatcher: dispatcher_id}),
        ours,
    )
    managed = TagFilterLayer(
        DefaultTagsLayer(shared, {**config.default_tags, tag_keys.dispatcher: dispatcher_id}),
        anyone,
    )
    if resolver is None:
        resolver = _default_resolver(config, credentials)
    log.info(
        "cloud adapter ready",
        extra={
            "cloud_driver": config.driver,
            "dispatcher_id": dispatcher_id,
            "ops_per_second": config.ops_per_second,
            "max_concurrent_creates": config.max_concurrent_creates,
            "instance_types": len(config.instance_types),
        },
    )
    return CloudFacade(
        stack,
        managed=managed,
        config=config,
        dispatcher_id=dispatcher_id,
        backoff=backoff,
        resolver=resolver,
        clock=clock,
    )


def _default_resolver(config: CloudConfig, credentials: CloudCredentials | None) -> AddressResolver:
    if config.driver_plugin is not None:
        plugin = load_plugin(config.driver_plugin, config.driver)
        return plugin.resolver(config.driver_params, credentials)
    return DirectResolver()


def _register_for_log_redaction(credentials: CloudCredentials | None) -> None:
    """Second line of defence: the operator's log formatter masks these values too."""
    if credentials is None:
        return
    from nodewarden.logs import register_secret

    for value in credentials.values():
        register_secret(value)
