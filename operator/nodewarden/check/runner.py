"""The thin runner of `nodewarden check`: gather the facts, run every group, in order.

    config -> kubeconfig / api-server -> version -> clock -> crds -> rbac -> requesters
    -> cloud -> policies -> caps -> secrets -> bmc -> ssh -> lease -> shards (sharding on)
    -> live (with --live)

A check that needs what an earlier one found missing is reported once as "not checked"
with the reason. When the API server cannot be reached the report says the checks could
not run (exit 2).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from nodewarden.api.kinds import POWER_POLICY, WORKER_NODE
from nodewarden.check import (
    caps,
    cloud,
    crds,
    kubeapi,
    lease,
    live,
    nodes,
    policies,
    rbac,
    requesters,
    shards,
)
from nodewarden.check.operatorconfig import FETCH_CONFIG, check_config
from nodewarden.check.result import CheckResult, Report, failed, passed, skipped, warned
from nodewarden.config import ConfigError, OperatorConfig
from nodewarden.credential_setup import build_resolver
from nodewarden.credentials import CredentialResolver, secret_refs
from nodewarden.fleet.policies import PolicyBook
from nodewarden.kube.client import Kube, KubeError
from nodewarden.kube.kubeconfig import context_namespace, default_kubeconfig
from nodewarden.ownership import DISPATCHER_LABEL

CLUSTER_CHECKS = (
    "crds",
    "rbac",
    "requesters",
    "cloud",
    "policies",
    "caps",
    "secrets",
    "bmc",
    "ssh",
    "lease",
)


@dataclass(frozen=True, slots=True)
class CheckOptions:
    """The command line of `nodewarden check`."""

    kubeconfig: Path | None = None
    namespace: str | None = None
    config: Path | None = None
    output: Literal["table", "json"] = "table"
    live: bool = False
    operator_url: str | None = None
    service_account: str | None = None
    timeout: float = 10.0


def _namespace(options: CheckOptions, config: OperatorConfig | None) -> str:
    if options.namespace:
        return options.namespace
    if config is not None and config.namespace:
        return config.namespace
    path = options.kubeconfig or default_kubeconfig()
    return (context_namespace(path) if path is not None else None) or "default"


async def _resolver(
    config: OperatorConfig, kube: Kube, namespace: str
) -> tuple[CredentialResolver, CheckResult]:
    try:
        resolver = await build_resolver(config, kube, namespace)
    except ConfigError as exc:
        return (
            CredentialResolver(
                kube, namespace, config.credentials, reserved=config.reserved_secrets
            ),
            failed("secrets", f"operator key: {exc}"),
        )
    ref = config.dispatch.ssh_private_key_secret
    what = (
        f"operator SSH key (Secret {ref.name}) loads" if ref else "no operator SSH key configured"
    )
    return resolver, passed("secrets", what)


async def _operator_secrets(
    kube: Kube, namespace: str, config: OperatorConfig
) -> list[CheckResult]:
    name = config.management.token_secret_name
    if not name:
        return []
    try:
        await kube.read_secret(namespace, name, config.management.token_secret_key)
    except KubeError as exc:
        return [
            failed(
                "secrets",
                f"management.token_secret_name: {exc}",
                f"create Secret {name} with key {config.management.token_secret_key} in "
                f"{namespace}, or unset management.token_secret_name",
            )
        ]
    return [passed("secrets", f"status API token Secret {name} exists")]


async def _lease(kube: Kube, namespace: str, config: OperatorConfig, now: datetime) -> CheckResult:
    spec: dict[str, object] | None = None
    try:
        found = await kube.coordination.read_namespaced_lease(config.lease_name, namespace)
    except ApiException as exc:
        if exc.status != 404:
            return warned("lease", f"cannot read Lease {config.lease_name}: HTTP {exc.status}")
    else:
        spec = {
            "holderIdentity": found.spec.holder_identity,
            "renewTime": found.spec.renew_time,
            "acquireTime": found.spec.acquire_time,
            "leaseDurationSeconds": found.spec.lease_duration_seconds,
        }
    return lease.lease_result(
        spec, config.lease_name, namespace, now, config.leader_election.enabled
    )


async def _shards(
    kube: Kube,
    namespace: str,
    config: OperatorConfig,
    bodies: list[dict[str, object]],
    now: datetime,
) -> list[CheckResult]:
    """Sharding on: each shard Lease's holder (the Leases labelled with the dispatcher)."""
    try:
        found = await kube.coordination.list_namespaced_lease(
            namespace, label_selector=f"{DISPATCHER_LABEL}={config.dispatcher_id}"
        )
    except ApiException as exc:
        return [warned("shards", f"cannot list the shard Leases: HTTP {exc.status}")]
    leases = {
        item.metadata.name: {
            "holderIdentity": item.spec.holder_identity,
            "renewTime": item.spec.renew_time,
            "acquireTime": item.spec.acquire_time,
            "leaseDurationSeconds": item.spec.lease_duration_seconds,
        }
        for item in found.items
    }
    return shards.shard_results(
        config.sharding.shards, config.dispatcher_id, namespace, leases, bodies, now
    )


