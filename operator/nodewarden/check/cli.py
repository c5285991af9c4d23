"""`nodewarden check`: the command line, the report on stdout, the exit code.

    nodewarden check [--kubeconfig F] [-n NS] [--config FILE] [-o table|json]
                     [--as-serviceaccount NAME] [--live --operator-url URL] [--timeout S]

Prints one line per check (✓ pass, ! warning, ✗ failed, with the fix in the line) and a
summary; on failure the summary also goes to stderr. Exit 0: everything passed or only
warned; 1: a check failed; 2: the checks could not run (no usable kubeconfig, the API
server did not answer, or a bad command line).
"""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path
from typing import TextIO

from nodewarden.check.result import EXIT_COULD_NOT_RUN, EXIT_OK, summary
from nodewarden.cliargs import Parser, UsageError, dns_label, positive_seconds


def _parser() -> Parser:
    p = Parser(
        prog="nodewarden check",
        description="Check an installation: cluster, CRDs, RBAC, config, cloud, nodes, lease.",
    )
    p.add_argument("--kubeconfig", type=Path, help="kubeconfig; default in-cluster or $KUBECONFIG")
    p.add_argument("-n", "--namespace", type=dns_label("--namespace"), help="operator namespace")
    p.add_argument("--config", type=Path, help="the operator's config file (its ConfigMap)")
    p.add_argument("-o", "--output", choices=("table", "json"), default="table")
    p.add_argument(
        "--as-serviceaccount",
        metavar="NAME",
        type=dns_label("--as-serviceaccount"),
        help="check the permissions of this ServiceAccount (default: the current user)",
    )
    p.add_argument("--live", action="store_true", help="also ask the running operator")
    p.add_argument("--operator-url", metavar="URL", help="the operator's HTTP endpoint (--live)")
    p.add_argument(
        "--timeout",
        type=positive_seconds("--timeout"),
        default=10.0,
        help="seconds per contact with a BMC, SSH endpoint, cloud or the operator (default 10)",
    )
    return p


def check_main(
    argv: list[str] | None = None, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    try:
        args = _parser().parse_args(argv)
        if args.operator_url and not args.operator_url.startswith(("http://", "https://")):
            raise UsageError(f"--operator-url: {args.operator_url!r} is not an http(s) URL")
        # imported after parsing: a bad command line is answered at once
        from nodewarden.check.kubeapi import clock_offset
        from nodewarden.check.render import render_json, render_table
        from nodewarden.check.runner import CheckOptions, run_checks

        clock_offset()
    except (UsageError, ValueError) as exc:
        err.write(f"nodewarden check: {exc}\n")
        return EXIT_COULD_NOT_RUN
    options = CheckOptions(
        kubeconfig=args.kubeconfig,
        namespace=args.namespace,
        config=args.config,
        output=args.output,
        live=args.live,
        operator_url=args.operator_url,
        service_account=args.as_serviceaccount,
        timeout=args.timeout,
    )
    # the report is the output; library logs (e.g. a refused Secret) stay quiet meanwhile
    logger = logging.getLogger("nodewarden")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        report = asyncio.run(run_checks(options))
    finally:
        logger.setLevel(level)
    out.write(render_json(report) if options.output == "json" else render_table(report))
    if report.exit_code != EXIT_OK:
        err.write(f"nodewarden check: {summary(report)}\n")
    return report.exit_code
