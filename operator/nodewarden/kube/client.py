"""Kubernetes adapter: typed, minimal access to nodewarden objects, Secrets, Events and Leases.

Built on kubernetes_asyncio. Handlers and loops use this instead of raw API calls so that
status patches, Event emission and Secret reads happen in one place (and Secret values
are registered for log redaction and never returned unwrapped).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException
from pydantic import SecretStr

from nodewarden.api.base import GROUP, VERSION
from nodewarden.api.kinds import Kind
from nodewarden.fence import Fence, NotLeader, Unfenced
from nodewarden.kube.events import EventRecorder, EventWrite
from nodewarden.kube.kubeconfig import (
    KubeconfigError,
    default_kubeconfig,
    kubeconfig_problem,
    one_line,
)
from nodewarden.kube.useragent import identify
from nodewarden.logs import redact, redact_tree, register_secret
from nodewarden.metrics import FENCED, KUBE_REQUESTS

log = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"


@dataclass(frozen=True, slots=True)
class SecretRecord:
    """A Secret as the credential resolver sees it: labels and wrapped values."""

    name: str
    labels: dict[str, str]
    values: dict[str, SecretStr] = field(repr=False)
    annotations: dict[str, str] = field(default_factory=dict)


class KubeError(Exception):
    """A Kubernetes API call failed in a way the caller should handle."""

    def __init__(self, message: str, status: int | None = None, server_message: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.server_message = server_message
        """The API server's own message (a Status body's `message`), if any."""


class NotFound(KubeError):
    pass


class Conflict(KubeError):
    pass


class FencedOut(KubeError):
    """Not sent: this replica's leadership is not valid (`nodewarden.fence`), or the API
    server refused the write because the object holds a newer fencing token."""


UNREACHABLE = (aiohttp.ClientError, asyncio.TimeoutError, OSError)
"""What a request raises when the API server cannot be reached or the connection drops."""


def unreachable(exc: BaseException) -> KubeError:
    """A request that never got an answer: a KubeError (no status) callers handle like any
    other failed request, so an API outage is a retry, never a crash."""
    return KubeError(f"Kubernetes API server unreachable ({type(exc).__name__}: {exc})", None)


def _wrap(exc: ApiException, what: str) -> KubeError:
    status = getattr(exc, "status", None)
    reason = getattr(exc, "reason", "") or ""
    if status == 422 and "status.fence" in str(getattr(exc, "body", "") or ""):
        return FencedOut(f"{what}: the object holds a newer fencing token", status)
    if status == 404:
        return NotFound(f"{what}: not found", status)
    if status == 409:
        return Conflict(f"{what}: conflict ({reason})", status)
    detail = _server_message(exc)
    if status == 422 and detail:  # the API server's validation: its message names the field
        return KubeError(f"{what}: HTTP 422 {detail[:2000]}", status, detail)
    return KubeError(f"{what}: HTTP {status} {reason}", status, detail)


def _server_message(exc: ApiException) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, bytes):
        body = body.decode(errors="replace")
    if not isinstance(body, str):
        return ""
    try:
        parsed = json.loads(body)
    except ValueError:
        return ""
    message = parsed.get("message") if isinstance(parsed, dict) else None
    return message[:2048] if isinstance(message, str) else ""


async def api_client_from(kubeconfig: Path | None) -> client.ApiClient:
    """An ApiClient for the given kubeconfig, $KUBECONFIG, or the in-cluster service account.

    Raises KubeconfigError with one line naming the file and the fix when the kubeconfig
    is missing, unreadable, malformed or has no usable current context.
    """
    cfg = client.Configuration()
    if kubeconfig is None:
        try:
            config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
            return identify(client.ApiClient(configuration=cfg))
        except config.ConfigException:
            kubeconfig = default_kubeconfig()
        if kubeconfig is not None and not kubeconfig.exists():
            raise KubeconfigError(
                f"no kubeconfig: not running in a cluster and {kubeconfig} does not exist; "
                "pass --kubeconfig FILE or set KUBECONFIG"
            )
    problem = kubeconfig_problem(kubeconfig) if kubeconfig is not None else None
    if problem is not None:
        raise KubeconfigError(problem)
    where = f"kubeconfig {kubeconfig}" if kubeconfig is not None else "kubeconfig ($KUBECONFIG)"
    try:
        await config.load_kube_config(
            config_file=str(kubeconfig) if kubeconfig is not None else None,
            client_configuration=cfg,
        )
    except (config.ConfigException, OSError, ValueError, TypeError, KeyError) as exc:
        raise KubeconfigError(f"{where}: {one_line(str(exc))}") from None
    return identify(client.ApiClient(configuration=cfg))


class Kube:
    """Thin typed wrapper; one instance per operator process."""

    def __init__(self, api: client.ApiClient, field_manager: str = "nodewarden") -> None:
        self.api = api
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.coordination = client.CoordinationV1Api(api)
        self.field_manager = field_manager
        self.fence: Fence = Unfenced()
        """Asked before every write (`guard`); its token rides in every status write."""
        self.events = EventRecorder(self.send_event)
        """Every Event goes through it: aggregated, queued, sent off the decision path."""

    # --- fencing ------------------------------------------------------------------------

    def guard(self, what: str) -> None:
        """Raise FencedOut unless this replica may write now."""
        try:
            self.fence.check(what)
        except NotLeader as exc:
            FENCED.labels("kube").inc()
            raise FencedOut(str(exc)) from None

    def fenced_status(
        self, status: Mapping[str, Any], what: str = "status write"
    ) -> dict[str, Any]:
        """`status` with this writer's token in `fence` (FencedOut when it may not write);
        the CRDs' CEL rule refuses a lower token than the object holds for that Lease."""
        try:
            token = self.fence.check(what)
        except NotLeader as exc:
            FENCED.labels("kube").inc()
            raise FencedOut(str(exc)) from None
        out = dict(status)
        if token is not None:
            out["fence"] = {token.lease: token.value}
        return out

    def refused(self, err: KubeError, what: str) -> KubeError:
        """Tell the fence when the API server refused a write for its token."""
        if isinstance(err, FencedOut) and err.status == 422:
            FENCED.labels("kube").inc()
            self.fence.rejected(what)
        return err

    async def close(self) -> None:
        await self.events.close()  # what is queued goes out first (within its deadline)
        await self.api.close()

    # --- nodewarden objects -----------------------------------------------------------

    async def get(self, kind: Kind, namespace: str, name: str) -> dict[str, Any] | None:
        KUBE_REQUESTS.labels("get").inc()
        try:
            obj: dict[str, Any] = await self.custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, kind.plural, name
            )
            return obj
        except UNREACHABLE as exc:
            raise unreachable(exc) from exc
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise _wrap(exc, f"get {kind.kind} {namespace}/{name}") from exc

    async def list(
        self, kind: Kind, namespace: str | None, label_selector: str | None = None
    ) -> list[dict[str, Any]]:
        KUBE_REQUESTS.labels("list").inc()
        try:
            if namespace is None:
                result = await self.custom.list_cluster_custom_object(
                    GROUP, VERSION, kind.plural, label_selector=label_selector or ""
                )
            else:
                result = await self.custom.list_namespaced_custom_object(
                    GROUP, VERSION, namespace, kind.plural, label_selector=label_selector or ""
                )
        except UNREACHABLE as exc:
            raise unreachable(exc) from exc
        except ApiException as exc:
            raise _wrap(exc, f"list {kind.plural}") from exc
        items: list[dict[str, Any]] = result.get("items", [])
        return items

    async def create(
        self, kind: Kind, namespace: str, body: dict[str, Any], *, dry_run: bool = False
    ) -> dict[str, Any]:
        """Create an object (`dry_run`: admission runs, nothing is stored)."""
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": kind.kind, **body}
        self.guard(f"create {kind.kind}")
        KUBE_REQUESTS.labels("create").inc()
        extra: dict[str, Any] = {"dry_run": "All"} if dry_run else {}
        try:
            obj: dict[str, Any] = await self.custom.create_namespaced_custom_object(
                GROUP,
                VERSION,
                namespace,
                kind.plural,
                body,
                field_manager=self.field_manager,
                **extra,
            )
            return obj
        except UNREACHABLE as exc:
            raise unreachable(exc) from exc
        except ApiException as exc:
            raise _wrap(exc, f"create {kind.kind} in {namespace}") from exc

    async def patch(
        self, kind: Kind, namespace: str, name: str, patch: Mapping[str, Any]
    ) -> dict[str, Any]:
        self.guard(f"patch {kind.kind} {name}")
        KUBE_REQUESTS.labels("patch").inc()
        try:
            obj: dict[str, Any] = await self.custom.patch_namespaced_custom_object(
                GROUP,
                VERSION,
                namespace,
                kind.plural,
                name,
                dict(patch),
                field_manager=self.field_manager,
                _content_type=MERGE_PATCH,  # type: ignore[call-arg]
            )
            return obj
        except UNREACHABLE as exc:
            raise unreachable(exc) from exc
        except ApiException as exc:
            raise _wrap(exc, f"patch {kind.kind} {namespace}/{name}") from exc

    async def patch_status(
        self,
        kind: Kind,
        namespace: str,
        name: str,
        status: Mapping[str, Any],
        resource_version: str | None = None,
    ) -> dict[str, Any]:
        """Merge-patch the status subresource (one patch per reconcile). With
        `resource_version` the write applies only to that version (else Conflict).
        Every registered secret is masked in every string of the patch."""
        body: dict[str, Any] = {"status": self.fenced_status(redact_tree(dict(status)))}
        KUBE_REQUESTS.labels("patch_status").inc()
        if resource_version is not None:
            body["metadata"] = {"resourceVersion": resource_version}
        try:
            obj: dict[str, Any] = await self.custom.patch_namespaced_custom_object_status(
                GROUP,
                VERSION,
                namespace,
                kind.plural,
                name,
                body,
                field_manager=self.field_manager,
                _content_type=MERGE_PATCH,  # type: ignore[call-arg]
            )
            return obj
        except UNREACHABLE as exc:
            raise unreachable(exc) from exc
        except ApiException as exc:
            what = f"patch status of {kind.kind} {namespace}/{name}"
            raise self.refused(_wrap(exc, what), what) from exc

    async def delete(self, kind: Kind, namespace: str, name: str) -> bool:
        self.guard(f"delete {kind.kind} {name}")
        KUBE_REQUESTS.labels("delete").inc()
        try:
            await self.custom.delete_namespaced_custom_object(
                GROUP, VERSION, namespace, kind.plural, name
            )
            return True
        except UNREACHABLE as exc:
            raise unreachable(exc) from exc
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise _wrap(exc, f"delete {kind.kind} {namespace}/{name}") from exc

    # --- secrets ------------------------------------------------------------------------

    async def read_secret(self, namespace: str, name: str, key: str) -> SecretStr:
        """One value of a Secret, registered for log redaction. Errors never contain values."""
        KUBE_REQUESTS.labels("get_secret").inc()
        try:
            secret = await self.core.read_namespaced_secret(name, namespace)
        except UNREACHABLE as exc:
            raise unreachable(exc) from exc
        except ApiException as exc:
            raise _wrap(exc, f"read Secret {namespace}/{name}") from exc
        data = secret.data or {}
        if key not in data:
            raise KubeError(
                f"Secret {namespace}/{name} has no key {key!r} (keys: {sorted(data)})", 404
            )
        value = base64.b64decode(data[key]).decode()
        register_secret(value)
        return SecretStr(value)

    async def read_secret_record(self, namespace: str, name: str) -> SecretRecord | None:
        """A Secret's labels, annotations and values (None if it does not exist), values
        wrapped. Only the credential resolver calls this; it registers for redaction every
        value that is not public (CA bundles, known_hosts lines)."""
        KUBE_REQUESTS.labels("get_secret").inc()
        try:
            secret = await self.core.read_namespaced_secret(name, namespace)
        except UNREACHABLE as exc:
            raise unreachable(exc) from exc
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise _wrap(exc, f"read Secret {namespace}/{name}") from exc
        values: dict[str, SecretStr] = {}
        for key, encoded in (secret.data or {}).items():
            try:
                value = base64.b64decode(encoded).decode()
            except (ValueError, UnicodeDecodeError):
                continue  # not text: no credential nodewarden uses is binary
            values[key] = SecretStr(value)
        meta = secret.metadata
        labels = dict((meta.labels or {}) if meta else {})
        annotations = dict((meta.annotations or {}) if meta else {})
        return SecretRecord(name=name, labels=labels, values=values, annotations=annotations)

    # --- events -------------------------------------------------------------------------

    async def emit_event(
        self,
        obj: Mapping[str, Any],
        *,
        reason: str,
        message: str,
        type_: str = "Normal",
        action: str = "Reconcile",
        component: str = "nodewarden",
        message_key: str | None = None,
    ) -> None:
        """Hand an Event about `obj` to the recorder (`kube.events`): aggregated into its
        series (same object, reason, type and `message_key`, the message by default),
        queued, sent by the background drainer. Returns at once; never raises."""
        self.events.record(
            obj,
            reason=reason,
            message=message,
            type_=type_,
            action=action,
            component=component,
            message_key=message_key,
        )

    async def send_event(self, write: EventWrite) -> None:
        """The recorder's sink: create the first Event of a series, or PATCH its core/v1
        `count` and `lastTimestamp` (created instead when it is gone). Registered secrets
        are masked in the message. Failures are logged, never raised."""
        if not write.create:
            patch = {
                "count": write.count,
                "lastTimestamp": write.last.isoformat().replace("+00:00", "Z"),
                "message": redact(write.message)[:1024],
            }
            KUBE_REQUESTS.labels("patch_event").inc()
            try:
                await self.core.patch_namespaced_event(
                    write.name, write.namespace, patch, _preload_content=False
                )
                return
            except UNREACHABLE as exc:
                log.warning("could not post event %s: %s", write.reason, unreachable(exc))
                return
            except ApiException as exc:
                if exc.status != 404:
                    log.warning("could not post event %s: HTTP %s", write.reason, exc.status)
                    return
                # expired or never created: the series starts again under the same name
        inv = write.involved
        body = client.CoreV1Event(
            metadata=client.V1ObjectMeta(name=write.name, namespace=write.namespace),
            involved_object=client.V1ObjectReference(
                api_version=inv.get("apiVersion"),
                kind=inv.get("kind"),
                name=inv.get("name"),
                namespace=write.namespace,
                uid=inv.get("uid"),
                resource_version=inv.get("resourceVersion"),
            ),
            reason=write.reason,
            message=redact(write.message)[:1024],
            type=write.type,
            action=write.action,
            source=client.V1EventSource(component=write.component),
            reporting_component=write.component,
            reporting_instance=write.component,
            first_timestamp=write.first,
            last_timestamp=write.last,
            event_time=write.first,
            count=write.count,
        )
        KUBE_REQUESTS.labels("create_event").inc()
        try:
            # the created Event is not read back: parsing it (times with dateutil) costs
            # more than the request at one Event per decision for thousands of nodes
            resp: Any = await self.core.create_namespaced_event(
                write.namespace,
                body,
                _preload_content=False,
            )
            try:
                await resp.read()
                status = resp.status
            finally:
                resp.release()
        except UNREACHABLE as exc:
            log.warning("could not post event %s: %s", write.reason, unreachable(exc))
            return
        except ApiException as exc:
            status = exc.status
        if not 200 <= int(status or 0) <= 299:
            log.warning("could not post event %s: HTTP %s", write.reason, status)
