"""`nodewarden simulate` and `nodewarden trace`: the thin shell around the simulator.

    nodewarden simulate --trace T --policy A.yaml [--policy B.yaml ...] [--fleet F.yaml]
                        [-o table|json] [--plot FILE.png] [--seed N] [--peers] [--prophet]
                        [--train-days D]
    nodewarden trace generate [--preset NAME] [--seed N] [--days D] [--scale F] -o FILE
    nodewarden trace export [--kubeconfig F] [-n NS] [--since 7d|RFC3339] -o FILE

Traces are files (CSV or JSONL by extension, or --trace-format) or `builtin:PRESET`
(generated from --seed); policies are PowerPolicy YAML files (object or spec) or
`builtin:default` (the built-in PowerPolicy defaults); the fleet defaults to the
built-in one (examples/simulate/fleet.yaml). This module is the only I/O of the
simulator: it reads the files, runs the pure core, and prints or writes the result.

Exit codes: 0 done; 2 bad input (the message names the file, line or field; nothing is
printed as a result); 1 the simulation or the cluster read failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

import yaml

from nodewarden.api.powerpolicy import PowerPolicySpec
from nodewarden.simulate.errors import InputError
from nodewarden.simulate.fleet import Fleet, load_fleet
from nodewarden.simulate.generate import PRESETS, generate
from nodewarden.simulate.policies import SimPolicy, load_policy, policy_from_spec
from nodewarden.simulate.presets import builtin_fleet
from nodewarden.simulate.results import SimulationError
from nodewarden.simulate.trace import Trace, TraceFormat, dump_trace, parse_trace
from nodewarden.units import parse_duration

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2
BUILTIN = "builtin:"


class _Usage(InputError):
    pass


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, so usage errors are exit 2 with one line."""

    def error(self, message: str) -> Any:
        raise _Usage(message)


def _format_of(path: str, explicit: str | None) -> TraceFormat:
    if explicit in ("csv", "jsonl"):
        return explicit  # type: ignore[return-value]
    if path.endswith((".jsonl", ".json", ".ndjson")):
        return "jsonl"
    return "csv"


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None


def _yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(_read(path))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise InputError(f"{path}:{where} not valid YAML/JSON") from None


def load_trace_arg(value: str, seed: int, fmt: str | None = None) -> Trace:
    if value.startswith(BUILTIN):
        name = value[len(BUILTIN) :]
        if name not in PRESETS:
            raise InputError(f"--trace: unknown preset {name!r}; presets: {', '.join(PRESETS)}")
        return generate(PRESETS[name], seed)
    path = Path(value)
    return parse_trace(_read(path), _format_of(value, fmt), name=str(path))


def load_policy_arg(value: str) -> SimPolicy:
    if value == f"{BUILTIN}default":
        return policy_from_spec(PowerPolicySpec(), "default")
    path = Path(value)
    try:
        return load_policy(_yaml(path), fallback_name=path.stem)
    except InputError as exc:
        if str(exc).startswith(str(path)):
            raise
        raise InputError(f"{path}: {exc}") from None


def load_fleet_arg(value: str | None) -> Fleet:
    if value is None or value == f"{BUILTIN}fleet":
        return builtin_fleet()
    path = Path(value)
    try:
        return load_fleet(_yaml(path))
    except InputError as exc:
        if str(exc).startswith(str(path)):
            raise
        raise InputError(f"{path}: {exc}") from None


def _unique_names(policies: list[SimPolicy], sources: list[str]) -> list[SimPolicy]:
    """Policies sharing a name are told apart by their file."""
    names = [p.name for p in policies]
    out = []
    for policy, source in zip(policies, sources, strict=True):
        if names.count(policy.name) > 1:
            policy = policy_from_spec(
                policy.spec, f"{policy.name} ({source})", policy.view.version.generation
            )
        out.append(policy)
    return out


# -- simulate ---------------------------------------------------------------------------


