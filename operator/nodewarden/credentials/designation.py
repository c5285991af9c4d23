"""Secret designation: which Secrets a WorkerNode may name, and for what (pure).

nodewarden reads a Secret a WorkerNode names only if an administrator designated it for
that use with the label ``nodewarden.io/credentials`` = ``bmc`` | ``ssh`` | ``wol``, and
the Secret is not one the operator itself uses (its SSH key, the cloud credentials, the
status-API token): those are *reserved* and can never be selected by a WorkerNode, label
or not.

A refusal never tells a WorkerNode author more than "not designated for this use, or
absent" -- not whether the Secret exists, carries another label, or lacks the key --
so validation is no oracle for Secrets the author cannot read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from nodewarden.api.workernode import WorkerNodeSpec

Purpose = Literal["bmc", "ssh", "wol"]
LABEL = "nodewarden.io/credentials"
PURPOSE_TEXT: dict[Purpose, str] = {
    "bmc": "BMC credentials",
    "ssh": "SSH credentials",
    "wol": "Wake-on-LAN credentials",
}


@dataclass(frozen=True, slots=True)
class SecretRef:
    """A WorkerNode field naming one key of one Secret, and the use it is for."""

    field: str
    name: str
    key: str
    purpose: Purpose


def secret_refs(spec: WorkerNodeSpec) -> tuple[SecretRef, ...]:
    """Every Secret key a WorkerNode names, with the field path and the use."""
    refs: list[SecretRef] = []
    if spec.bmc is not None:
        bmc = spec.bmc
        refs.append(SecretRef("spec.bmc.usernameSecretRef", *_ref(bmc.username_secret_ref), "bmc"))
        refs.append(SecretRef("spec.bmc.passwordSecretRef", *_ref(bmc.password_secret_ref), "bmc"))
        if bmc.ca_bundle_secret_ref is not None:
            refs.append(
                SecretRef("spec.bmc.caBundleSecretRef", *_ref(bmc.ca_bundle_secret_ref), "bmc")
            )
    wol = spec.wake_on_lan
    if wol is not None and wol.secure_on_secret_ref is not None:
        refs.append(
            SecretRef("spec.wakeOnLan.secureOnSecretRef", *_ref(wol.secure_on_secret_ref), "wol")
        )
    ssh = spec.ssh
    if ssh.private_key_secret_ref is not None:
        refs.append(
            SecretRef("spec.ssh.privateKeySecretRef", *_ref(ssh.private_key_secret_ref), "ssh")
        )
    if ssh.known_hosts_secret_ref is not None:
        refs.append(
            SecretRef("spec.ssh.knownHostsSecretRef", *_ref(ssh.known_hosts_secret_ref), "ssh")
        )
    return tuple(refs)


def _ref(ref: object) -> tuple[str, str]:
    return getattr(ref, "name"), getattr(ref, "key")  # noqa: B009 (one helper for three types)


@dataclass(frozen=True, slots=True)
class SecretView:
    """What designation needs to know of a Secret: its labels and key names (no values)."""

    name: str
    labels: Mapping[str, str]
    keys: frozenset[str]


def designated(view: SecretView | None, ref: SecretRef, reserved: frozenset[str]) -> bool:
    """May `ref` be read? Only a labelled, unreserved Secret that has the key."""
    if view is None or ref.name in reserved:
        return False
    return view.labels.get(LABEL) == ref.purpose and ref.key in view.keys


def refusal_message(ref: SecretRef) -> str:
    """The one message for every way a reference can fail (no oracle)."""
    return (
        f"{ref.field}: Secret {ref.name!r} (key {ref.key!r}) is not designated for "
        f"{PURPOSE_TEXT[ref.purpose]}, or does not exist; an administrator creates it with "
        f"the label {LABEL}={ref.purpose} (docs/security.md)"
    )


def why_not(view: SecretView | None, ref: SecretRef, reserved: frozenset[str]) -> str:
    """The exact cause, for the operator's own log (read by administrators, never a status)."""
    if ref.name in reserved:
        return "reserved: the operator itself uses this Secret"
    if view is None:
        return "the Secret does not exist"
    label = view.labels.get(LABEL)
    if label != ref.purpose:
        return f"label {LABEL} is {label!r}, not {ref.purpose!r}"
    return "the Secret has no such key"
