"""Secret designation: label per use, fixed key per role (or the administrator's key map),
reserved Secrets, and refusals that are no oracle."""

from __future__ import annotations

import json
from dataclasses import replace

from nodewarden.api.workernode import WorkerNodeSpec
from nodewarden.credentials.designation import (
    CREDENTIAL_FIELDS,
    KEY_MAP_ANNOTATION,
    LABEL,
    SecretRef,
    SecretView,
    designated,
    key_rename,
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
            "usernameSecretRef": {"name": "bmc", "key": "username"},
            "passwordSecretRef": {"name": "bmc", "key": "password"},
            "caBundleSecretRef": {"name": "bmc-ca", "key": "ca.crt"},
        },
        "wakeOnLan": {"mac": "52:54:00:12:34:56", "secureOnSecretRef": {"name": "w", "key": "p"}},
        "ssh": {
            "address": "10.0.0.5",
            "privateKeySecretRef": {"name": "k", "key": "privateKey"},
            "knownHostsSecretRef": {"name": "k", "key": "known_hosts"},
        },
    }
)


def ref_of(field: str, key: str | None = None) -> SecretRef:
    ref = next(r for r in secret_refs(SPEC) if r.field == field)
    return ref if key is None else replace(ref, key=key)


def test_every_reference_has_its_use_and_role() -> None:
    refs = {(r.field, r.purpose, r.role) for r in secret_refs(SPEC)}
    assert refs == {
        ("spec.bmc.usernameSecretRef", "bmc", "username"),
        ("spec.bmc.passwordSecretRef", "bmc", "password"),
        ("spec.bmc.caBundleSecretRef", "bmc", "caBundle"),
        ("spec.wakeOnLan.secureOnSecretRef", "wol", "secureOn"),
        ("spec.ssh.privateKeySecretRef", "ssh", "privateKey"),
        ("spec.ssh.knownHostsSecretRef", "ssh", "knownHosts"),
    }
    assert {r.field for r in secret_refs(SPEC)} == set(CREDENTIAL_FIELDS)


def test_only_a_labelled_unreserved_secret_with_the_role_key_is_designated() -> None:
    ref = ref_of("spec.bmc.passwordSecretRef")
    good = SecretView("bmc", {LABEL: "bmc"}, frozenset({"username", "password"}))
    assert designated(good, ref, frozenset())
    assert not designated(good, ref, frozenset({"bmc"}))  # reserved by the operator
    assert not designated(SecretView("bmc", {LABEL: "ssh"}, good.keys), ref, frozenset())
    assert not designated(SecretView("bmc", {}, good.keys), ref, frozenset())
    only_user = SecretView("bmc", {LABEL: "bmc"}, frozenset({"username"}))
    assert not designated(only_user, ref, frozenset())
    assert not designated(None, ref, frozenset())


def test_a_field_reads_only_the_key_of_its_role() -> None:
    """The attack of issue 20: the user name field aimed at the password key."""
    user = ref_of("spec.bmc.usernameSecretRef")
    view = SecretView("bmc", {LABEL: "bmc"}, frozenset({"username", "password", "token"}))
    assert designated(view, user, frozenset())
    for key in ("password", "token"):
        assert not designated(view, replace(user, key=key), frozenset())


def test_the_key_map_serves_other_key_names_and_only_those() -> None:
    ca = ref_of("spec.bmc.caBundleSecretRef")  # key ca.crt
    plain = SecretView("bmc-ca", {LABEL: "bmc"}, frozenset({"ca.crt"}))
    assert not designated(plain, ca, frozenset())
    mapped = SecretView(
        "bmc-ca", {LABEL: "bmc"}, frozenset({"ca.crt", "pw"}),
        {KEY_MAP_ANNOTATION: json.dumps({"ca.crt": "caBundle", "pw": "password"})},
    )  # fmt: skip
    assert designated(mapped, ca, frozenset())
    # a mapped key serves its mapped role only; a role of another use is never served
    assert mapped.role_of("pw") == "password"
    wrong = SecretView(
        "bmc-ca", {LABEL: "bmc"}, frozenset({"ca.crt"}),
        {KEY_MAP_ANNOTATION: json.dumps({"ca.crt": "knownHosts"})},
    )  # fmt: skip
    assert not designated(wrong, ca, frozenset())
    broken = SecretView("bmc-ca", {LABEL: "bmc"}, frozenset({"ca.crt"}), {KEY_MAP_ANNOTATION: "["})
    assert not designated(broken, ca, frozenset())
    assert "not a JSON object" in why_not(broken, ca, frozenset())


def test_the_message_is_the_same_whatever_the_cause() -> None:
    ref = ref_of("spec.bmc.passwordSecretRef")
    message = refusal_message(ref)
    assert "spec.bmc.passwordSecretRef" in message and "'bmc'" in message
    assert f"{LABEL}=bmc" in message and "'password'" in message
    # the exact cause is for the operator's log only, and differs per cause
    keys = frozenset({"password"})
    causes = {
        why_not(None, ref, frozenset()),
        why_not(SecretView("bmc", {}, keys), ref, frozenset()),
        why_not(SecretView("bmc", {LABEL: "bmc"}, frozenset()), ref, frozenset()),
        why_not(None, ref, frozenset({"bmc"})),
        why_not(
            SecretView("bmc", {LABEL: "bmc"}, frozenset({"pass"})),
            replace(ref, key="pass"),
            frozenset(),
        ),
    }
    assert len(causes) == 5


def test_check_names_the_key_to_rename_before_an_upgrade() -> None:
    ref = ref_of("spec.bmc.usernameSecretRef", "user")
    view = SecretView("bmc", {LABEL: "bmc"}, frozenset({"user", "pass"}))
    fix = key_rename(view, ref)
    assert fix is not None and "'user'" in fix and "'username'" in fix
    assert KEY_MAP_ANNOTATION in fix
    mapped = SecretView(
        "bmc", {LABEL: "bmc"}, view.keys, {KEY_MAP_ANNOTATION: '{"user": "username"}'}
    )
    assert key_rename(mapped, ref) is None  # the map keeps it working
    assert key_rename(SecretView("bmc", {}, view.keys), ref) is None  # not designated at all
