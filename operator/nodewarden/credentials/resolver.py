"""The credential resolver: the only way any adapter obtains a credential for a node.

    resolver.bmc(name, spec)                  -> BmcCredentials | Refusal
    resolver.ssh(name, spec)                  -> SshCredentials | Refusal   (side nodes)
    resolver.ssh_for_instance(name, host, port) -> SshCredentials | Refusal (cloud VMs)
    resolver.wol(name, spec)                  -> WolCredentials | Refusal
    resolver.check(name, spec)                -> [Refusal, ...]             (validation)

Each call takes the WorkerNode spec as it is *now* (callers pass the latest from their
cache, at the moment of use), so an edit that points a node at a non-admitted endpoint
or an undesignated Secret stops every credentialed request from the next use on,
including a probe that was already scheduled. A refusal carries the condition reason,
the field and a message naming the Secret or endpoint and the rule; nothing is sent.

Rules (docs/security.md): a Secret named by a WorkerNode is read only when it carries
the label ``nodewarden.io/credentials`` for that use and is not one of the operator's
own (reserved) Secrets; BMC credentials go only to admitted BMC endpoints, side-node SSH
logins only to admitted SSH addresses (cloud VMs: the address the cloud reported for
nodewarden's own instance), Wake-on-LAN packets only to admitted targets. Secrets are
cached for `credentials.secretTtl` (one read per Secret per TTL, shared by all nodes).

Each field reads only the key of its role (`designation`): a value never reaches another
use. Every value of every Secret read is registered for redaction (logs, statuses,
Events), except those of the public roles (CA bundle, known_hosts). A value that cannot
be used (an empty user name, a key that does not load, a malformed SecureOn password) is
refused with the same message as an undesignated Secret; no message carries anything
derived from a Secret's content, and the operator's log gets a fixed text naming the
rule it broke.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from pydantic import SecretBytes, SecretStr

from nodewarden.api.workernode import WorkerNodeSpec
from nodewarden.credentials.admission import AdmissionList, Endpoint, bmc_endpoint, parse_entries
from nodewarden.credentials.bmcidentity import BmcRegistry
from nodewarden.credentials.designation import (
    LABEL,
    PUBLIC_ROLES,
    ROLE_TEXT,
    SecretRef,
    SecretView,
    designated,
    refusal_message,
    secret_refs,
    why_not,
)
from nodewarden.credentials.settings import CredentialsConfig
from nodewarden.kube.client import KubeError, SecretRecord
from nodewarden.logs import register_secret
from nodewarden.redfish.config import RedfishEndpointConfig
from nodewarden.redfish.transport import build_ssl_context
from nodewarden.ssh.credentials import KnownHostKeys, SshClientKey, SshTarget
from nodewarden.ssh.errors import InvalidClientKey
from nodewarden.units import parse_duration
from nodewarden.wol import InvalidSecureOn, parse_secure_on

log = logging.getLogger(__name__)

RefusalReason = Literal[
    "CredentialsNotDesignated",
    "EndpointNotAdmitted",
    "CredentialsMissing",
    "CredentialsInvalid",
    "BmcClaimed",
]


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why nothing may be sent: the condition reason, the field, the message (with the fix)."""

    reason: RefusalReason
    field: str
    message: str


@dataclass(frozen=True, slots=True)
class BmcCredentials:
    """A BMC's admitted endpoint and its designated credentials."""

    endpoint: str
    username: str = field(repr=False)
    password: SecretStr
    ca_bundle_pem: str | None = field(default=None, repr=False)
    system_id: str | None = None
    use_sessions: bool = True

    def redfish_config(self, **settings: Any) -> RedfishEndpointConfig:
        """Settings for a `RedfishClient` of this BMC (timeouts etc. in `settings`)."""
        return RedfishEndpointConfig(
            endpoint=self.endpoint,
            username=self.username,
            password=self.password,
            ca_bundle_pem=self.ca_bundle_pem,
            system_id=self.system_id,
            use_sessions=self.use_sessions,
            **settings,
        )


@dataclass(frozen=True, slots=True)
class SshCredentials:
    """An admitted SSH address, the login, the client key and the host keys to trust."""

    host: str
    port: int
    user: str
    client_key: SshClientKey
    known_hosts: KnownHostKeys | None

    def target(self, node: str) -> SshTarget:
        """The prober's target (side nodes: trust only the known_hosts keys)."""
        if self.known_hosts is None:
            raise ValueError("a side node's SSH target needs known host keys")
        return SshTarget(
            node=node,
            host=self.host,
            port=self.port,
            user=self.user,
            client_key=self.client_key,
            trust=self.known_hosts,
        )


