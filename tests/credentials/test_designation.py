"""Secret designation: label per use, reserved Secrets, and refusals that are no oracle."""

from __future__ import annotations

from nodewarden.api.workernode import WorkerNodeSpec
from nodewarden.credentials.designation import (
    LABEL,
    SecretView,
    designated,
    refusal_message,
    secret_refs,
    why_not,
)

SPEC = WorkerNodeSpec.model_validate(
    {
        "nodeType": "SideNode",
        "controlMethod": "Redfish",
        "capacity": {"vcpus": 4, "ram": "8Gi"},
        "bmc": {
            "endpoint": "https://bmc.lab.example",
            "usernameSecretRef": {"name": "bmc", "key": "user"},
            "passwordSecretRef": {"name": "bmc", "key": "pass"},
            "caBundleSecretRef": {"name": "bmc-ca", "key": "ca.crt"},
        },
        "wakeOnLan": {"mac": "52:54:00:12:34:56", "secureOnSecretRef": {"name": "w", "key": "p"}},
        "ssh": {
            "address": "10.0.0.5",
            "privateKeySecretRef": {"name": "k", "key": "id"},
            "knownHostsSecretRef": {"name": "k", "key": "known_hosts"},
        },
    }
)


def test_every_reference_has_its_use() -> None:
    refs = {(r.field, r.purpose) for r in secret_refs(SPEC)}
    assert refs == {
        ("spec.bmc.usernameSecretRef", "bmc"),
        ("spec.bmc.passwordSecretRef", "bmc"),
        ("spec.bmc.caBundleSecretRef", "bmc"),
        ("spec.wakeOnLan.secureOnSecretRef", "wol"),
        ("spec.ssh.privateKeySecretRef", "ssh"),
        ("spec.ssh.knownHostsSecretRef", "ssh"),
    }


def test_only_a_labelled_unreserved_secret_with_the_key_is_designated() -> None:
    ref = next(r for r in secret_refs(SPEC) if r.field == "spec.bmc.passwordSecretRef")
    good = SecretView("bmc", {LABEL: "bmc"}, frozenset({"user", "pass"}))
    assert designated(good, ref, frozenset())
    assert not designated(good, ref, frozenset({"bmc"}))  # reserved by the operator
    assert not designated(SecretView("bmc", {LABEL: "ssh"}, good.keys), ref, frozenset())
    assert not designated(SecretView("bmc", {}, good.keys), ref, frozenset())
    assert not designated(SecretView("bmc", {LABEL: "bmc"}, frozenset({"user"})), ref, frozenset())
    assert not designated(None, ref, frozenset())


def test_the_message_is_the_same_whatever_the_cause() -> None:
    ref = next(r for r in secret_refs(SPEC) if r.field == "spec.bmc.passwordSecretRef")
    message = refusal_message(ref)
    assert "spec.bmc.passwordSecretRef" in message and "'bmc'" in message
    assert f"{LABEL}=bmc" in message
    # the exact cause is for the operator's log only, and differs per cause
    causes = {
        why_not(None, ref, frozenset()),
        why_not(SecretView("bmc", {}, frozenset({"pass"})), ref, frozenset()),
        why_not(SecretView("bmc", {LABEL: "bmc"}, frozenset()), ref, frozenset()),
        why_not(None, ref, frozenset({"bmc"})),
    }
    assert len(causes) == 4
