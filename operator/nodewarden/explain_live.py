"""`nodewarden explain workernode NAME`: why is this node (not) off -- from the live cluster.

    nodewarden explain workernode NAME [-n NS] [--kubeconfig FILE]
        [--operator-url URL] [--token-file FILE | --token-secret NAME[/KEY]] [-o table|json|yaml]

Two sources, printed together:

1. The cluster, through the kubeconfig (always): the WorkerNode's status (state, observed
   power, readiness, admission, the transition in progress, power control, conditions,
   last Safety Record), its PowerIntents (newest first, each with phase, decision and
   reasons; the newest with its whole Safety Record) and its recent Events.
2. The power controller's live view, from the leading operator's status API
   (`GET /api/v1/explain/workernode/NAME`, the status token): every fact it holds with
   source and age, the decision the core makes on them *now* with its gate table, and
   its recent decisions. The URL is `--operator-url`, else the one the leader publishes
   on its Lease (reachable from inside the cluster; from elsewhere use
   `kubectl port-forward` and `--operator-url`). The token comes from `--token-file`,
   $NODEWARDEN_STATUS_TOKEN, or the Secret `--token-secret` (default
   `nodewarden-status/token`). Without them the cluster part is printed and a line says
   why the live part is missing.

Exit codes: 0 = printed; 2 = bad input (no such WorkerNode, unreadable kubeconfig or
token file). The token is never printed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

import aiohttp
import yaml
from kubernetes_asyncio.client.exceptions import ApiException
from pydantic import SecretStr

from nodewarden.api.kinds import POWER_INTENT, WORKER_NODE
from nodewarden.cliargs import Parser
from nodewarden.endpoints import STATUS_URL_ANNOTATION
from nodewarden.kube.client import Kube, KubeError, api_client_from
from nodewarden.kube.kubeconfig import context_namespace, default_kubeconfig

EXIT_OK = 0
EXIT_BAD_INPUT = 2
TOKEN_ENV = "NODEWARDEN_STATUS_TOKEN"
LIVE_TIMEOUT = 10.0
INTENTS_SHOWN = 5
EVENTS_SHOWN = 10


class ExplainError(Exception):
    """A mistake of the caller's: one line, exit 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="nodewarden explain workernode",
        description="Why is this WorkerNode (not) off: its facts, gate table, decision "
        "and last records, from the live cluster and the leading operator.",
    )
    parser.add_argument("name", help="WorkerNode name")
    parser.add_argument("-n", "--namespace", default=None, help="namespace (default: kubeconfig's)")
    parser.add_argument("--kubeconfig", type=Path, default=None, help="kubeconfig file")
    parser.add_argument(
        "--operator-url",
        default=None,
        help="the operator's status API, e.g. http://127.0.0.1:8080 after kubectl port-forward",
    )
    token = parser.add_mutually_exclusive_group()
    token.add_argument("--token-file", type=Path, default=None, help="file holding the token")
    token.add_argument(
        "--token-secret",
        default="nodewarden-status/token",
        help="Secret NAME[/KEY] holding the status token (default: nodewarden-status/token)",
    )
    parser.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table")
    return parser


# -- gathering ---------------------------------------------------------------------------


def _time(text: Any) -> datetime | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def _intent_row(body: Mapping[str, Any]) -> dict[str, Any]:
    spec = body.get("spec") or {}
    status = body.get("status") or {}
    return {
        "name": body["metadata"]["name"],
        "action": spec.get("action"),
        "source": spec.get("source"),
        "requestedBy": spec.get("requestedBy"),
        "created": body["metadata"].get("creationTimestamp"),
        "phase": status.get("phase"),
        "decision": status.get("decision"),
        "reasons": status.get("reasons") or [],
        "message": status.get("message"),
    }


async def _token(kube: Kube, namespace: str, args: argparse.Namespace) -> SecretStr | None:
    if args.token_file is not None:
        try:
            text = args.token_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ExplainError(f"--token-file {args.token_file}: {exc.strerror or exc}") from None
        return SecretStr(text)
    if os.environ.get(TOKEN_ENV):
        return SecretStr(os.environ[TOKEN_ENV].strip())
    name, _, key = str(args.token_secret).partition("/")
    try:
        return await kube.read_secret(namespace, name, key or "token")
    except KubeError:
        return None


