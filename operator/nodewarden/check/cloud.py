"""Check the cloud: its credentials work (a read-only list) and the image and instance
types the configuration names exist.

Only read calls are made: the driver's list of nodewarden's instances, `get_image` (or
`list_images`) and `list_sizes`. The credentials are read from the Secrets the operator
config names, handed to the libcloud driver only, and every error text is redacted.
`catalogue_result` and `image_result` are pure.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection
from datetime import UTC, datetime
from typing import TypeVar

from libcloud.compute.base import NodeDriver
from pydantic import SecretStr

from nodewarden.api.base import SecretKeyReference
from nodewarden.check.result import CheckResult, failed, names, passed, warned
from nodewarden.cloud.config import CloudConfig, CloudCredentials
from nodewarden.cloud.dialects import dialect_for
from nodewarden.cloud.errors import (
    CloudAuthError,
    CloudError,
    CloudErrorKind,
    Redactor,
    classify,
)
from nodewarden.cloud.facade import instantiate_driver
from nodewarden.cloud.plugins import PluginError
from nodewarden.cloud.tags import TagKeys
from nodewarden.kube.client import Kube, KubeError

T = TypeVar("T")


def catalogue_result(config: CloudConfig, offered: Collection[str] | None) -> CheckResult:
    """The catalogue's provider types against the sizes the cloud offers (None: unknown)."""
    wanted = sorted({t.provider_type for t in config.instance_types})
    if not wanted:
        return warned(
            "cloud",
            "cloud.instance_types is empty: nodewarden can create no instance",
            "list the instance types to use under cloud.instance_types",
        )
    if offered is None:
        return warned(
            "cloud", f"the {config.driver} driver cannot list sizes: instance types not verified"
        )
    missing = [w for w in wanted if w not in offered]
    if missing:
        return failed(
            "cloud",
            f"cloud.instance_types: the cloud offers no {names(missing)} "
            f"({len(offered)} sizes offered)",
            "fix provider_type in cloud.instance_types (or the driver's region)",
        )
    return passed("cloud", f"the cloud offers every instance type of the catalogue ({len(wanted)})")


def image_result(config: CloudConfig, found: bool | None) -> CheckResult:
    if found is None:
        return warned(
            "cloud", f"the {config.driver} driver cannot look up images: image not verified"
        )
    if not found:
        return failed(
            "cloud",
            f"cloud.image {config.image!r} does not exist in this cloud (or region)",
            "set cloud.image to an image id the account can use",
        )
    return passed("cloud", f"cloud.image {config.image} exists")


async def _secret(kube: Kube, namespace: str, ref: SecretKeyReference, field: str) -> SecretStr:
    try:
        return await kube.read_secret(namespace, ref.name, ref.key)
    except KubeError as exc:
        raise _Failed(
            failed(
                "cloud",
                f"{field}: {exc}",
                f"create the Secret {ref.name} with key {ref.key} in {namespace}, or fix the "
                "reference",
            )
        ) from None


class _Failed(Exception):
    def __init__(self, result: CheckResult) -> None:
        super().__init__(result.message)
        self.result = result


def _image_exists(driver: NodeDriver, image: str) -> bool | None:
    """True / False, or None when the driver can look up no image."""
    try:
        return driver.get_image(image) is not None
    except NotImplementedError:
        pass
    except Exception as exc:
        if (
            classify(exc, operation="images", now=datetime.now(UTC)).kind
            is CloudErrorKind.NOT_FOUND
        ):
            return False
        raise
    try:
        return any(i.id == image for i in driver.list_images())
    except NotImplementedError:
        return None


def _sizes(driver: NodeDriver) -> set[str] | None:
    try:
        return {str(s.id) for s in driver.list_sizes()}
    except NotImplementedError:
        return None


async def check_cloud(
    kube: Kube,
    namespace: str,
    config: CloudConfig | None,
    dispatcher_id: str,
    contact_timeout: float,
) -> list[CheckResult]:
    if config is None:
        return [passed("cloud", "no cloud configured: containers run on side nodes only")]
    try:
        creds = None
        if config.credentials is not None:
            ref = config.credentials
            key = await _secret(kube, namespace, ref.key_ref, "cloud.credentials.key_ref")
            secret = None
            if ref.secret_ref is not None:
                secret = await _secret(
                    kube, namespace, ref.secret_ref, "cloud.credentials.secret_ref"
                )
            creds = CloudCredentials(key=key, secret=secret)
    except _Failed as exc:
        return [exc.result]
    redact = Redactor(creds.values() if creds is not None else ())

    async def call(operation: str, fn: Callable[[], T]) -> T:
        try:
            return await asyncio.wait_for(asyncio.to_thread(fn), contact_timeout)
        except TimeoutError:
            raise _Failed(
                failed("cloud", f"the cloud did not answer {operation} within {contact_timeout:g}s")
            ) from None
        except (ValueError, PluginError) as exc:
            raise _Failed(failed("cloud", f"cloud.driver: {redact(str(exc))}")) from None
        except Exception as exc:
            error = classify(exc, operation=operation, now=datetime.now(UTC), redact=redact)
            raise _Failed(_error_result(error, config)) from None

    try:
        driver = await call("connect", lambda: instantiate_driver(config, creds))
        dialect = await call("connect", lambda: dialect_for(driver))
        ours = {TagKeys(config.tag_prefix).dispatcher: dispatcher_id}
        nodes = await call("list", lambda: dialect.list_nodes(driver, ours))
        out = [
            passed(
                "cloud",
                f"{config.driver} accepts the credentials: {len(nodes)} instances tagged for "
                f"dispatcher {dispatcher_id}",
            )
        ]
        image = await call("images", lambda: _image_exists(driver, config.image))
        out.append(image_result(config, image))
        out.append(catalogue_result(config, await call("sizes", lambda: _sizes(driver))))
    except _Failed as exc:
        return [exc.result]
    return out


def _error_result(error: CloudError, config: CloudConfig) -> CheckResult:
    if isinstance(error, CloudAuthError):
        refs = config.credentials
        where = (
            f"Secret {refs.key_ref.name} (cloud.credentials)" if refs is not None else "the driver"
        )
        return failed(
            "cloud",
            f"the cloud rejected the credentials: {error}",
            f"put valid credentials into {where}; they need at least the right to list instances",
        )
    return failed("cloud", str(error), "see the message; the operator's cloud calls would fail too")
