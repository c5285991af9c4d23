"""The `nodewarden` command: `run` the operator, `explain` a decision, generate `crds`.

nodewarden run [--config FILE] [--kubeconfig FILE] [--namespace NS] [--dispatcher-id ID]
nodewarden explain --scenario FILE [-o table|json|yaml]
nodewarden crds [DIR] [--check]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

from nodewarden import __version__


def _run(argv: list[str]) -> int:
    from nodewarden.config import ConfigError, load_config
    from nodewarden.service import run

    parser = argparse.ArgumentParser(prog="nodewarden run", description="run the operator")
    parser.add_argument("--config", type=Path, help="operator config YAML (Helm ConfigMap)")
    parser.add_argument("--kubeconfig", type=Path, help="kubeconfig; default in-cluster")
    parser.add_argument("--namespace", help="namespace to watch")
    parser.add_argument("--all-namespaces", action="store_true", default=None)
    parser.add_argument("--dispatcher-id", help="dispatcher identity (cloud tags, lease)")
    parser.add_argument("--http-port", type=int, help="port of /healthz /readyz /metrics")
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
        print(f"nodewarden: {exc}", file=sys.stderr)
        return 2
    if args.http_port is not None:
        config.http.port = args.http_port
    if args.http_host is not None:
        config.http.host = args.http_host
    if args.no_leader_election:
        config.leader_election.enabled = False
    profile = os.environ.get("NODEWARDEN_PROFILE")
    if profile:  # developer aid: write a cProfile of the whole run to this path
        import cProfile

        profiler = cProfile.Profile()
        try:
            return profiler.runcall(asyncio.run, run(config))
        finally:
            profiler.dump_stats(profile)
    return asyncio.run(run(config))


def _explain(argv: list[str]) -> int:
    import importlib

    explain = importlib.import_module("nodewarden.explain")
    return int(explain.main(argv))


def _crds(argv: list[str]) -> int:
    from nodewarden.api import crdgen

    return crdgen.main(argv)


def _simulate(argv: list[str]) -> int:
    from nodewarden.simulate.cli import simulate_main

    return simulate_main(argv)


def _trace(argv: list[str]) -> int:
    from nodewarden.simulate.cli import trace_main

    return trace_main(argv)


COMMANDS = {
    "run": _run,
    "explain": _explain,
    "crds": _crds,
    "simulate": _simulate,
    "trace": _trace,
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in {"-h", "--help", "help"}:
        print(__doc__)
        return 0 if argv else 2
    if argv[0] in {"--version", "version"}:
        print(f"nodewarden {__version__}")
        return 0
    command = COMMANDS.get(argv[0])
    if command is None:
        print(
            f"nodewarden: unknown command {argv[0]!r}; try: {', '.join(COMMANDS)}", file=sys.stderr
        )
        return 2
    return command(argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
