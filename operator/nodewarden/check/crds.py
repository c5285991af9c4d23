"""Check that the four CRDs are served, at the version and schema this nodewarden expects.

Served resources come from API discovery (`nodewarden.kube.discovery`), which every
user may read. The schema comparison reads each CustomResourceDefinition (a
cluster-scoped read; without it the line says the schemas could not be compared) and
compares a stable digest of its OpenAPI schema with the digest of the schema this binary
generates (`nodewarden.api.crdgen`, the same text as the files in crds/), plus the
served and stored versions.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from nodewarden.api import crdgen
from nodewarden.api.base import GROUP, VERSION
from nodewarden.api.kinds import ALL_KINDS
from nodewarden.check.result import CheckResult, failed, names, passed, warned
from nodewarden.kube.discovery import INSTALL_CRDS, DiscoveryError, served_resources

UPGRADE_CRDS = (
    "kubectl apply --server-side -f crds/ of this nodewarden release (helm upgrade does not "
    "change CRDs; `nodewarden crds DIR` writes them)"
)


def _normal(value: Any) -> Any:
    """JSON round trips turn 0 into 0.0 and back; integral floats count as integers."""
    if isinstance(value, Mapping):
        return {str(k): _normal(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_normal(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def schema_digest(schema: Mapping[str, Any]) -> str:
    """A stable digest of an OpenAPI schema (key order and 1 vs 1.0 do not matter)."""
    text = json.dumps(_normal(schema), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def expected_digests() -> dict[str, str]:
    """CRD name -> digest of the schema this nodewarden generates."""
    out = {}
    for kind in ALL_KINDS:
        version = crdgen.crd_for(kind)["spec"]["versions"][0]
        out[kind.crd_name] = schema_digest(version["schema"]["openAPIV3Schema"])
    return out


@dataclass(frozen=True, slots=True)
class ServedCrd:
    """What the API server holds for one CRD (read through the apiextensions API)."""

    name: str
    digest: str | None
    """Digest of the schema of version VERSION (None: that version has no schema)."""
    stored_versions: tuple[str, ...]


def served_crd(raw: Mapping[str, Any]) -> ServedCrd:
    versions = (raw.get("spec") or {}).get("versions") or []
    mine = next((v for v in versions if v.get("name") == VERSION), None)
    schema = ((mine or {}).get("schema") or {}).get("openAPIV3Schema")
    return ServedCrd(
        name=str((raw.get("metadata") or {}).get("name", "")),
        digest=schema_digest(schema) if isinstance(schema, Mapping) else None,
        stored_versions=tuple((raw.get("status") or {}).get("storedVersions") or ()),
    )


def discovery_results(
    served: set[str] | None, other_versions: Sequence[str] = ()
) -> list[CheckResult]:
    """Lines from discovery alone: which CRDs (and status subresources) are missing."""
    if served is None:
        if other_versions:
            return [
                failed(
                    "crds",
                    f"the API server serves {GROUP} only at {', '.join(other_versions)}; "
                    f"this nodewarden needs {GROUP}/{VERSION}",
                    UPGRADE_CRDS,
                )
            ]
        return [
            failed(
                "crds",
                f"nodewarden's CRDs are not installed ({GROUP}/{VERSION} is not served)",
                INSTALL_CRDS,
            )
        ]
    missing = [k.crd_name for k in ALL_KINDS if k.plural not in served]
    no_status = [
        k.crd_name for k in ALL_KINDS if k.plural in served and f"{k.plural}/status" not in served
    ]
    out = []
    if missing:
        out.append(failed("crds", f"not installed: {names(missing)}", INSTALL_CRDS))
    if no_status:
        out.append(
            failed(
                "crds", f"served without the status subresource: {names(no_status)}", UPGRADE_CRDS
            )
        )
    return out


def schema_results(
    expected: Mapping[str, str], crds: Mapping[str, ServedCrd | str]
) -> list[CheckResult]:
    """Compare the served CRDs with this binary's; a str value says why one could not be read."""
    unreadable = {n: why for n, why in crds.items() if isinstance(n, str) and isinstance(why, str)}
    out: list[CheckResult] = []
    differ, old_storage = [], []
    for name, crd in crds.items():
        if isinstance(crd, str):
            continue
        if crd.digest != expected.get(name):
            differ.append(
                f"{name} (schema {crd.digest or 'none'}, this nodewarden's {expected.get(name)})"
            )
        if any(v != VERSION for v in crd.stored_versions):
            old_storage.append(f"{name} ({', '.join(crd.stored_versions)})")
    if differ:
        out.append(
            failed(
                "crds",
                f"installed CRDs differ from this nodewarden's ({GROUP}/{VERSION}): "
                f"{names(differ, 4)}; they belong to an older or newer release",
                UPGRADE_CRDS,
            )
        )
    if old_storage:
        out.append(
            warned(
                "crds",
                f"objects may still be stored at older versions: {names(old_storage)}",
                "migrate the stored objects, then remove the old version from status.storedVersions",
            )
        )
    if unreadable:
        why = next(iter(unreadable.values()))
        out.append(
            warned(
                "crds",
                f"served at {GROUP}/{VERSION}, but their schemas could not be compared with "
                f"this nodewarden's: {why}",
                "run check as a user who may get customresourcedefinitions "
                "(kubectl auth can-i get crd)",
            )
        )
    if not out:
        out.append(
            passed(
                "crds",
                f"{len(crds)} CRDs served at {GROUP}/{VERSION}, schemas match this nodewarden's",
            )
        )
    return out


async def _other_versions(api: client.ApiClient) -> list[str]:
    groups = await client.ApisApi(api).get_api_versions()
    for group in groups.groups or []:
        if group.name == GROUP:
            return [str(v.version) for v in group.versions or []]
    return []


async def _read_crd(api: client.ApiClient, name: str) -> ServedCrd | str:
    """The CRD as served (raw JSON: no client model rounds its numbers), or why not."""
    try:
        response: Any = await client.ApiextensionsV1Api(api).read_custom_resource_definition(
            name, _preload_content=False
        )
        # without preloading, an error status comes back as a response, not an exception
        status = int(response.status)
        raw = json.loads(await response.read())
    except ApiException as exc:
        status, raw = int(exc.status or 0), {"reason": exc.reason}
    except ValueError:
        return f"GET customresourcedefinitions/{name}: the answer is not JSON"
    if status >= 300 or not isinstance(raw, Mapping) or raw.get("kind") == "Status":
        reason = raw.get("reason") if isinstance(raw, Mapping) else None
        return f"GET customresourcedefinitions/{name}: HTTP {status} {reason or ''}".strip()
    return served_crd(raw)


async def check_crds(api: client.ApiClient) -> tuple[list[CheckResult], bool]:
    """The crds lines, and whether all four kinds are served (later checks list them)."""
    try:
        served = await served_resources(api)
        others = await _other_versions(api) if served is None else []
    except (DiscoveryError, ApiException) as exc:
        return [warned("crds", f"API discovery failed: {exc}")], False
    found = discovery_results(served, others)
    if found:
        return found, False
    expected = expected_digests()
    crds = {name: await _read_crd(api, name) for name in expected}
    return schema_results(expected, crds), True
