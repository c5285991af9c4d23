"""Who we are and whom we trust on SSH: the client key, the host-key trust policies, the target.

There is deliberately no "accept any host key" policy. A node's key is trusted either
because it is listed in known_hosts text (from a Secret), or on first use *after* the
node proved the per-instance secret from its user-data (`InstanceSecretTrust`).
Secret values live in pydantic SecretStr/SecretBytes and never appear in reprs.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass, field

import asyncssh
from pydantic import SecretBytes, SecretStr

from nodewarden.ssh.errors import InvalidClientKey
from nodewarden.ssh.protocol import DEFAULT_INSTANCE_SECRET_COMMAND


class SshClientKey:
    """The operator's SSH private key. repr/str show only the algorithm and fingerprint."""

    __slots__ = ("_key", "algorithm", "fingerprint", "public_key")

    def __init__(
        self, private_key: SecretStr | SecretBytes, passphrase: SecretStr | None = None
    ) -> None:
        raw = private_key.get_secret_value()
        try:
            key = asyncssh.import_private_key(
                raw, passphrase.get_secret_value() if passphrase else None
            )
        except (asyncssh.KeyImportError, ValueError, TypeError):
            # The library's message could quote the input; ours never does.
            raise InvalidClientKey(
                "the SSH private key could not be loaded (expected an unencrypted or "
                "correctly passphrased OpenSSH/PEM private key)"
            ) from None
        self._key = key
        self.algorithm = key.get_algorithm()
        self.fingerprint = key.get_fingerprint()
        self.public_key = key.export_public_key("openssh").decode().strip()

    @classmethod
    def generate(cls, algorithm: str = "ssh-ed25519") -> SshClientKey:
        """A fresh key (tests and demos)."""
        key = asyncssh.generate_private_key(algorithm)
        return cls(SecretBytes(key.export_private_key("openssh")))

    def export_private(self) -> SecretStr:
        """The private key in OpenSSH format, wrapped (for writing a Secret in demos)."""
        return SecretStr(self._key.export_private_key("openssh").decode())

    @property
    def asyncssh_key(self) -> asyncssh.SSHKey:
        return self._key

    def __repr__(self) -> str:
        return f"SshClientKey({self.algorithm} {self.fingerprint})"

    __str__ = __repr__


@dataclass(frozen=True, slots=True)
class TrustedKeys:
    """Keys that may sign for a host: plain host keys, CA keys (cert-authority), revoked keys."""

    host_keys: tuple[asyncssh.SSHKey, ...]
    ca_keys: tuple[asyncssh.SSHKey, ...] = ()
    revoked: tuple[asyncssh.SSHKey, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.host_keys and not self.ca_keys

    @property
    def fingerprints(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(k.get_fingerprint() for k in (*self.host_keys, *self.ca_keys)))


@dataclass(frozen=True, slots=True)
class KnownHostKeys:
    """Trust the keys listed for the node's host in known_hosts text (OpenSSH format).

    Lookup uses the node's *logical* host and port (as in the WorkerNode), not the endpoint
    a resolver maps it to, so a known_hosts Secret written for ``10.0.0.5`` keeps working
    when tests map that address to a loopback port.
    """

    known_hosts: str
    _parsed: asyncssh.SSHKnownHosts = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Messages never quote the text: the library's would (a line it cannot parse), and
        # the text comes from a Secret (docs/security.md, "no text derived from content").
        try:
            parsed = asyncssh.import_known_hosts(self.known_hosts)
        except (ValueError, asyncssh.KeyImportError):
            raise ValueError(
                "invalid known_hosts text: a line is not in OpenSSH known_hosts form"
            ) from None
        # asyncssh silently skips keys it cannot parse; a typo would then trust nothing
        # for that host without saying why, so insist on every key being readable.
        for number, line in enumerate(self.known_hosts.splitlines(), start=1):
            fields = line.split()
            if not fields or fields[0].startswith("#"):
                continue
            key_fields = fields[2:] if fields[0].startswith("@") else fields[1:]
            if key_fields and key_fields[0].startswith("x509v3-"):
                continue
            try:
                asyncssh.import_public_key(" ".join(key_fields[:2]))
            except (asyncssh.KeyImportError, ValueError):
                raise ValueError(
                    f"invalid known_hosts text: line {number} has no readable key"
                ) from None
        object.__setattr__(self, "_parsed", parsed)

    def trusted_for(self, host: str, port: int) -> TrustedKeys:
        try:
            addr = str(ipaddress.ip_address(host))
        except ValueError:
            addr = ""
        matched = self._parsed.match(host, addr, None if port == 22 else port)
        return TrustedKeys(_unique(matched[0]), _unique(matched[1]), _unique(matched[2]))

    @classmethod
    def for_key(cls, host: str, port: int, public_key: str) -> KnownHostKeys:
        """known_hosts text trusting one public key (``ssh-ed25519 AAAA...``) for host:port."""
        pattern = host if port == 22 else f"[{host}]:{port}"
        return cls(f"{pattern} {public_key.strip()}\n")


def _unique(keys: Iterable[asyncssh.SSHKey]) -> tuple[asyncssh.SSHKey, ...]:
    out: dict[bytes, asyncssh.SSHKey] = {}
    for key in keys:
        out.setdefault(key.public_data, key)
    return tuple(out.values())


@dataclass(frozen=True, slots=True)
class InstanceSecretTrust:
    """Trust on first use, but only after the node proves its per-instance secret.

    On the first connection the presented key is held provisionally, ``proof_command`` is
    run (nothing else), and its output must equal ``instance_secret``. Only then is the
    key trusted, pinned in memory and returned as `LearnedHostKey` for the caller to record.
    """

    instance_secret: SecretStr
    proof_command: str = DEFAULT_INSTANCE_SECRET_COMMAND

    def __post_init__(self) -> None:
        if len(self.instance_secret.get_secret_value()) < 16:
            raise ValueError("the per-instance secret must be at least 16 characters long")


HostKeyPolicy = KnownHostKeys | InstanceSecretTrust


@dataclass(frozen=True, slots=True)
class SshTarget:
    """One node to talk to: its name (keys the kept-alive connection), address, login, trust."""

    node: str
    host: str
    client_key: SshClientKey
    trust: HostKeyPolicy
    port: int = 22
    user: str = "root"

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"
