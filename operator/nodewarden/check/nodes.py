"""Check each WorkerNode's credentials and endpoints, all through the credential resolver.

- secrets: every Secret a WorkerNode names exists and is designated for its use, and every
  BMC, SSH and Wake-on-LAN endpoint is admitted (`CredentialResolver.check`);
- bmc: each admitted BMC answers its Redfish service root over TLS verified with the
  configured CA, and accepts the designated credentials (a read of its ComputerSystem);
- ssh: each admitted side-node SSH address presents a host key listed in its designated
  known_hosts Secret (host-key verification only: no client key, password or agent is
  offered, so nothing but the SSH handshake reaches the node).

Nothing is sent to an endpoint the resolver does not admit, and no name is resolved to
decide admission: contact happens only with credentials the resolver handed out.
Nothing is sent by Wake-on-LAN. Failures are one line per node; passes one line per check.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import asyncssh
from pydantic import ValidationError

from nodewarden.api.workernode import WorkerNodeSpec
from nodewarden.check.result import CheckResult, failed, passed, plural, warned
from nodewarden.credentials import LABEL, CredentialResolver, Refusal, secret_refs
from nodewarden.credentials.designation import key_rename
from nodewarden.credentials.resolver import BmcCredentials, SshCredentials
from nodewarden.redfish.client import RedfishClient
from nodewarden.redfish.errors import (
    AuthFailed,
    RedfishConnectionError,
    RedfishError,
    RedfishTimeout,
    TlsError,
)

CONCURRENCY = 16
C = TypeVar("C")
ADMISSION_FIELDS = {
    "spec.bmc.endpoint": "credentials.bmc_endpoints (Helm value credentials.bmcEndpoints)",
    "spec.ssh.address": "credentials.ssh_endpoints (Helm value credentials.sshEndpoints)",
    "spec.wakeOnLan.broadcastAddress": (
        "credentials.wake_on_lan_targets (Helm value credentials.wakeOnLanTargets)"
    ),
}


@dataclass(frozen=True, slots=True)
class Node:
    """A WorkerNode as the checks see it: its name, parsed spec and observed power."""

    name: str
    spec: WorkerNodeSpec
    observed_power: str | None


def parse_nodes(bodies: Sequence[Mapping[str, Any]]) -> tuple[list[Node], list[CheckResult]]:
    """Parsed nodes, and a failed line for each spec that does not parse."""
    nodes, bad = [], []
    for body in bodies:
        name = str(body.get("metadata", {}).get("name", "?"))
        try:
            spec = WorkerNodeSpec.model_validate(body.get("spec") or {})
        except ValidationError as exc:
            problems = "; ".join(
                f"spec.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
            )
            bad.append(failed("nodes", f"WorkerNode {name}: {problems}", "fix the named field"))
            continue
        power = (body.get("status") or {}).get("observedPower")
        nodes.append(Node(name, spec, str(power) if power else None))
    return nodes, bad


def refusal_fix(refusal: Refusal, node: Node, resolver: CredentialResolver) -> str:
    """The concrete fix for one refusal, for the administrator who runs check."""
    if refusal.reason == "EndpointNotAdmitted":
        where = ADMISSION_FIELDS.get(refusal.field, "the operator config's credentials section")
        return f"admit it in {where}, or point the node at an admitted endpoint"
    if refusal.reason == "CredentialsNotDesignated":
        ref = next((r for r in secret_refs(node.spec) if r.field == refusal.field), None)
        if ref is None:
            return ""
        if ref.name in resolver.reserved:
            return f"Secret {ref.name} is the operator's own; point {ref.field} at another Secret"
        return (
            f"create Secret {ref.name} with key {ref.role} in {resolver.namespace} and label "
            f"it: kubectl -n {resolver.namespace} label secret {ref.name} {LABEL}={ref.purpose}"
        )
    return ""


async def _key_rename(refusal: Refusal, node: Node, resolver: CredentialResolver) -> str | None:
    """A designated Secret's key that this release does not read for the field (fixed key
    names per role since issue 20): the rename, or the key map, that keeps it working.
    Run before an upgrade, this lists every node the upgrade would refuse."""
    if refusal.reason != "CredentialsNotDesignated":
        return None
    ref = next((r for r in secret_refs(node.spec) if r.field == refusal.field), None)
    if ref is None:
        return None
    view = await resolver.secret_view(ref.name)
    return key_rename(view, ref) if view is not None else None


async def _gather(items: Sequence[Any], fn: Callable[[Any], Awaitable[Any]]) -> list[Any]:
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(item: Any) -> Any:
        async with gate:
            return await fn(item)

    return list(await asyncio.gather(*(one(i) for i in items)))


async def check_secrets(
    nodes: Sequence[Node], resolver: CredentialResolver
) -> tuple[list[CheckResult], dict[str, set[str]]]:
    """The secrets lines, and per node the fields the resolver refused."""
    refused: dict[str, set[str]] = {}
    out: list[CheckResult] = []
    answers = await _gather(nodes, lambda n: resolver.check(n.name, n.spec))
    for node, refusals in zip(nodes, answers, strict=True):
        refused[node.name] = {r.field for r in refusals}
        for refusal in refusals:
            rename = await _key_rename(refusal, node, resolver)
            out.append(
                failed(
                    "secrets",
                    f"WorkerNode {node.name}: {refusal.reason}: {refusal.message}"
                    + (" -- the key does not serve this field's role" if rename else ""),
                    rename or refusal_fix(refusal, node, resolver),
                )
            )
    clean = sum(1 for n in nodes if not refused[n.name])
    if clean:
        out.insert(
            0,
            passed(
                "secrets",
                f"{plural(clean, 'WorkerNode')}: every named Secret designated, every "
                "endpoint admitted",
            ),
        )
    return out, refused


async def _bmc_line(
    node: Node, creds: BmcCredentials, contact_timeout: float
) -> CheckResult | None:
    config = creds.redfish_config(
        connect_timeout=min(contact_timeout, 5.0), request_timeout=contact_timeout
    )
    where = f"WorkerNode {node.name}: BMC {creds.endpoint}"
    try:
        async with RedfishClient(config) as bmc:
            await bmc.discover_system()
    except TlsError as exc:
        ca = (
            "the CA in spec.bmc.caBundleSecretRef"
            if creds.ca_bundle_pem is not None
            else "the system's CAs (no spec.bmc.caBundleSecretRef)"
        )
        if exc.problem == "unknown_ca":
            return failed(
                "bmc",
                f"{where}: its TLS certificate is not signed by {ca} (unknown CA)",
                "put the CA that signed the BMC's certificate into the Secret named by "
                "spec.bmc.caBundleSecretRef (never switch verification off)",
            )
        return failed("bmc", f"{where}: {exc.detail}", "give the BMC a valid certificate")
    except AuthFailed as exc:
        return failed(
            "bmc",
            f"{where}: {exc.detail}",
            "put the right user name and password into the Secrets of spec.bmc",
        )
    except (RedfishTimeout, RedfishConnectionError) as exc:
        return failed(
            "bmc",
            f"{where} does not answer: {exc.detail}",
            "is the BMC reachable from the operator's network?",
        )
    except RedfishError as exc:
        return failed("bmc", f"{where}: {exc.detail}", "see the message")
    return None


async def _contact(
    check: str,
    noun: str,
    candidates: Sequence[Node],
    refused: Mapping[str, set[str]],
    credentials: Callable[[str, WorkerNodeSpec], Awaitable[C | Refusal]],
    probe: Callable[[Node, C], Awaitable[CheckResult | None]],
) -> tuple[list[CheckResult], int]:
    """Probe each candidate whose `check` fields the resolver did not refuse, with the
    credentials it hands out now. Returns the problem lines (plus one '!' for the nodes
    not contacted) and how many passed."""
    prefix = f"spec.{check}"
    contact = [
        n for n in candidates if not any(f.startswith(prefix) for f in refused.get(n.name, ()))
    ]

    async def one(node: Node) -> CheckResult | None:
        creds = await credentials(node.name, node.spec)
        if isinstance(creds, Refusal):
            return None  # reported by the secrets check; nothing is sent
        return await probe(node, creds)

    lines = [line for line in await _gather(contact, one) if line is not None]
    good = len(contact) - len(lines)
    if len(candidates) > len(contact):
        lines.append(
            warned(
                check,
                f"{plural(len(candidates) - len(contact), noun)} not contacted: refused above "
                "(secrets)",
            )
        )
    return lines, good


async def check_bmcs(
    nodes: Sequence[Node],
    resolver: CredentialResolver,
    refused: Mapping[str, set[str]],
    contact_timeout: float,
) -> list[CheckResult]:
    with_bmc = [n for n in nodes if n.spec.bmc is not None]
    if not with_bmc:
        return [passed("bmc", "no WorkerNode has a BMC")]

    async def probe(node: Node, creds: BmcCredentials) -> CheckResult | None:
        return await _bmc_line(node, creds, contact_timeout)

    out, good = await _contact("bmc", "BMC", with_bmc, refused, resolver.bmc, probe)
    if good:
        verbs = ("answers its", "accepts") if good == 1 else ("answer their", "accept")
        out.insert(
            0,
            passed(
                "bmc",
                f"{plural(good, 'BMC')} {verbs[0]} service root with the configured CA and "
                f"{verbs[1]} the credentials",
            ),
        )
    return out


async def _host_key_line(
    node: Node, creds: SshCredentials, contact_timeout: float
) -> CheckResult | None:
    assert creds.known_hosts is not None
    trusted = creds.known_hosts.trusted_for(creds.host, creds.port)
    where = f"WorkerNode {node.name}: SSH {creds.host}:{creds.port}"
    try:
        conn = await asyncio.wait_for(
            asyncssh.connect(
                creds.host,
                creds.port,
                config=None,
                username=creds.user,
                known_hosts=(
                    list(trusted.host_keys),
                    list(trusted.ca_keys),
                    list(trusted.revoked),
                ),
                client_keys=None,
                password=None,
                agent_path=None,
                gss_host=None,
                kbdint_auth=False,
            ),
            contact_timeout,
        )
        conn.close()
    except asyncssh.PermissionDenied:
        pass  # the host key was verified before authentication was refused
    except asyncssh.HostKeyNotVerifiable:
        return failed(
            "ssh",
            f"{where} presented a host key that is not in spec.ssh.knownHostsSecretRef "
            f"(trusted: {', '.join(trusted.fingerprints) or 'none'})",
            f"if the node was rebuilt, put its new key into the known_hosts Secret "
            f"(ssh-keyscan -p {creds.port} {creds.host}); else find out who answers there",
        )
    except (OSError, TimeoutError, asyncssh.Error) as exc:
        why = str(exc) or type(exc).__name__
        if node.observed_power == "Off":
            return warned("ssh", f"{where} does not answer ({why}); the node is powered off")
        return failed(
            "ssh",
            f"{where} does not answer: {why}",
            "is sshd running there and reachable from the operator's network?",
        )
    return None


async def check_ssh(
    nodes: Sequence[Node],
    resolver: CredentialResolver,
    refused: Mapping[str, set[str]],
    contact_timeout: float,
) -> list[CheckResult]:
    side = [n for n in nodes if n.spec.node_type == "SideNode"]
    if not side:
        return [passed("ssh", "no side nodes (cloud VMs are reached once the cloud made them)")]

    async def probe(node: Node, creds: SshCredentials) -> CheckResult | None:
        return await _host_key_line(node, creds, contact_timeout)

    out, good = await _contact("ssh", "side node", side, refused, resolver.ssh, probe)
    if good:
        verb = "answers" if good == 1 else "answer"
        out.insert(0, passed("ssh", f"{plural(good, 'side node')} {verb} with a known host key"))
    return out
