"""Secret designation: which Secrets a WorkerNode may name, for what, and which key (pure).

nodewarden reads a Secret a WorkerNode names only if an administrator designated it for
that use with the label ``nodewarden.io/credentials`` = ``bmc`` | ``ssh`` | ``wol``, and
the Secret is not one the operator itself uses (its SSH key, the cloud credentials, the
status-API token): those are *reserved* and can never be selected by a WorkerNode, label
or not.

Each credential field reads exactly one *role* of its Secret, under a fixed key name (the
way Metal3's credentials Secret works): a ``bmc`` Secret holds ``username``, ``password``
and ``caBundle``; an ``ssh`` Secret ``privateKey`` and ``knownHosts``; a ``wol`` Secret
``secureOn``. A Secret whose keys are named otherwise is read through the administrator's
key map, the annotation ``nodewarden.io/credential-keys`` (JSON, key -> role, e.g.
``{"user": "username", "ca.crt": "caBundle"}``). A field that names a key of another role
(``usernameSecretRef: {key: password}``) is refused like an undesignated Secret, so no
value ever reaches a use (or a message) it was not designated for.

Roles are of two classes: *secret* (username, password, privateKey, secureOn: never shown
anywhere, registered for redaction) and *public* (caBundle, knownHosts).

A refusal never tells a WorkerNode author more than "not designated for this use, or
absent" -- not whether the Secret exists, carries another label, lacks the key or holds
an unusable value -- so validation is no oracle for Secrets the author cannot read. The
exact cause (`why_not`) is a fixed text for the operator's log: messages about a Secret
name the Secret and the key, never anything derived from its content.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from nodewarden.api.workernode import WorkerNodeSpec

Purpose = Literal["bmc", "ssh", "wol"]
Role = Literal["username", "password", "caBundle", "privateKey", "knownHosts", "secureOn"]
LABEL = "nodewarden.io/credentials"
KEY_MAP_ANNOTATION = "nodewarden.io/credential-keys"
PURPOSE_TEXT: dict[Purpose, str] = {
    "bmc": "BMC credentials",
    "ssh": "SSH credentials",
    "wol": "Wake-on-LAN credentials",
}
ROLES: dict[Purpose, tuple[Role, ...]] = {
    "bmc": ("username", "password", "caBundle"),
    "ssh": ("privateKey", "knownHosts"),
    "wol": ("secureOn",),
}
_ROLES_BY_LABEL: dict[str, tuple[str, ...]] = {str(k): tuple(v) for k, v in ROLES.items()}
PUBLIC_ROLES: frozenset[str] = frozenset({"caBundle", "knownHosts"})
"""Roles whose values are not secret (a CA bundle, known_hosts lines)."""
ROLE_TEXT: dict[Role, str] = {
    "username": "the BMC user name",
    "password": "the BMC password",
    "caBundle": "a PEM CA bundle",
    "privateKey": "an SSH private key",
    "knownHosts": "known_hosts lines",
    "secureOn": "a SecureOn password",
}


@dataclass(frozen=True, slots=True)
class SecretRef:
    """A WorkerNode field naming one key of one Secret, the use and the role it reads."""

    field: str
    name: str
    key: str
    purpose: Purpose
    role: Role

    @property
    def public(self) -> bool:
        return self.role in PUBLIC_ROLES


_FIELDS: tuple[tuple[str, str, str, Purpose, Role], ...] = (
    # (field path, spec attribute, reference attribute, purpose, role)
    ("spec.bmc.usernameSecretRef", "bmc", "username_secret_ref", "bmc", "username"),
    ("spec.bmc.passwordSecretRef", "bmc", "password_secret_ref", "bmc", "password"),
    ("spec.bmc.caBundleSecretRef", "bmc", "ca_bundle_secret_ref", "bmc", "caBundle"),
    ("spec.wakeOnLan.secureOnSecretRef", "wake_on_lan", "secure_on_secret_ref", "wol", "secureOn"),
    ("spec.ssh.privateKeySecretRef", "ssh", "private_key_secret_ref", "ssh", "privateKey"),
    ("spec.ssh.knownHostsSecretRef", "ssh", "known_hosts_secret_ref", "ssh", "knownHosts"),
)
CREDENTIAL_FIELDS: dict[str, tuple[Purpose, Role]] = {f: (p, r) for f, _, _, p, r in _FIELDS}
"""Every WorkerNode field that names a Secret key, with its use and role."""


def secret_refs(spec: WorkerNodeSpec) -> tuple[SecretRef, ...]:
    """Every Secret key a WorkerNode names, with the field path, the use and the role."""
    refs: list[SecretRef] = []
    for path, section, attribute, purpose, role in _FIELDS:
        parent = getattr(spec, section)
        ref = getattr(parent, attribute) if parent is not None else None
        if ref is not None:
            refs.append(SecretRef(path, ref.name, ref.key, purpose, role))
    return tuple(refs)


@dataclass(frozen=True, slots=True)
class SecretView:
    """What designation needs to know of a Secret: labels, key names, key map (no values)."""

    name: str
    labels: Mapping[str, str]
    keys: frozenset[str]
    annotations: Mapping[str, str] = field(default_factory=dict)

    @property
    def purpose(self) -> str | None:
        return self.labels.get(LABEL)

    def key_map(self) -> dict[str, str] | None:
        """The administrator's key -> role map (None: unreadable; {}: none)."""
        raw = self.annotations.get(KEY_MAP_ANNOTATION)
        if raw is None:
            return {}
        try:
            parsed = json.loads(raw)
        except ValueError:
            return None
        if not isinstance(parsed, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in parsed.items()
        ):
            return None
        return parsed

    def role_of(self, key: str) -> str | None:
        """The role the value under `key` serves: from the key map, else the key's own name
        when it is a role of this Secret's use; None if it serves none."""
        roles: tuple[str, ...] = _ROLES_BY_LABEL.get(self.purpose or "", ())
        if not roles:
            return None
        mapped = (self.key_map() or {}).get(key)
        if mapped is not None:
            return mapped if mapped in roles else None
        return key if key in roles else None