def _simulate_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="nodewarden simulate", description="Replay a trace against PowerPolicies.")
    p.add_argument("--trace", required=True, help="trace file (.csv/.jsonl) or builtin:PRESET")
    p.add_argument("--trace-format", choices=("csv", "jsonl"), help="override the extension")
    p.add_argument(
        "--policy",
        action="append",
        required=True,
        metavar="FILE",
        help="PowerPolicy YAML (object or spec), or builtin:default; repeat to compare",
    )
    p.add_argument("--fleet", metavar="FILE", help="fleet YAML (default: the built-in fleet)")
    p.add_argument("-o", "--output", choices=("table", "json"), default="table")
    p.add_argument("--plot", metavar="FILE.png", help="write nodes-on / queue-length plot")
    p.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    p.add_argument(
        "--peers",
        action="store_true",
        help="add a row per peer (Arvados, Karpenter, cluster-autoscaler, SLURM) at its defaults",
    )
    p.add_argument(
        "--prophet",
        action="store_true",
        help="add the prophet of every row: its placement with clairvoyant power",
    )
    p.add_argument(
        "--train-days",
        type=float,
        metavar="D",
        help=(
            "train every policy's forecastWake on the trace's first D days and run every "
            "row on the days after them only (the forecast is never judged on its training)"
        ),
    )
    return p


def _train(
    trace: Trace, fleet: Fleet, policies: list[SimPolicy], days: float | None, err: TextIO
) -> tuple[Trace, list[SimPolicy], dict[str, Any] | None]:
    """The trace to judge on and the policies with their forecasts trained (`--train-days`)."""
    from dataclasses import replace

    from nodewarden.simulate.warmth import split_trace, train

    wanting = [p.name for p in policies if p.spec.forecast_wake.mode != "Off"]
    if days is None:
        for name in wanting:
            err.write(
                f"nodewarden simulate: note: policy {name}: forecastWake has no history without "
                "--train-days; it forecasts nothing\n"
            )
        return trace, policies, None
    if days <= 0 or days * 86_400_000_000 >= trace.end:
        raise InputError("--train-days: must be more than 0 and less than the trace's length")
    first, judged = split_trace(trace, days)
    catalogue, types = fleet.cloud.catalogue, fleet.cloud.instance_type_policy
    trained = [
        replace(p, forecast=train(first, p.spec, fleet, catalogue, types))
        if p.spec.forecast_wake.mode != "Off"
        else p
        for p in policies
    ]
    note = {
        "trainDays": days,
        "trainedOn": len(first.containers),
        "judgedOn": len(judged.containers),
        "judgedFrom": judged.start.isoformat(),
        "policies": wanting,
    }
    return judged, trained, note


