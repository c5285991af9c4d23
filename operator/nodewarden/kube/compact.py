"""Compact bodies of the hot kinds: what the informers keep of each WorkerNode and ContainerDispatch.

The informer's transform (`nodewarden.kube.informer`) for the two kinds every consumer
holds in full. A compact body has the shape of an API object -- `metadata`, `spec`,
`status` -- so the dispatcher, the worker pool, the power controller and the status writer
read it as they read a watched body, but it keeps only what they read:

- metadata: name, namespace, uid, generation, resourceVersion (write preconditions,
  Event references), deletionTimestamp, finalizers; ContainerDispatch also
  creationTimestamp (queue order); WorkerNode the labels the product reads
  (`nodewarden.io/*`); both kinds the annotations the product reads
  (`KEPT_ANNOTATIONS`: do-not-consolidate). Dropped: managedFields, other annotations
  (kubectl's last-applied-configuration, anyone's notes), other labels, ownerReferences.
- spec and status: whole (the spec is parsed by its consumers; every status field is
  written by nodewarden and compared by its writer).

Dictionary keys and short word-like values ("On", "SideNode", "True") are interned, so
10,000 bodies share one copy of each instead of one per watch event.

A compact body is shared by every consumer (no consumer copies it): treat it as
read-only. Pure; no I/O.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

WORKERNODE_LABEL_PREFIX = "nodewarden.io/"

KEPT_ANNOTATIONS = ("nodewarden.io/do-not-consolidate",)
"""The annotations a compact body keeps (`api.consolidation.DO_NOT_CONSOLIDATE`)."""
_COMMON_META = ("name", "namespace", "uid", "generation", "resourceVersion", "deletionTimestamp")
_MAX_INTERNED = 32


def _interned_value(value: str) -> str:
    """A short word-like value (enum members, condition types and reasons) is interned;
    names with digits, times and messages are left alone."""
    if len(value) <= _MAX_INTERNED and value.replace("-", "").replace("_", "").isalpha():
        return sys.intern(value)
    return value


def compact_value(value: Any) -> Any:
    """A fresh copy of a JSON value with interned keys and short word-like strings."""
    if isinstance(value, dict):
        return {sys.intern(k): compact_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [compact_value(v) for v in value]
    if isinstance(value, str):
        return _interned_value(value)
    return value


def _metadata(meta: Mapping[str, Any], extra: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in (*_COMMON_META, *extra):
        value = meta.get(key)
        if value is not None:
            out[key] = compact_value(value)
    finalizers = meta.get("finalizers")
    if finalizers:
        out["finalizers"] = [sys.intern(f) for f in finalizers]
    annotations = meta.get("annotations") or {}
    kept = {k: str(annotations[k]) for k in KEPT_ANNOTATIONS if k in annotations}
    if kept:
        out["annotations"] = kept
    return out


def _body(raw: Mapping[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": meta,
        "spec": compact_value(raw.get("spec") or {}),
        "status": compact_value(raw.get("status") or {}),
    }


def compact_workernode(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The compact body of a WorkerNode (see the module docstring)."""
    source = raw.get("metadata") or {}
    meta = _metadata(source, ())
    labels = {
        sys.intern(k): compact_value(v)
        for k, v in (source.get("labels") or {}).items()
        if k.startswith(WORKERNODE_LABEL_PREFIX)
    }
    if labels:
        meta["labels"] = labels
    return _body(raw, meta)


def compact_containerdispatch(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The compact body of a ContainerDispatch (see the module docstring)."""
    return _body(raw, _metadata(raw.get("metadata") or {}, ("creationTimestamp",)))
