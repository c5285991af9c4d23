"""Turning RBAC rules, the permission table and audit events into comparable sets.

A grant is (apiGroup, resource[/subresource], verb, resourceName or "*"). The
permission table's placeholders (``<lease>``) become patterns the audit check matches.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from typing import Any

from nodewarden.kube.permissions import REQUIRED_PERMISSIONS

Grant = tuple[str, str, str, str]

PLACEHOLDERS = {"<lease>": "nodewarden-*", "<status-token>": "*"}


def table_grants() -> set[Grant]:
    out: set[Grant] = set()
    for p in REQUIRED_PERMISSIONS:
        names = tuple(PLACEHOLDERS.get(n, n) for n in p.resource_names) or ("*",)
        for verb in p.verbs:
            for name in names:
                out.add((p.group, p.resource, verb, name))
    return out


def role_grants(rules: Iterable[Mapping[str, Any]], name_patterns: Mapping[str, str]) -> set[Grant]:
    """Grants of Role rules; resourceNames are replaced by `name_patterns` where given."""
    out: set[Grant] = set()
    for rule in rules:
        names = [name_patterns.get(n, n) for n in rule.get("resourceNames") or ["*"]]
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    for name in names:
                        out.add((group, resource, verb, name))
    return out


def used_grants(events: Iterable[Mapping[str, Any]], user: str) -> set[tuple[str, str, str, str]]:
    """(group, resource, verb, object name or '') of every resource request by `user`."""
    out: set[tuple[str, str, str, str]] = set()
    for event in events:
        if (event.get("user") or {}).get("username") != user:
            continue
        ref = event.get("objectRef")
        if not ref:
            continue  # non-resource URLs (discovery, /version): granted to every user
        resource = ref.get("resource", "")
        if ref.get("subresource"):
            resource += "/" + ref["subresource"]
        out.add((ref.get("apiGroup", ""), resource, event["verb"], ref.get("name", "")))
    return out


def covered(use: tuple[str, str, str, str], grants: set[Grant]) -> bool:
    group, resource, verb, name = use
    return any(
        g == group and r == resource and v == verb and (n == "*" or fnmatch.fnmatch(name, n))
        for g, r, v, n in grants
    )
