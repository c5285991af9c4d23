"""`nodewarden explain`: ask the pure core "what would you decide, and why?" for a scenario.

    nodewarden explain --scenario FILE [-o table|json|yaml]
    python -m nodewarden.explain --scenario FILE -o json
    nodewarden explain workernode NAME [-n NS]     (live: see nodewarden.explain_live)

Reads a scenario (YAML or JSON; format in docs/scenarios.md, examples in
examples/scenarios/), evaluates or replays it with `nodewarden.policy` and prints the
decision, the gate table (gate, verdict, evidence, source, age), the event history
and the Safety Record. JSON and YAML output carry `decision` and `reasons` at the top
level.

Exit codes: 0 = printed; 1 = the file's `expect` block does not hold (the output says
which part); 2 = the file cannot be read or is invalid (the message names the field).
This module is the only I/O around the pure core: it reads one file and writes stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

import yaml

from nodewarden.cliargs import Parser, yaml_mistake
from nodewarden.policy.actions import describe
from nodewarden.policy.eligibility import judged, to_status
from nodewarden.policy.evaluation import Evaluation
from nodewarden.policy.scenario import ScenarioError, ScenarioResult, load_scenario, run_scenario

LIVE_KINDS = ("workernode", "workernodes", "wn")
"""`nodewarden explain workernode NAME`: the live form (nodewarden.explain_live)."""
EXIT_OK = 0
EXIT_EXPECTATION_FAILED = 1
EXIT_BAD_INPUT = 2


def _build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="nodewarden explain",
        description="Print the power decision, gate table and Safety Record for a scenario file.",
    )
    parser.add_argument("--scenario", required=True, metavar="FILE", help="scenario YAML/JSON file")
    parser.add_argument(
        "-o",
        "--output",
        choices=("table", "json", "yaml"),
        default="table",
        help="output format (default: table)",
    )
    return parser


def _age(now: datetime, at: datetime | None) -> str:
    if at is None:
        return "-"
    seconds = (now - at).total_seconds()
    if seconds < 0:
        return f"in {-seconds:g}s"
    if seconds < 120:
        return f"{seconds:g}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


def _gate_rows(evaluation: Evaluation, now: datetime) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for gate in evaluation.gates:
        rows.append(
            {
                "gate": gate.gate.value,
                "verdict": gate.verdict.value,
                "reasons": [r.value for r in gate.reasons],
                "evidence": [
                    {
                        "name": e.name,
                        "value": e.value,
                        "source": e.source,
                        "observedAt": e.at.isoformat() if e.at is not None else None,
                        "age": _age(now, e.at),
                    }
                    for e in gate.evidence
                ],
                "recheckAt": gate.recheck.isoformat() if gate.recheck is not None else None,
            }
        )
    return rows


def result_document(result: ScenarioResult) -> dict[str, Any]:
    """The JSON/YAML document: decision and reasons first, then everything else."""
    scenario = result.scenario
    evaluation = result.evaluation
    doc: dict[str, Any] = {
        "decision": result.decision.value,
        "reasons": [r.value for r in result.reasons],
        "node": scenario.facts.node,
        "state": result.state.state.value,
        "admission": result.state.admission.value,
        "policy": result.policy.version.model_dump(mode="json", by_alias=True),
        "now": scenario.now.isoformat(),
        "description": scenario.description,
        "gates": None,
        "history": [
            {
                "time": h.time.isoformat(),
                "event": h.event,
                "stateBefore": h.state_before.value,
                "stateAfter": h.state_after.value,
                "admission": h.admission.value,
                "decision": h.decision.value,
                "reasons": [r.value for r in h.reasons],
                "actions": [describe(a) for a in h.actions],
            }
            for h in result.history
        ],
        "eligibility": to_status(
            judged(result.decision, result.reasons, evaluation, result.policy)
        ),
        "safetyRecord": result.record.to_status(),
        "summary": result.record.summary(),
    }
    if evaluation is not None:
        doc["gates"] = {
            "kind": evaluation.kind,
            "decidedAt": result.record.decided_at.isoformat(),
            "rows": _gate_rows(evaluation, result.record.decided_at),
        }
    if scenario.expect is not None:
        doc["expectation"] = {
            "met": not result.expectation_failures,
            "failures": list(result.expectation_failures),
        }
    return doc


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _table(rows: list[list[str]], out: TextIO) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        out.write("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() + "\n")


def render_table(result: ScenarioResult, out: TextIO) -> None:
    scenario = result.scenario
    record = result.record
    if scenario.description:
        out.write(f"Scenario: {scenario.description.strip()}\n")
    out.write(f"Decision: {result.decision.value}")
    out.write(f"   reasons: {', '.join(r.value for r in result.reasons) or '-'}\n")
    out.write(
        f"Node: {scenario.facts.node} ({scenario.facts.node_type})   state {result.state.state.value}"
        f"   admission {result.state.admission.value}   policy {result.policy.version.label()}\n"
    )
    out.write(f"At: {record.decided_at.isoformat()}\n")
    evaluation = result.evaluation
    out.write("\n")
    if evaluation is None:
        out.write("Gates: not evaluated at the last step (the machine was waiting for evidence).\n")
    else:
        out.write(f"Gates ({evaluation.kind}):\n")
        rows = [["GATE", "VERDICT", "REASONS", "EVIDENCE", "SOURCE", "AGE"]]
        now = record.decided_at
        for gate in evaluation.gates:
            first = True
            for e in gate.evidence or ():
                rows.append(
                    [
                        gate.gate.value if first else "",
                        gate.verdict.value if first else "",
                        ",".join(r.value for r in gate.reasons) if first else "",
                        f"{e.name}={_cell(e.value)}",
                        e.source,
                        _age(now, e.at),
                    ]
                )
                first = False
            if first:
                rows.append(
                    [
                        gate.gate.value,
                        gate.verdict.value,
                        ",".join(r.value for r in gate.reasons),
                        "",
                        "",
                        "",
                    ]
                )
        _table(rows, out)
    if result.history:
        out.write("\nHistory:\n")
        rows = [["TIME", "EVENT", "STATE", "ADMISSION", "DECISION", "REASONS", "ACTIONS"]]
        for h in result.history:
            rows.append(
                [
                    h.time.isoformat(),
                    h.event,
                    f"{h.state_before.value}->{h.state_after.value}",
                    h.admission.value,
                    h.decision.value,
                    ",".join(r.value for r in h.reasons),
                    ", ".join(describe(a) for a in h.actions),
                ]
            )
        _table(rows, out)
    out.write("\nSafety Record:\n")
    out.write(f"  {record.summary()}\n")
    dumped = yaml.safe_dump(record.to_status(), sort_keys=False, default_flow_style=False)
    out.write("".join(f"  {line}\n" for line in dumped.splitlines()))
    if scenario.expect is not None:
        if result.expectation_failures:
            out.write("\nExpectation NOT met:\n")
            for failure in result.expectation_failures:
                out.write(f"  {failure}\n")
        else:
            out.write("\nExpectation met.\n")


def main(
    argv: list[str] | None = None, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """Entry point of `nodewarden explain`; returns the exit code."""
    if argv and argv[0] in LIVE_KINDS:
        from nodewarden import explain_live

        return explain_live.main(argv[1:], out, err)
    out = out or sys.stdout
    err = err or sys.stderr
    args = _build_parser().parse_args(argv)
    path = Path(args.scenario)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        err.write(f"nodewarden explain: cannot read {path}: {exc.strerror or exc}\n")
        return EXIT_BAD_INPUT
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        err.write(f"nodewarden explain: {path}: {yaml_mistake(exc)}\n")
        return EXIT_BAD_INPUT
    try:
        scenario, policy = load_scenario(data)
        result = run_scenario(scenario, policy)
    except ScenarioError as exc:
        err.write(f"nodewarden explain: {path}: {exc}\n")
        return EXIT_BAD_INPUT
    if args.output == "table":
        render_table(result, out)
    else:
        doc = result_document(result)
        if args.output == "json":
            out.write(json.dumps(doc, indent=2) + "\n")
        else:
            out.write(yaml.safe_dump(doc, sort_keys=False))
    if result.expectation_failures:
        for failure in result.expectation_failures:
            err.write(f"nodewarden explain: {path}: {failure}\n")
        return EXIT_EXPECTATION_FAILED
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
