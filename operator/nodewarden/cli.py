"""The `nodewarden` command.

nodewarden run [--config FILE] [--kubeconfig FILE] [--namespace NS] [--dispatcher-id ID] ...
    run the operator
nodewarden check [--kubeconfig F] [-n NS] [--config FILE] [-o table|json]
                 [--as-serviceaccount NAME] [--live --operator-url URL]
    check an installation: one line per check (✓ / ! / ✗ with the fix); exit 0/1/2
nodewarden explain --scenario FILE [-o table|json|yaml]
    what the power core decides for a scenario, and why
nodewarden explain workernode NAME [-n NS] [--kubeconfig F] [--operator-url URL] [-o ...]
    why is this node (not) off: its facts, gate table, decision and records, live
nodewarden simulate --trace T --policy A.yaml [--policy B.yaml ...] [--fleet F] [-o table|json]
                    [--plot FILE.png] [--seed N]
    replay a workload trace against PowerPolicies, side by side with baselines and the
    oracle lower bound (cost, waits, power cycles)
nodewarden trace generate|export ...
    write a synthetic trace, or export one from a cluster
nodewarden crds [DIR] [--check]
    write (or check) the CRD files

Every command answers a mistake in its input with one line naming the input, and exit 2.
An unexpected error prints one line; NODEWARDEN_DEBUG=1 shows its traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import ipaddress
import os
import re
import socket
import sys
from collections.abc import Callable
from pathlib import Path

from nodewarden import __version__
from nodewarden.cliargs import Parser, UsageError, dns_label, port

EXIT_BAD_INPUT = 2
DEBUG_ENV = "NODEWARDEN_DEBUG"


def kubeconfig_precheck(path: Path | None) -> str | None:
    """Why the kubeconfig a command would use is unusable (one line), or None. Inside a
    cluster without --kubeconfig the service account is used, and nothing is checked."""
    from nodewarden.kube.kubeconfig import default_kubeconfig, kubeconfig_problem

    if path is None:
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            return None
        path = default_kubeconfig()
        if path is None:
            return None
        if not path.exists():
            return (
                f"no kubeconfig: not running in a cluster and {path} does not exist; "
                "pass --kubeconfig FILE or set KUBECONFIG"
            )
    return kubeconfig_problem(path)


_HOST_NAME = re.compile(r"^(?=.{1,253}$)([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.?)+$")


def listen_problem(host: str, port_number: int) -> str | None:
    """Why the HTTP endpoint cannot listen on host:port (bind and release once), or None.
    A value that is neither an IP address nor a host name is refused without a lookup."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if not _HOST_NAME.match(host):
            return f"--http-host {host!r}: not an IP address or host name (e.g. 0.0.0.0, ::)"
    try:
        infos = socket.getaddrinfo(host, port_number, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        return f"--http-host {host!r}: {exc.strerror}"
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            hint = (
                "; pick another with --http-port (0 = any free port)"
                if exc.errno == errno.EADDRINUSE
                else ""
            )
            return f"cannot listen on {host}:{port_number} (--http-host/--http-port): {exc.strerror}{hint}"
    return None


def _run(argv: list[str]) -> int:
    from nodewarden.config import ConfigError, load_config

    parser = Parser(prog="nodewarden run", description="run the operator")
    parser.add_argument("--config", type=Path, help="operator config YAML (Helm ConfigMap)")
    parser.add_argument("--kubeconfig", type=Path, help="kubeconfig; default in-cluster")
    parser.add_argument("--namespace", type=dns_label("--namespace"), help="namespace to watch")
    parser.add_argument("--all-namespaces", action="store_true", default=None)
    parser.add_argument("--dispatcher-id", help="dispatcher identity (cloud tags, lease)")
    parser.add_argument("--http-port", type=port, help="port of /healthz /readyz /metrics")
    parser.add_argument("--http-host", help="listen address of the HTTP endpoint")
    parser.add_argument("--log-format", choices=["json", "text"])
    parser.add_argument("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    parser.add_argument("--no-leader-election", action="store_true")
    parser.add_argument("--resync-interval", help="re-validation interval, e.g. 30s")
    args = parser.parse_args(argv)
    overrides: dict[str, object] = {
        "kubeconfig": args.kubeconfig,
        "namespace": args.namespace,
        "all_namespaces": args.all_namespaces,
        "dispatcher_id": args.dispatcher_id,
        "log_format": args.log_format,
        "log_level": args.log_level,
        "resync_interval": args.resync_interval,
    }
    try:
        config = load_config(args.config, overrides)
    except ConfigError as exc:
        print(f"nodewarden run: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.http_port is not None:
        config.http.port = args.http_port
    if args.http_host is not None:
        config.http.host = args.http_host
    if args.no_leader_election:
        config.leader_election.enabled = False
    problem = kubeconfig_precheck(config.kubeconfig) or listen_problem(
        config.http.host, config.http.port
    )
    if problem is not None:
        print(f"nodewarden run: {problem}", file=sys.stderr)
        return EXIT_BAD_INPUT
    from nodewarden.service import run  # the operator's imports: after the input is checked

    profile = os.environ.get("NODEWARDEN_PROFILE")
    if profile:  # developer aid: write a cProfile of the whole run to this path
        import cProfile

        profiler = cProfile.Profile()
        try:
            return profiler.runcall(asyncio.run, run(config))
        finally:
            profiler.dump_stats(profile)
    return asyncio.run(run(config))


def _check(argv: list[str]) -> int:
    from nodewarden.check.cli import check_main

    return check_main(argv)


def _explain(argv: list[str]) -> int:
    import importlib

    explain = importlib.import_module("nodewarden.explain")
    return int(explain.main(argv))


def _crds(argv: list[str]) -> int:
    from nodewarden.api import crdgen

    try:
        return crdgen.main(argv)
    except OSError as exc:
        where = f" {exc.filename}" if exc.filename else ""
        print(f"nodewarden crds: cannot write{where}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_BAD_INPUT


def _simulate(argv: list[str]) -> int:
    from nodewarden.simulate.cli import simulate_main

    return simulate_main(argv)


def _trace(argv: list[str]) -> int:
    from nodewarden.simulate.cli import trace_main

    if argv[:1] == ["export"]:
        # the cluster read reports every failure as exit 1; a bad kubeconfig is bad input
        peek = argparse.ArgumentParser(add_help=False)
        peek.add_argument("--kubeconfig", type=Path)
        known, _ = peek.parse_known_args(argv[1:])
        problem = kubeconfig_precheck(known.kubeconfig)
        if problem is not None:
            print(f"nodewarden trace: {problem}", file=sys.stderr)
            return EXIT_BAD_INPUT
    return trace_main(argv)


COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "run": _run,
    "check": _check,
    "explain": _explain,
    "crds": _crds,
    "simulate": _simulate,
    "trace": _trace,
}
CRASH_EXIT = {"check": 2}
"""Exit code of an unexpected error per command (default 1); check: "could not run"."""


def _call(name: str, argv: list[str]) -> int:
    """Run one command: input mistakes and unexpected errors become one line on stderr."""
    from nodewarden.kube.kubeconfig import KubeconfigError, one_line

    try:
        return COMMANDS[name](argv)
    except (UsageError, KubeconfigError) as exc:
        print(f"nodewarden {name}: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print(f"nodewarden {name}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if os.environ.get(DEBUG_ENV):
            raise
        print(
            f"nodewarden {name}: unexpected error: {type(exc).__name__}: "
            f"{one_line(str(exc))[:300]} (run with {DEBUG_ENV}=1 for the traceback)",
            file=sys.stderr,
        )
        return CRASH_EXIT.get(name, 1)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in {"-h", "--help", "help"}:
        print(__doc__)
        return 0 if argv else EXIT_BAD_INPUT
    if argv[0] in {"--version", "version"}:
        print(f"nodewarden {__version__}")
        return 0
    if argv[0] not in COMMANDS:
        print(
            f"nodewarden: unknown command {argv[0]!r}; try: {', '.join(COMMANDS)}", file=sys.stderr
        )
        return EXIT_BAD_INPUT
    return _call(argv[0], argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