def simulate_main(
    argv: list[str] | None = None, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    from nodewarden.simulate.peers import PEERS
    from nodewarden.simulate.plot import PlotUnavailable, write_plot
    from nodewarden.simulate.report import compare, comparison_document, render_table

    out, err = out or sys.stdout, err or sys.stderr
    try:
        args = _simulate_parser().parse_args(argv)
        trace = load_trace_arg(args.trace, args.seed, args.trace_format)
        policies = [load_policy_arg(v) for v in args.policy]
        policies = _unique_names(policies, args.policy)
        fleet = load_fleet_arg(args.fleet)
        trace, policies, training = _train(trace, fleet, policies, args.train_days, err)
        if args.plot:
            from nodewarden.simulate.plot import _pyplot

            _pyplot()
    except InputError as exc:
        err.write(f"nodewarden simulate: {exc}\n")
        return EXIT_BAD_INPUT
    except PlotUnavailable as exc:
        err.write(f"nodewarden simulate: {exc}\n")
        return EXIT_BAD_INPUT
    try:
        peers = [spec.build(spec.default) for spec in PEERS] if args.peers else []
        comparison = compare(trace, fleet, policies, args.seed, peers=peers, prophets=args.prophet)
    except SimulationError as exc:
        err.write(f"nodewarden simulate: simulation failed: {exc}\n")
        return EXIT_FAILED
    if args.plot:
        try:
            write_plot(comparison, Path(args.plot))
        except OSError as exc:
            err.write(f"nodewarden simulate: cannot write {args.plot}: {exc.strerror or exc}\n")
            return EXIT_FAILED
    if args.output == "json":
        doc = comparison_document(comparison)
        if training is not None:
            doc["forecastTraining"] = training
        out.write(json.dumps(doc, indent=2, sort_keys=False) + "\n")
    else:
        if training is not None:
            out.write(
                f"forecast trained on the first {training['trainDays']:g} days "
                f"({training['trainedOn']} containers); every row judged on the rest "
                f"({training['judgedOn']} containers from {training['judgedFrom']})\n\n"
            )
        out.write(render_table(comparison))
    return EXIT_OK


# -- trace ------------------------------------------------------------------------------


def _trace_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="nodewarden trace", description="Generate or export workload traces.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    gen = sub.add_parser("generate", help="write a seeded synthetic trace")
    gen.add_argument("--preset", default="bursty-week", choices=sorted(PRESETS))
    gen.add_argument("--seed", type=int, default=1)
    gen.add_argument("--days", type=float, help="length in days (default: the preset's)")
    gen.add_argument("--scale", type=float, help="multiply every arrival rate")
    gen.add_argument("-o", "--output", required=True, metavar="FILE", help="FILE or - (stdout)")
    gen.add_argument("--format", choices=("csv", "jsonl"))
    exp = sub.add_parser("export", help="write a trace from a cluster's ContainerDispatches")
    exp.add_argument("--kubeconfig", type=Path)
    exp.add_argument("-n", "--namespace", default="default")
    exp.add_argument(
        "--since", help="only containers created since: a duration (7d, 24h) or RFC 3339"
    )
    exp.add_argument("-o", "--output", required=True, metavar="FILE", help="FILE or - (stdout)")
    exp.add_argument("--format", choices=("csv", "jsonl"))
    return p


def _since(value: str | None, now: datetime) -> datetime | None:
    if value is None:
        return None
    text = value.strip()
    if text.endswith("d") and text[:-1].replace(".", "", 1).isdigit():
        text = f"{float(text[:-1]) * 24:g}h"
    try:
        return now - parse_duration(text)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise InputError(
            f"--since: {value!r} is neither a duration (7d, 24h, 90m) nor an RFC 3339 time"
        ) from None
    if parsed.tzinfo is None:
        raise InputError("--since: an RFC 3339 time needs a zone (e.g. a trailing Z)")
    return parsed


def _write(text: str, target: str, out: TextIO) -> None:
    if target == "-":
        out.write(text)
    else:
        Path(target).write_text(text, encoding="utf-8")


async def _list_dispatches(kubeconfig: Path | None, namespace: str) -> list[dict[str, Any]]:
    from nodewarden.api.kinds import CONTAINER_DISPATCH
    from nodewarden.kube.client import Kube, api_client_from

    kube = Kube(await api_client_from(kubeconfig))
    try:
        return await kube.list(CONTAINER_DISPATCH, namespace)
    finally:
        await kube.close()


def trace_main(
    argv: list[str] | None = None, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    try:
        args = _trace_parser().parse_args(argv)
    except InputError as exc:
        err.write(f"nodewarden trace: {exc}\n")
        return EXIT_BAD_INPUT
    if args.command == "generate":
        return _trace_generate(args, out, err)
    return _trace_export(args, out, err)


def _trace_generate(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    try:
        if (args.days is not None and args.days <= 0) or (
            args.scale is not None and args.scale <= 0
        ):
            raise InputError("--days and --scale must be greater than 0")
        trace = generate(PRESETS[args.preset].scaled(args.days, args.scale), args.seed)
        if not trace.containers:
            raise InputError("the generated trace is empty; raise --days or --scale")
    except InputError as exc:
        err.write(f"nodewarden trace: {exc}\n")
        return EXIT_BAD_INPUT
    try:
        _write(dump_trace(trace, _format_of(args.output, args.format)), args.output, out)
    except OSError as exc:
        err.write(f"nodewarden trace: cannot write {args.output}: {exc.strerror or exc}\n")
        return EXIT_FAILED
    if args.output != "-":
        err.write(f"wrote {len(trace.containers)} containers to {args.output}\n")
    return EXIT_OK


def _trace_export(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from nodewarden.simulate.export import trace_from_dispatches

    try:
        since = _since(args.since, datetime.now(UTC))
    except InputError as exc:
        err.write(f"nodewarden trace: {exc}\n")
        return EXIT_BAD_INPUT
    try:
        objects = asyncio.run(_list_dispatches(args.kubeconfig, args.namespace))
    except Exception as exc:  # the cluster read failed: say why, no traceback
        err.write(f"nodewarden trace export: cannot list ContainerDispatches: {exc}\n")
        return EXIT_FAILED
    trace, skipped = trace_from_dispatches(objects, since, name=f"{args.namespace} export")
    summary = ", ".join(f"{n} {why}" for why, n in sorted(skipped.items())) or "none"
    if trace is None:
        err.write(
            f"nodewarden trace export: no finished containers to export (skipped: {summary})\n"
        )
        return EXIT_FAILED
    try:
        _write(dump_trace(trace, _format_of(args.output, args.format)), args.output, out)
    except OSError as exc:
        err.write(f"nodewarden trace: cannot write {args.output}: {exc.strerror or exc}\n")
        return EXIT_FAILED
    err.write(f"wrote {len(trace.containers)} containers to {args.output} (skipped: {summary})\n")
    return EXIT_OK