@dataclass(frozen=True, slots=True)
class WolCredentials:
    """An admitted Wake-on-LAN target and the optional SecureOn password."""

    mac: str
    destination: str
    port: int
    secure_on: SecretBytes | None = field(default=None, repr=False)


class SecretSource(Protocol):
    """What the resolver reads Secrets with (`nodewarden.kube.client.Kube`)."""

    async def read_secret_record(self, namespace: str, name: str) -> SecretRecord | None: ...


@dataclass(slots=True)
class _Cached:
    expires: float
    record: SecretRecord | None


class CredentialResolver:
    """See the module docstring. One per operator process (and namespace)."""

    def __init__(
        self,
        secrets: SecretSource,
        namespace: str,
        config: CredentialsConfig,
        *,
        reserved: frozenset[str] = frozenset(),
        operator_key: SshClientKey | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._secrets = secrets
        self.namespace = namespace
        self.reserved = reserved
        self.operator_key = operator_key
        self._clock = clock
        self._ttl = parse_duration(config.secret_ttl).total_seconds()
        self.bmc_admission: AdmissionList = parse_entries("bmc", config.bmc_endpoints)
        self.ssh_admission: AdmissionList = parse_entries("ssh", config.ssh_endpoints)
        self.wol_admission: AdmissionList = parse_entries("wol", config.wake_on_lan_targets)
        self._cache: dict[str, _Cached] = {}
        self._inflight: dict[str, asyncio.Future[SecretRecord | None]] = {}
        self.reads = 0
        self.bmc_claims = BmcRegistry()
        """Which WorkerNode each BMC belongs to (fed by the power controller): a node whose
        BMC another holds is refused its BMC credentials (`bmcidentity`)."""

    # -- secrets ----------------------------------------------------------------------

    def forget(self, name: str | None = None) -> None:
        """Drop cached Secrets (all, or one) so the next use reads them again."""
        if name is None:
            self._cache.clear()
        else:
            self._cache.pop(name, None)

    async def _record(self, name: str) -> SecretRecord | None:
        now = self._clock()
        cached = self._cache.get(name)
        if cached is not None and cached.expires > now:
            return cached.record
        pending = self._inflight.get(name)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[SecretRecord | None] = asyncio.get_running_loop().create_future()
        self._inflight[name] = future
        try:
            self.reads += 1
            try:
                record = await self._secrets.read_secret_record(self.namespace, name)
            except KubeError as exc:
                # e.g. 403 where RBAC names the Secrets it may read: treated as absent.
                log.warning("cannot read Secret %s/%s: %s", self.namespace, name, exc)
                record = None
            if record is not None:
                _register_values(record)
            self._cache[name] = _Cached(self._clock() + self._ttl, record)
            future.set_result(record)
            return record
        except BaseException as exc:
            future.set_exception(exc)
            raise
        finally:
            del self._inflight[name]
            if not future.done():
                future.cancel()
            elif future.exception() is not None:
                future.exception()  # retrieved: no "never retrieved" warning

    async def secret_view(self, name: str) -> SecretView | None:
        """What designation sees of Secret `name` (labels, key names, key map; no values),
        through the cache; None when absent or reserved. For `nodewarden check`, which an
        administrator runs, never for a status."""
        if name in self.reserved:
            return None
        return _view(await self._record(name))

    async def _value(self, node: str, ref: SecretRef) -> SecretStr | Refusal:
        record = await self._record(ref.name) if ref.name not in self.reserved else None
        view = _view(record)
        if not designated(view, ref, self.reserved):
            return self._refuse(node, ref, why_not(view, ref, self.reserved))
        assert record is not None
        return record.values[ref.key]

    def _refuse(self, node: str, ref: SecretRef, cause: str) -> Refusal:
        """The no-oracle refusal of `ref`; the (fixed-text) cause goes to the log only."""
        log.info(
            "WorkerNode %s: %s refused (%s)",
            node,
            ref.field,
            cause,
            extra={"secret": ref.name, "key": ref.key, "label": LABEL},
        )
        return Refusal("CredentialsNotDesignated", ref.field, refusal_message(ref))

    def _unusable(self, node: str, ref: SecretRef) -> Refusal:
        """A designated value that cannot serve its role. Secret roles: the same refusal as
        an undesignated Secret (its content is no oracle either); public roles: a fixed
        text that names the Secret and the key."""
        if ref.role not in PUBLIC_ROLES:
            return self._refuse(node, ref, f"the value is not usable as {ROLE_TEXT[ref.role]}")
        return Refusal(
            "CredentialsInvalid",
            ref.field,
            f"{ref.field}: Secret {ref.name!r} (key {ref.key!r}) does not hold usable "
            f"{ROLE_TEXT[ref.role]} (docs/security.md)",
        )

    # -- endpoints ----------------------------------------------------------------------

    def _bmc_endpoint_refusal(self, spec: WorkerNodeSpec) -> Refusal | None:
        assert spec.bmc is not None
        endpoint = bmc_endpoint(spec.bmc.endpoint)
        if self.bmc_admission.admits(endpoint):
            return None
        return Refusal(
            "EndpointNotAdmitted",
            "spec.bmc.endpoint",
            f"spec.bmc.endpoint: {endpoint} is not an admitted BMC endpoint (operator config "
            "credentials.bmc_endpoints); an administrator admits it there, or point the node "
            "at an admitted BMC",
        )

    def _bmc_claim_refusal(self, name: str) -> Refusal | None:
        owner = self.bmc_claims.owner_for(name)
        if owner is None:
            return None
        return Refusal(
            "BmcClaimed",
            "spec.bmc.endpoint",
            f"spec.bmc: this BMC ({owner.describe()}) belongs to WorkerNode {owner.node!r}: "
            "one machine, one BMC. Point spec.bmc at this machine's own BMC; if "
            f"{owner.node!r} is the stale one, an administrator deletes it (docs/security.md)",
        )

    def _ssh_address(self, spec: WorkerNodeSpec) -> Endpoint | Refusal:
        address = spec.ssh.address
        if not address:
            return Refusal(
                "CredentialsMissing",
                "spec.ssh.address",
                "spec.ssh.address: a side node needs the address nodewarden logs in to",
            )
        endpoint = Endpoint(address, spec.ssh.port)
        if self.ssh_admission.admits(endpoint):
            return endpoint
        return Refusal(
            "EndpointNotAdmitted",
            "spec.ssh.address",
            f"spec.ssh.address: {endpoint} is not an admitted SSH address (operator config "
            "credentials.ssh_endpoints); an administrator admits it there",
        )

    def _wol_target(self, spec: WorkerNodeSpec) -> Endpoint | Refusal:
        assert spec.wake_on_lan is not None
        endpoint = Endpoint(spec.wake_on_lan.broadcast_address, spec.wake_on_lan.port)
        if self.wol_admission.admits(endpoint):
            return endpoint
        return Refusal(
            "EndpointNotAdmitted",
            "spec.wakeOnLan.broadcastAddress",
            f"spec.wakeOnLan.broadcastAddress: {endpoint} is not an admitted Wake-on-LAN "
            "target (operator config credentials.wake_on_lan_targets); an administrator "
            "admits it there",
        )

    # -- per use ------------------------------------------------------------------------

    async def bmc(self, name: str, spec: WorkerNodeSpec) -> BmcCredentials | Refusal:
        """The BMC credentials of node `name`, or why they may not be used."""
        bmc = spec.bmc
        if bmc is None:
            return Refusal("CredentialsMissing", "spec.bmc", "spec.bmc: the node has no BMC")
        refused = self._bmc_endpoint_refusal(spec) or self._bmc_claim_refusal(name)
        if refused is not None:
            return refused
        values: dict[str, SecretStr] = {}
        for ref in secret_refs(spec):
            if ref.purpose != "bmc":
                continue
            value = await self._value(name, ref)
            if isinstance(value, Refusal):
                return value
            if ref.role == "username" and not value.get_secret_value().strip():
                return self._unusable(name, ref)
            if ref.role == "caBundle" and not _usable_ca_bundle(value.get_secret_value()):
                return self._unusable(name, ref)
            values[ref.role] = value
        ca_bundle = values.get("caBundle")
        return BmcCredentials(
            endpoint=bmc.endpoint,
            username=values["username"].get_secret_value().strip(),
            password=values["password"],
            ca_bundle_pem=ca_bundle.get_secret_value() if ca_bundle is not None else None,
            system_id=bmc.system_id,
            use_sessions=bmc.use_sessions,
        )

    async def ssh(self, name: str, spec: WorkerNodeSpec) -> SshCredentials | Refusal:
        """A side node's SSH login: admitted address, key, and its known host keys."""
        endpoint = self._ssh_address(spec)
        if isinstance(endpoint, Refusal):
            return endpoint
        ssh = spec.ssh
        if ssh.known_hosts_secret_ref is None:
            return Refusal(
                "CredentialsMissing",
                "spec.ssh.knownHostsSecretRef",
                "spec.ssh.knownHostsSecretRef: required for a side node (its host key is "
                "never trusted on first use); name a Secret holding its known_hosts line",
            )
        client_key = self.operator_key
        known: KnownHostKeys | None = None
        for ref in secret_refs(spec):
            if ref.purpose != "ssh":
                continue
            value = await self._value(name, ref)
            if isinstance(value, Refusal):
                return value
            if ref.role == "privateKey":
                try:
                    client_key = SshClientKey(value)
                except InvalidClientKey:
                    return self._unusable(name, ref)
            else:
                try:
                    known = KnownHostKeys(value.get_secret_value())
                except ValueError:
                    return self._unusable(name, ref)
        if client_key is None:
            return Refusal(
                "CredentialsMissing",
                "spec.ssh.privateKeySecretRef",
                "spec.ssh.privateKeySecretRef: no SSH key for this node; name a designated "
                "Secret, or configure the operator's key (dispatch.ssh_private_key_secret)",
            )
        assert known is not None
        if known.trusted_for(endpoint.host, endpoint.port).empty:
            return Refusal(
                "CredentialsInvalid",
                "spec.ssh.knownHostsSecretRef",
                f"spec.ssh.knownHostsSecretRef: no host key listed for {endpoint} "
                "(write the line as 'HOST KEY', or '[HOST]:PORT KEY' for a port other than 22)",
            )
        return SshCredentials(endpoint.host, endpoint.port, ssh.user, client_key, known)

    def ssh_for_instance(
        self, name: str, host: str, port: int, user: str
    ) -> SshCredentials | Refusal:
        """A cloud VM's login: the operator's key, to the address the cloud reported for
        nodewarden's own instance (admitted by that; host keys by the instance secret)."""
        if self.operator_key is None:
            return Refusal(
                "CredentialsMissing",
                "dispatch.ssh_private_key_secret",
                "operator config dispatch.ssh_private_key_secret: no SSH key for cloud VMs",
            )
        return SshCredentials(host, port, user, self.operator_key, None)

    async def wol(self, name: str, spec: WorkerNodeSpec) -> WolCredentials | Refusal:
        """Where node `name`'s magic packet may go, with its SecureOn password if any."""
        wake = spec.wake_on_lan
        if wake is None:
            return Refusal(
                "CredentialsMissing", "spec.wakeOnLan", "spec.wakeOnLan: the node has no target"
            )
        target = self._wol_target(spec)
        if isinstance(target, Refusal):
            return target
        secure_on: SecretBytes | None = None
        for ref in secret_refs(spec):
            if ref.purpose != "wol":
                continue
            value = await self._value(name, ref)
            if isinstance(value, Refusal):
                return value
            try:
                secure_on = parse_secure_on(value.get_secret_value())
            except InvalidSecureOn:
                return self._unusable(name, ref)
        return WolCredentials(str(wake.mac), target.host, target.port, secure_on)

    # -- validation -----------------------------------------------------------------------

    async def check(self, name: str, spec: WorkerNodeSpec) -> list[Refusal]:
        """Every refusal the node's spec earns (for its Valid condition), reading only
        designated Secrets and sending nothing."""
        out: list[Refusal] = []
        for ref in secret_refs(spec):
            value = await self._value(name, ref)
            if isinstance(value, Refusal):
                out.append(value)
        if spec.bmc is not None:
            refused = self._bmc_endpoint_refusal(spec)
            if refused is not None:
                out.append(refused)
        if spec.wake_on_lan is not None:
            target = self._wol_target(spec)
            if isinstance(target, Refusal):
                out.append(target)
        if spec.node_type == "SideNode":
            seen = {r.field for r in out}
            for use in (self.ssh(name, spec), self.bmc(name, spec) if spec.bmc else None):
                if use is None:
                    continue
                result = await use
                if isinstance(result, Refusal) and result.field not in seen:
                    out.append(result)
                    seen.add(result.field)
        return out


def _view(record: SecretRecord | None) -> SecretView | None:
    if record is None:
        return None
    return SecretView(record.name, record.labels, frozenset(record.values), record.annotations)


def _register_values(record: SecretRecord) -> None:
    """Register every value of a Secret just read for redaction, except those of the
    public roles (CA bundle, known_hosts) when the Secret is designated."""
    view = _view(record)
    assert view is not None
    for key, value in record.values.items():
        if view.role_of(key) in PUBLIC_ROLES:
            continue
        register_secret(value.get_secret_value())


def _usable_ca_bundle(pem: str) -> bool:
    """Whether the PEM holds a certificate a TLS client can trust (contexts are cached per
    bundle by the Redfish transport, so this costs a look-up after the first use)."""
    try:
        build_ssl_context(pem)
    except ValueError:
        return False
    return True
