"""An in-memory stand-in for `nodewarden.kube.client.Kube`, for in-process tests of the shell.

It keeps objects by (kind, namespace, name) with resourceVersion and generation, applies
merge patches (RFC 7386) to objects and to their status, honours a status write's
resourceVersion precondition (Conflict), and records Events. It does not validate
against the CRD schema: the API server does that, and the cluster tests run against a
real one. Imported by name (`from memkube import MemoryKube`).
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Mapping
from typing import Any

from pydantic import SecretStr

from nodewarden.api.kinds import Kind
from nodewarden.kube.client import Conflict, NotFound


def merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge(out.get(key), value)
    return out


class MemoryKube:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self.secrets: dict[tuple[str, str], dict[str, str]] = {}
        self._versions = itertools.count(1)
        self.writes = 0
        """Writes by the code under test (create, patch, patch_status, delete)."""

    def put(self, kind: Kind, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Store `body` as the API server would after a create (or a spec update)."""
        meta = dict(body.get("metadata") or {})
        key = (kind.kind, namespace, meta["name"])
        old = self.objects.get(key)
        generation = 1
        if old is not None:
            generation = old["metadata"].get("generation", 1)
            if old.get("spec") != body.get("spec"):
                generation += 1
        meta.update(
            namespace=namespace,
            generation=generation,
            resourceVersion=str(next(self._versions)),
            uid=meta.get("uid") or f"uid-{meta['name']}",
        )
        obj = {**copy.deepcopy(dict(body)), "metadata": meta}
        if old is not None and "status" not in body:
            obj["status"] = old.get("status", {})
        self.objects[key] = obj
        return copy.deepcopy(obj)

    async def get(self, kind: Kind, namespace: str, name: str) -> dict[str, Any] | None:
        obj = self.objects.get((kind.kind, namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    async def list(
        self, kind: Kind, namespace: str | None, label_selector: str | None = None
    ) -> list[dict[str, Any]]:
        return [
            copy.deepcopy(obj)
            for (k, ns, _), obj in sorted(self.objects.items())
            if k == kind.kind and (namespace is None or ns == namespace)
        ]

    async def create(self, kind: Kind, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        self.writes += 1
        name = body["metadata"]["name"]
        if (kind.kind, namespace, name) in self.objects:
            raise Conflict(f"{kind.kind} {name} already exists", 409)
        return self.put(kind, namespace, body)

    async def patch(
        self, kind: Kind, namespace: str, name: str, patch: Mapping[str, Any]
    ) -> dict[str, Any]:
        self.writes += 1
        obj = self.objects.get((kind.kind, namespace, name))
        if obj is None:
            raise NotFound(f"{kind.kind} {namespace}/{name} not found", 404)
        return self.put(kind, namespace, merge(obj, patch))

    async def patch_status(
        self,
        kind: Kind,
        namespace: str,
        name: str,
        status: Mapping[str, Any],
        resource_version: str | None = None,
    ) -> dict[str, Any]:
        self.writes += 1
        obj = self.objects.get((kind.kind, namespace, name))
        if obj is None:
            raise NotFound(f"{kind.kind} {namespace}/{name} not found", 404)
        if resource_version is not None and obj["metadata"]["resourceVersion"] != resource_version:
            raise Conflict(f"{kind.kind} {name} changed", 409)
        obj["status"] = merge(obj.get("status") or {}, dict(status))
        obj["metadata"]["resourceVersion"] = str(next(self._versions))
        return copy.deepcopy(obj)

    async def delete(self, kind: Kind, namespace: str, name: str) -> bool:
        self.writes += 1
        return self.objects.pop((kind.kind, namespace, name), None) is not None

    async def read_secret(self, namespace: str, name: str, key: str) -> SecretStr:
        data = self.secrets.get((namespace, name))
        if data is None or key not in data:
            raise NotFound(f"Secret {namespace}/{name} (key {key}) not found", 404)
        return SecretStr(data[key])

    async def read_secret_record(self, namespace: str, name: str) -> None:
        return None

    async def emit_event(
        self, obj: Mapping[str, Any], *, reason: str, message: str, **_: Any
    ) -> None:
        meta = obj.get("metadata") or {}
        self.events.append({"name": meta.get("name"), "reason": reason, "message": message})

    async def close(self) -> None:
        return None

    def status(self, kind: Kind, namespace: str, name: str) -> dict[str, Any]:
        obj = self.objects.get((kind.kind, namespace, name)) or {}
        return dict(obj.get("status") or {})

    def condition(self, kind: Kind, namespace: str, name: str, type_: str) -> dict[str, Any]:
        for cond in self.status(kind, namespace, name).get("conditions") or []:
            if cond.get("type") == type_:
                return dict(cond)
        return {}