async def _leader_url(kube: Kube, namespace: str) -> str | None:
    try:
        leases = await kube.coordination.list_namespaced_lease(namespace)
    except ApiException:
        return None
    for lease in leases.items:
        annotations = lease.metadata.annotations or {}
        url = annotations.get(STATUS_URL_ANNOTATION)
        if url and lease.spec is not None and lease.spec.holder_identity:
            return str(url)
    return None


async def _live(url: str, token: SecretStr, name: str) -> dict[str, Any]:
    timeout = aiohttp.ClientTimeout(total=LIVE_TIMEOUT)
    headers = {"Authorization": f"Bearer {token.get_secret_value()}"}
    target = f"{url.rstrip('/')}/api/v1/explain/workernode/{name}"
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.get(target, headers=headers) as answer,
    ):
        body = await answer.json(content_type=None)
        if answer.status != 200:
            message = body.get("error") if isinstance(body, dict) else None
            raise ExplainError(f"HTTP {answer.status}: {message or 'no reason given'}")
        if not isinstance(body, dict):
            raise ExplainError("the operator answered something other than a JSON object")
        return body


async def gather(args: argparse.Namespace) -> dict[str, Any]:
    """The whole explain document (cluster part always; live part when reachable)."""
    api = await api_client_from(args.kubeconfig)  # KubeconfigError: one line, exit 2
    kube = Kube(api)
    try:
        config_path = args.kubeconfig or default_kubeconfig()
        namespace = (
            args.namespace or (context_namespace(config_path) if config_path else None) or "default"
        )
        try:
            node = await kube.get(WORKER_NODE, namespace, args.name)
        except KubeError as exc:
            raise ExplainError(f"cannot read WorkerNode {args.name!r}: {exc}") from None
        if node is None:
            raise ExplainError(
                f"WorkerNode {args.name!r} not found in namespace {namespace!r} "
                "(kubectl get wn -A lists them)"
            )
        doc: dict[str, Any] = {
            "node": args.name,
            "namespace": namespace,
            "now": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
            "spec": node.get("spec") or {},
            "status": node.get("status") or {},
        }
        intents = [
            i
            for i in await kube.list(POWER_INTENT, namespace)
            if (i.get("spec") or {}).get("nodeName") == args.name
        ]
        intents.sort(key=lambda i: i["metadata"].get("creationTimestamp") or "", reverse=True)
        doc["intents"] = [_intent_row(i) for i in intents[:INTENTS_SHOWN]]
        doc["latestIntentRecord"] = (
            (intents[0].get("status") or {}).get("safetyRecord") if intents else None
        )
        doc["events"] = await _events(kube, namespace, args.name)
        doc["live"] = None
        url = args.operator_url or await _leader_url(kube, namespace)
        token = await _token(kube, namespace, args)
        if url is None:
            doc["liveError"] = (
                "no operator URL: pass --operator-url (e.g. after `kubectl -n "
                f"{namespace} port-forward svc/<release>-nodewarden 8080:8080`)"
            )
        elif token is None:
            doc["liveError"] = (
                f"no status token: the Secret {args.token_secret!r} cannot be read; pass "
                f"--token-file or set ${TOKEN_ENV}"
            )
        else:
            try:
                doc["live"] = await _live(url, token, args.name)
            except ExplainError as exc:
                doc["liveError"] = f"{url}: {exc}"
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                doc["liveError"] = (
                    f"{url} did not answer ({type(exc).__name__}); from outside the cluster "
                    "use kubectl port-forward and --operator-url"
                )
        return doc
    finally:
        await kube.close()


