"""Check that the operator configuration parses, and say what it sets (pure but for the read).

Without ``--config`` the defaults are checked and the checks that depend on the
operator's own settings (admitted endpoints, cloud) are skipped with the command that
fetches the installed configuration.
"""

from __future__ import annotations

from pathlib import Path

from nodewarden.check.result import CheckResult, failed, passed, warned
from nodewarden.config import ConfigError, OperatorConfig, load_config

FETCH_CONFIG = (
    "kubectl -n {namespace} get configmap nodewarden -o jsonpath='{{.data.config\\.yaml}}' "
    "> nodewarden.yaml; nodewarden check --config nodewarden.yaml (the ConfigMap is named "
    "after the Helm release)"
)


def describe(config: OperatorConfig) -> str:
    admitted = config.credentials
    cloud = config.cloud.driver if config.cloud is not None else "none"
    return (
        f"dispatcher {config.dispatcher_id}, cloud {cloud}, admitted endpoints: "
        f"{len(admitted.bmc_endpoints)} BMC, {len(admitted.ssh_endpoints)} SSH, "
        f"{len(admitted.wake_on_lan_targets)} Wake-on-LAN"
    )


def check_config(
    path: Path | None, namespace: str | None, hint_namespace: str = "NAMESPACE"
) -> tuple[OperatorConfig | None, CheckResult]:
    """The parsed config (None: it does not parse) and the `config` line."""
    overrides: dict[str, object] = {"namespace": namespace}
    if path is None:
        return load_config(None, overrides), warned(
            "config",
            "no --config given: checked with the defaults (no cloud, nothing admitted); "
            "checks of the operator's own settings are skipped",
            FETCH_CONFIG.format(namespace=hint_namespace),
        )
    try:
        config = load_config(path, overrides)
    except ConfigError as exc:
        return None, failed(
            "config", str(exc), "fix the named field (README: Configuration) and check again"
        )
    return config, passed("config", f"{path} parses: {describe(config)}")