async def run_checks(options: CheckOptions, clock: Callable[[], float] | None = None) -> Report:
    """Every check, in order; see the module docstring."""
    offset = kubeapi.clock_offset()
    local_clock = clock or (lambda: time.time() + offset)
    results: list[CheckResult] = []
    config, line = check_config(options.config, options.namespace, _namespace(options, None))
    results.append(line)
    api, connected = await kubeapi.connect(options.kubeconfig)
    results.append(connected)
    if api is None:
        results.append(skipped(CLUSTER_CHECKS, "no usable kubeconfig"))
        return Report(tuple(results), could_not_run=True)
    try:
        return await _cluster_checks(options, config, api, local_clock, results)
    finally:
        await api.close()


async def _cluster_checks(
    options: CheckOptions,
    config: OperatorConfig | None,
    api: client.ApiClient,
    local_clock: Callable[[], float],
    results: list[CheckResult],
) -> Report:
    facts = await kubeapi.server_facts(api, local_clock)
    if isinstance(facts, CheckResult):
        results.append(facts)
        results.append(skipped(CLUSTER_CHECKS, "the API server did not answer"))
        return Report(tuple(results), could_not_run=True)
    results.append(passed("api-server", f"{facts.server} answers GET /version"))
    results.append(kubeapi.version_result(facts.git_version))
    if facts.skew is None:
        results.append(warned("clock", "the API server sent no Date header: skew not measured"))
    else:
        results.append(kubeapi.skew_result(facts.skew, facts.uncertainty))
    skew = facts.skew or 0.0

    def server_now() -> datetime:
        return datetime.fromtimestamp(local_clock() - skew, tz=UTC)

    crd_lines, crds_served = await crds.check_crds(api)
    results.extend(crd_lines)
    namespace = _namespace(options, config)
    kube = Kube(api, field_manager="nodewarden-check")
    bodies: list[dict[str, object]] = []
    policy_bodies: list[dict[str, object]] = []
    listed = False
    if crds_served:
        try:
            bodies = await kube.list(WORKER_NODE, namespace)
            policy_bodies = await kube.list(POWER_POLICY, namespace)
            listed = True
        except KubeError as exc:
            results.append(warned("nodes", f"cannot list nodewarden objects in {namespace}: {exc}"))
    parsed, bad = nodes.parse_nodes(bodies)
    if config is None:
        results.append(
            skipped(
                ("rbac", "cloud", "secrets", "bmc", "ssh", "lease"),
                "the operator config does not parse",
            )
        )
        if listed:
            results.extend(policies.policy_results(policy_bodies, parsed, "default", namespace))
        return Report(tuple(results))
    named_secrets = set(config.reserved_secrets)
    for node in parsed:
        named_secrets.update(ref.name for ref in secret_refs(node.spec))
    results.extend(
        await rbac.check_rbac(api, config, namespace, options.service_account, named_secrets)
    )
    if crds_served:
        results.append(await requesters.check_requesters(kube, namespace))
    configured = options.config is not None
    if configured:
        results.extend(
            await cloud.check_cloud(
                kube, namespace, config.cloud, config.dispatcher_id, options.timeout
            )
        )
    if listed:
        results.extend(
            policies.policy_results(policy_bodies, parsed, config.default_policy, namespace)
        )
        book = PolicyBook(namespace=namespace, default_name=config.default_policy)
        for body in policy_bodies:
            book.observe(body)
        results.extend(caps.caps_results(bodies, config, book.default_problem))
        results.extend(bad)
    if not configured:
        results.append(
            skipped(
                ("cloud", "secrets", "bmc", "ssh"),
                "no --config: the admitted endpoints and the cloud are in the operator config",
                FETCH_CONFIG.format(namespace=namespace),
            )
        )
    elif not listed:
        results.append(skipped(("secrets", "bmc", "ssh"), "WorkerNodes could not be listed"))
    else:
        resolver, key_line = await _resolver(config, kube, namespace)
        results.append(key_line)
        results.extend(await _operator_secrets(kube, namespace, config))
        secret_lines, refused = await nodes.check_secrets(parsed, resolver)
        results.extend(secret_lines)
        results.extend(await nodes.check_bmcs(parsed, resolver, refused, options.timeout))
        results.extend(await nodes.check_ssh(parsed, resolver, refused, options.timeout))
    results.append(await _lease(kube, namespace, config, server_now()))
    if config.sharding.enabled:
        results.extend(await _shards(kube, namespace, config, bodies, server_now()))
    if options.live:
        if not options.operator_url:
            results.append(
                warned(
                    "live",
                    "--live needs the operator's HTTP endpoint: pass --operator-url URL",
                    live.PORT_FORWARD,
                )
            )
        else:
            view = await live.read_live(
                options.operator_url, kube, namespace, config, options.timeout
            )
            results.extend(live.live_results(view, server_now()))
    return Report(tuple(results))