async def _events(kube: Kube, namespace: str, name: str) -> list[dict[str, Any]]:
    try:
        result = await kube.core.list_namespaced_event(
            namespace,
            field_selector=f"involvedObject.name={name},involvedObject.kind=WorkerNode",
        )
    except ApiException:
        return []
    rows: list[dict[str, Any]] = []
    for e in result.items:
        at = e.last_timestamp or e.event_time or e.first_timestamp
        rows.append(
            {
                "time": at.isoformat().replace("+00:00", "Z") if at is not None else None,
                "type": e.type,
                "reason": e.reason,
                "message": e.message,
                "count": e.count,
            }
        )
    rows.sort(key=lambda r: str(r["time"] or ""), reverse=True)
    return rows[:EVENTS_SHOWN]


# -- rendering ---------------------------------------------------------------------------


def _age(now: datetime, text: Any) -> str:
    at = _time(text)
    if at is None:
        return "-"
    seconds = (now - at).total_seconds()
    if seconds < 0:
        return f"in {-seconds:.0f}s"
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def _cell(value: Any) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value) or "-"
    return str(value)


def _table(rows: list[list[str]], out: TextIO, indent: str = "  ") -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        line = "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        out.write(indent + line + "\n")


def _gate_table(gates: list[dict[str, Any]], now: datetime, out: TextIO) -> None:
    rows = [["GATE", "VERDICT", "REASONS", "EVIDENCE", "SOURCE", "AGE"]]
    for gate in gates:
        evidence = gate.get("evidence") or [{}]
        for i, e in enumerate(evidence):
            rows.append(
                [
                    gate.get("gate", "") if i == 0 else "",
                    gate.get("verdict", "") if i == 0 else "",
                    _cell(gate.get("reasons")) if i == 0 else "",
                    f"{e['name']}={_cell(e.get('value'))}" if e else "",
                    _cell(e.get("source")) if e else "",
                    _age(now, e.get("at")) if e else "",
                ]
            )
    _table(rows, out)


