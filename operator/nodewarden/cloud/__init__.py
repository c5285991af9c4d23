"""The cloud adapter: an async facade over apache-libcloud, layered in the Arvados manner.

Modules, one concept each:

- `config` -- `CloudConfig` (driver, params, credentials Secret refs, image, tag prefix,
  rate limits, back-off, instance-type catalogue) and `CloudCredentials` (SecretStr).
- `model` -- `CloudInstance` (the instance view: id, name, type, state, tags, addresses,
  price, created time, observed-at + source) and `CreateRequest`.
- `protocol` -- the `InstanceSet` protocol every layer implements; `CloudMetricsHook`.
- `errors` -- the `CloudError` hierarchy and `classify()` of libcloud exceptions.
- `backoff` -- `CloudBackoff`, the pure "may I create type X now? why not?" state.
- `libcloudset` -- the driver in a bounded thread pool; `dialects` -- per-driver calls.
- `layers` -- metrics, rate limit, default tags, tag filter wrappers.
- `facade` -- `build_cloud()` composing the layers into a `CloudFacade`.
- `initscript` -- user data carrying the SSH key and the per-instance secret.
- `tags` -- the tag keys nodewarden writes.
- `plugins` -- out-of-tree drivers named `module:attribute` in the config (the stub cloud
  among the test doubles is one; nodewarden never imports it by name).
"""

from nodewarden.cloud.backoff import BackoffSettings, CloudBackoff, CreatePermission
from nodewarden.cloud.config import CloudConfig, CloudCredentials, CloudCredentialsRef
from nodewarden.cloud.errors import (
    CapacityUnavailable,
    CloudAuthError,
    CloudError,
    CloudErrorKind,
    CreateBlocked,
    InstanceNotFound,
    PermanentCloudError,
    QuotaExceeded,
    QuotaGroupExceeded,
    RateLimited,
    TransientCloudError,
    classify,
)
from nodewarden.cloud.facade import CloudFacade, build_cloud
from nodewarden.cloud.model import CloudInstance, CreateRequest, InstanceState
from nodewarden.cloud.protocol import CloudMetricsHook, InstanceSet
from nodewarden.cloud.tags import TagKeys

__all__ = [
    "BackoffSettings",
    "CapacityUnavailable",
    "CloudAuthError",
    "CloudBackoff",
    "CloudConfig",
    "CloudCredentials",
    "CloudCredentialsRef",
    "CloudError",
    "CloudErrorKind",
    "CloudFacade",
    "CloudInstance",
    "CloudMetricsHook",
    "CreateBlocked",
    "CreatePermission",
    "CreateRequest",
    "InstanceNotFound",
    "InstanceSet",
    "InstanceState",
    "PermanentCloudError",
    "QuotaExceeded",
    "QuotaGroupExceeded",
    "RateLimited",
    "TagKeys",
    "TransientCloudError",
    "build_cloud",
    "classify",
]