def designated(view: SecretView | None, ref: SecretRef, reserved: frozenset[str]) -> bool:
    """May `ref` be read? Only a labelled, unreserved Secret that has the key, and whose
    key serves the role of the field."""
    if view is None or ref.name in reserved:
        return False
    return (
        view.purpose == ref.purpose and ref.key in view.keys and view.role_of(ref.key) == ref.role
    )


def refusal_message(ref: SecretRef) -> str:
    """The one message for every way a reference can fail (no oracle)."""
    return (
        f"{ref.field}: Secret {ref.name!r} (key {ref.key!r}) is not designated for "
        f"{PURPOSE_TEXT[ref.purpose]}, or does not exist; an administrator creates it with "
        f"the label {LABEL}={ref.purpose} and {ROLE_TEXT[ref.role]} under the key "
        f"{ref.role!r} (or maps the key to {ref.role} in the annotation "
        f"{KEY_MAP_ANNOTATION}) (docs/security.md)"
    )


def why_not(view: SecretView | None, ref: SecretRef, reserved: frozenset[str]) -> str:
    """The exact cause, for the operator's log (read by administrators, never a status).
    Fixed texts: nothing derived from the Secret's values."""
    if ref.name in reserved:
        return "reserved: the operator itself uses this Secret"
    if view is None:
        return "the Secret does not exist"
    label = view.purpose
    if label != ref.purpose:
        return f"label {LABEL} is {label!r}, not {ref.purpose!r}"
    if ref.key not in view.keys:
        return "the Secret has no such key"
    if view.key_map() is None:
        return f"the annotation {KEY_MAP_ANNOTATION} is not a JSON object of key -> role"
    role = view.role_of(ref.key)
    if role is None:
        return f"the key serves no role (name it {ref.role!r} or map it to {ref.role})"
    return f"the key holds the {role}, not the {ref.role} this field reads"


def key_rename(view: SecretView, ref: SecretRef) -> str | None:
    """For `nodewarden check` before an upgrade: a reference to a designated Secret's
    existing key that this release refuses because the key does not serve the field's
    role, and how to fix it (None: nothing to rename)."""
    if view.purpose != ref.purpose or ref.key not in view.keys:
        return None
    if view.role_of(ref.key) == ref.role:
        return None
    return (
        f"rename key {ref.key!r} of Secret {ref.name!r} to {ref.role!r} (and the node's "
        f"{ref.field}.key), or map it: annotate the Secret "
        f'{KEY_MAP_ANNOTATION}=\'{{"{ref.key}": "{ref.role}"}}\''
    )
