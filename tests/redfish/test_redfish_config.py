"""Validation of RedfishEndpointConfig: https origins only, secrets hidden."""

from __future__ import annotations

import pytest
from pydantic import SecretStr, ValidationError

from nodewarden.api.base import SecretKeyReference
from nodewarden.api.workernode import BmcEndpoint
from nodewarden.redfish import RedfishEndpointConfig


def config(endpoint: str) -> RedfishEndpointConfig:
    return RedfishEndpointConfig(endpoint=endpoint, username="u", password=SecretStr("p4ss"))


@pytest.mark.parametrize(
    ("given", "normalised"),
    [
        ("https://127.0.0.1", "https://127.0.0.1"),
        ("https://127.0.0.1:8443/", "https://127.0.0.1:8443"),
        ("https://BMC-7.example:443/redfish/v1/", "https://bmc-7.example:443"),
        ("https://[::1]:8000", "https://[::1]:8000"),
    ],
)
def test_endpoint_is_normalised_to_its_origin(given: str, normalised: str) -> None:
    made = config(given)
    assert made.endpoint == normalised
    assert made.source == f"redfish:{normalised}"


@pytest.mark.parametrize(
    "bad",
    [
        "http://127.0.0.1",
        "127.0.0.1",
        "https://",
        "https://admin:pw@127.0.0.1",
        "https://127.0.0.1/other/path",
        "https://127.0.0.1?x=1",
        "https://127.0.0.1:99999",
    ],
)
def test_bad_endpoints_are_rejected(bad: str) -> None:
    with pytest.raises(ValidationError):
        config(bad)


def test_password_is_hidden_and_config_is_frozen() -> None:
    made = config("https://127.0.0.1")
    for text in (repr(made), str(made), made.model_dump_json()):
        assert "p4ss" not in text
    with pytest.raises(ValidationError):
        made.username = "other"  # type: ignore[misc]


def test_from_a_workernode_bmc_spec() -> None:
    ref = SecretKeyReference.model_validate({"name": "bmc", "key": "password"})
    spec = BmcEndpoint.model_validate(
        {
            "endpoint": "https://127.0.0.1:8443",
            "systemId": "blade-1",
            "usernameSecretRef": ref.to_wire(),
            "passwordSecretRef": ref.to_wire(),
            "useSessions": False,
        }
    )
    made = RedfishEndpointConfig.from_bmc_endpoint(
        spec,
        username="admin",
        password=SecretStr("p4ss"),
        ca_bundle_pem=None,
        request_timeout=3.0,
    )
    assert made.endpoint == "https://127.0.0.1:8443"
    assert made.system_id == "blade-1"
    assert made.use_sessions is False
    assert made.request_timeout == 3.0