def render_table(doc: Mapping[str, Any], out: TextIO) -> None:
    now = _time(doc["now"]) or datetime.now(UTC)
    st = doc["status"]
    spec = doc["spec"]
    out.write(
        f"WorkerNode {doc['namespace']}/{doc['node']} ({spec.get('nodeType', '?')}, "
        f"control {spec.get('controlMethod', '-')}, policy "
        f"{(spec.get('policyRef') or {}).get('name', 'default')})\n"
    )
    out.write(
        f"  state {_cell(st.get('state'))}   power {_cell(st.get('observedPower'))}"
        f" ({_cell(st.get('observedPowerSource'))}, {_age(now, st.get('observedPowerTime'))} ago)"
        f"   readiness {_cell(st.get('readiness'))}   admission {_cell(st.get('admission'))}\n"
    )
    transition = (st.get("powerState") or {}).get("transition")
    if transition:
        request = transition.get("request") or {}
        out.write(
            f"  transition {transition.get('kind')} {transition.get('id')} "
            f"(intent {transition.get('intent') or 'policy-made'}), request "
            f"{_cell(request.get('action'))} #{_cell(request.get('attempt'))} "
            f"{_cell(request.get('status'))}, deadline {_cell(transition.get('deadline'))}\n"
        )
    for cond in st.get("conditions") or []:
        out.write(
            f"  {cond['type']}={cond['status']} {cond.get('reason', '')}: "
            f"{cond.get('message', '')}\n"
        )
    last = st.get("lastSafetyRecord")
    if last:
        out.write(
            f"  last record ({_age(now, last.get('time'))} ago): {last.get('decision')} "
            f"[{_cell(last.get('reasons'))}] {last.get('summary', '')}\n"
        )
    live = doc.get("live")
    out.write("\n")
    if live is None:
        out.write(f"Live view: unavailable -- {doc.get('liveError', 'unknown reason')}\n")
    else:
        evaluation = live.get("evaluation")
        policy = live.get("policy") or {}
        out.write(
            f"Live view (power controller, policy {policy.get('name')}@"
            f"{policy.get('generation')}/{policy.get('contentHash')}"
            f"{'' if policy.get('valid', True) else ' INVALID'}"
            f"{' SHADOW' if policy.get('shadow') else ''}):\n"
        )
        if evaluation is None:
            out.write(f"  {live.get('note', 'no decision')}\n")
        else:
            out.write(
                f"  decision now: {evaluation['decision']} [{_cell(evaluation['reasons'])}]"
                f"   next look: {_cell(evaluation.get('recheckAt'))}\n"
            )
            held = live.get("eligibility") or {}
            out.write(
                f"  held by: {_cell(held.get('heldBy'))} until {_cell(held.get('heldUntil'))}"
                f"   eligible at: {_cell(held.get('eligibleAt'))}"
                f" (as status.eligibility)\n"
            )
            out.write(f"  {evaluation.get('summary', '')}\n\nGates:\n")
            _gate_table(evaluation.get("gates") or [], now, out)
            timing = evaluation.get("timing") or []
            if timing:
                out.write("\nTiming:\n")
                rows = [["NAME", "REQUIRED", "MEASURED", "MET", "WAIVED"]]
                for t in timing:
                    rows.append(
                        [
                            t.get("name", ""),
                            _cell(t.get("required")),
                            _cell(t.get("measured")),
                            _cell(t.get("met")),
                            _cell(t.get("waived")),
                        ]
                    )
                _table(rows, out)
        out.write("\nFacts:\n")
        rows = [["FACT", "SOURCE", "AGE", "VALUE"]]
        for name, fact in (live.get("facts") or {}).items():
            value = {
                k: v for k, v in fact.items() if k not in ("source", "observedAt", "ageSeconds")
            }
            rows.append(
                [
                    name,
                    _cell(fact.get("source")),
                    _age(now, fact.get("observedAt")),
                    json.dumps(value, separators=(",", ":"))[:120],
                ]
            )
        _table(rows, out)
        history = live.get("history") or []
        if history:
            out.write("\nRecent decisions:\n")
            rows = [["TIME", "EVENT", "STATE", "DECISION", "REASONS", "INTENT"]]
            for h in reversed(history):
                rows.append(
                    [
                        _cell(h.get("time")),
                        _cell(h.get("event")),
                        f"{h.get('stateBefore')}->{h.get('stateAfter')}",
                        _cell(h.get("decision")),
                        _cell(h.get("reasons")),
                        _cell(h.get("powerIntent")),
                    ]
                )
            _table(rows, out)
    intents = doc.get("intents") or []
    out.write("\nPowerIntents (newest first):\n")
    if not intents:
        out.write("  none\n")
    else:
        rows = [["NAME", "ACTION", "SOURCE", "PHASE", "DECISION", "REASONS", "AGE"]]
        for i in intents:
            rows.append(
                [
                    i["name"],
                    _cell(i["action"]),
                    _cell(i["source"]),
                    _cell(i["phase"]),
                    _cell(i["decision"]),
                    _cell(i["reasons"]),
                    _age(now, i["created"]),
                ]
            )
        _table(rows, out)
    events = doc.get("events") or []
    if events:
        out.write("\nEvents (newest first):\n")
        rows = [["AGE", "TYPE", "REASON", "MESSAGE"]]
        for e in events:
            rows.append(
                [
                    _age(now, e["time"]),
                    _cell(e["type"]),
                    _cell(e["reason"]),
                    _cell(e["message"])[:160],
                ]
            )
        _table(rows, out)


def main(
    argv: list[str] | None = None, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """Entry point of `nodewarden explain workernode`; returns the exit code."""
    out = out or sys.stdout
    err = err or sys.stderr
    args = build_parser().parse_args(argv)
    try:
        doc = asyncio.run(gather(args))
    except ExplainError as exc:
        err.write(f"nodewarden explain workernode: {exc}\n")
        return EXIT_BAD_INPUT
    if args.output == "table":
        render_table(doc, out)
    elif args.output == "json":
        out.write(json.dumps(doc, indent=2, default=str) + "\n")
    else:
        out.write(yaml.safe_dump(json.loads(json.dumps(doc, default=str)), sort_keys=False))
    if doc.get("live") is None:
        err.write(f"nodewarden explain workernode: live view unavailable: {doc['liveError']}\n")
    return EXIT_OK
