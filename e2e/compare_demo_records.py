#!/usr/bin/env python3
"""Compare the Safety Records `make demo` produces at two git revisions.

    .venv/bin/python e2e/compare_demo_records.py --before fea1317 --after HEAD
    .venv/bin/python e2e/compare_demo_records.py --run REV --out records.json
    .venv/bin/python e2e/compare_demo_records.py --before-json a.json --after-json b.json

For each revision: a temporary `git worktree` of it (detached), and its own e2e/demo.py
run as `make demo` runs it (the embedded demo configuration, the examples, the demo's
side nodes and containers), with this checkout's `.venv` but the revision's sources
(`PYTHONPATH=<tree>/operator`: the demo, the operator and the test doubles are all the
revision's; the demo talks to loopback only). The run ends when the demo's story is told
-- every container Complete, both demo side nodes switched Off again after running their
GPU container, no cloud VM left -- and no new decision was made for `--quiet` seconds
(or after `--timeout`, which fails the run).

Where the records come from: every time a node's decision changes, the power controller
emits a Kubernetes Event on its WorkerNode (reason `Power<Decision>`, message
`DECISION [codes]: <record.summary()>`) and appends the same record's headline to the
node's history (`GET /api/v1/explain/workernode/NAME`, which alone holds the step's
trigger `event`). Both come from one block of the controller, so they are one sequence:
the Events (they outlive a destroyed VM) are read at the end; the explain history is
polled during the run to add each record's `event` ("?" where the node was gone before
it was read). Each record is reduced to (node, step index, decision, reason codes in
order, event, state before -> after); decision times are dropped.

What is deterministic, and so compared (found by comparing runs of one revision: the
whole sequences differ run to run, this reduction did not):
- per node, the records that change its state (state before != after), each with its
  decision and reason codes in order. The records that do not change the state come and
  go with timing: a second READY_PROBE_FAILED when the first probe of a booting node
  was early, a BLOCK POWER_CONTROL_UNAVAILABLE before the Wake-on-LAN capability was
  discovered, DRAIN_INCOMPLETE skipped when the admission closed between two rounds, a
  NONE MIN_ON_NOT_MET that ends while the node is busy;
- the trigger `event` is printed (in parentheses) but not compared: which of the probe
  result, the BMC poll and the evaluate timer reaches a node first (DRAIN by Evaluate
  in one run, by PowerObserved in the next) is a race between independent loops;
- cloud VMs: their names are fresh instance ids, and which VM takes which container
  depends on the cloud's boot timing, so they are compared as a multiset of per-VM
  sequences; in them DEMAND_PRESENT on a NONE record (another container still queued
  when the VM took its first) is dropped: seen both ways in runs of one revision;
- a BLOCKED node's round trip to UNKNOWN and back to the same BLOCK is dropped: each
  ManualOverride or PolicyChanged handed to a BLOCKED node re-verifies it (BLOCKED ->
  UNKNOWN, then BLOCK again), and how many of them the first rounds batch varied from
  none to four for one example node (gpu-a100-01, ws-rtx-07) between runs;
- consecutive duplicate records (the same headline twice) are collapsed first.
`--strict` compares every record, its event included (expect differences).

Exit 0 when the two revisions' reduced records are equal, 1 when they differ (the per-node
sequences are printed side by side either way), 2 when a run failed.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from localcluster import REPO, kubectl_path
from nodewarden_doubles.ports import unused_loopback_port

NAMESPACE = "nodewarden"
DEMO_SIDE_NODES = ("demo-side-redfish", "demo-side-wol")
DECISION_REASONS = {
    "PowerShutdown",
    "PowerStart",
    "PowerDrain",
    "PowerDeferred",
    "PowerBlocked",
    "PowerNoAction",
}
CLOUD_VM = "CloudVM"
POLL = 0.5
LIST = 2.0


@dataclass
class Observed:
    """What the watcher saw of one demo run while the operator ran."""

    history: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    node_types: dict[str, str] = field(default_factory=dict)
    finished_at: float | None = None
    last_change: float = 0.0
    quiet_since: float | None = None


def git(*args: str, cwd: Path = REPO) -> str:
    out = subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True, timeout=120
    )
    return out.stdout.strip()


@contextlib.contextmanager
def worktree(rev: str, parent: Path) -> Iterator[tuple[Path, str]]:
    """A detached worktree of `rev` under `parent`, removed afterwards."""
    sha = git("rev-parse", "--verify", f"{rev}^{{commit}}")
    tree = parent / f"tree-{sha[:12]}"
    git("worktree", "add", "--detach", "--force", str(tree), sha)
    try:
        yield tree, sha
    finally:
        subprocess.run(
            ["git", "worktree", "remove", "--force", str(tree)],
            cwd=REPO,
            check=False,
            capture_output=True,
        )
        git("worktree", "prune")


class Kubectl:
    def __init__(self, kubeconfig: Path) -> None:
        self.base = [kubectl_path(), f"--kubeconfig={kubeconfig}", "-n", NAMESPACE]

    def json(self, *args: str) -> dict[str, Any] | None:
        out = subprocess.run(
            [*self.base, "get", *args, "-o", "json"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if out.returncode != 0:
            return None
        data: dict[str, Any] = json.loads(out.stdout)
        return data


def explain(port: int, token: str, node: str) -> dict[str, Any] | None:
    """The operator's live explain document of `node` (None: not served, not known)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request(
            "GET",
            f"/api/v1/explain/workernode/{node}",
            headers={"Authorization": f"Bearer {token}"},
        )
        response = conn.getresponse()
        body = response.read()
        if response.status != 200:
            return None
        data: dict[str, Any] = json.loads(body)
        return data
    except (OSError, ValueError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def merge_history(known: list[dict[str, Any]], fresh: Sequence[dict[str, Any]]) -> bool:
    """Append the entries of `fresh` (the node's bounded recent history) not yet known."""
    seen = {json.dumps(h, sort_keys=True) for h in known}
    added = False
    for entry in fresh:
        if json.dumps(entry, sort_keys=True) not in seen:
            known.append(dict(entry))
            added = True
    return added


def declared_nodes(tree: Path) -> set[str]:
    """The WorkerNodes the demo applies (examples/, e2e/demo/): names stable across runs."""
    names: set[str] = set()
    for path in [*(tree / "examples").glob("*.yaml"), *(tree / "e2e" / "demo").glob("*.yaml")]:
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "WorkerNode":
                names.add(doc["metadata"]["name"])
    return names


def story_told(
    wns: Sequence[dict[str, Any]],
    cds: Sequence[dict[str, Any]],
    pis: Sequence[dict[str, Any]],
    declared: set[str],
) -> bool:
    """Every container Complete (the GPU ones included), every demo side node Off after a
    Wake that succeeded, no cloud VM left but the declared ones."""
    containers = cds
    names = {c["metadata"]["name"] for c in containers}
    if not {"demo-gpu-l40s", "demo-gpu-a4000"} <= names:
        return False
    if any((c.get("status") or {}).get("phase") != "Complete" for c in containers):
        return False
    states = {
        w["metadata"]["name"]: ((w.get("status") or {}).get("state"), w["spec"].get("nodeType"))
        for w in wns
    }
    if any(kind == CLOUD_VM and n not in declared for n, (_, kind) in states.items()):
        return False
    woken = {
        (p.get("spec") or {}).get("nodeName")
        for p in pis
        if (p.get("spec") or {}).get("action") == "Wake"
        and (p.get("status") or {}).get("phase") == "Succeeded"
    }
    return all(states.get(n, (None, None))[0] == "Off" and n in woken for n in DEMO_SIDE_NODES)


def watch(
    demo: subprocess.Popen[bytes],
    state: Path,
    port: int,
    timeout: float,
    quiet: float,
    declared: set[str],
) -> Observed:
    """Poll the running demo until its story is told and it has been quiet for `quiet` s:
    every node's explain history each POLL seconds, the objects every LIST seconds (one
    kubectl call: a process start costs more CPU than the HTTP reads)."""
    seen = Observed()
    kubeconfig = state / "kubeconfig"
    deadline = time.monotonic() + timeout
    kube: Kubectl | None = None
    token: str | None = None
    seen.last_change = time.monotonic()
    next_list = 0.0
    while demo.poll() is None and time.monotonic() < deadline:
        time.sleep(POLL)
        if kube is None and kubeconfig.exists():
            kube = Kubectl(kubeconfig)
        if token is None:
            with contextlib.suppress(OSError):
                token = (state / "status-token").read_text().strip() or None
        if kube is None or token is None:
            continue
        for name in list(seen.node_types):
            doc = explain(port, token, name)
            if doc is not None and merge_history(
                seen.history.setdefault(name, []), doc.get("history") or []
            ):
                seen.last_change = time.monotonic()
        now = time.monotonic()
        if now < next_list:
            continue
        next_list = now + LIST
        listed = kube.json("workernodes,containerdispatches,powerintents")
        if listed is None:
            continue
        kinds: dict[str, list[dict[str, Any]]] = {}
        for item in listed.get("items", []):
            kinds.setdefault(item.get("kind", ""), []).append(item)
        wns = kinds.get("WorkerNode", [])
        for w in wns:
            seen.node_types.setdefault(w["metadata"]["name"], w["spec"].get("nodeType", "?"))
        if story_told(
            wns, kinds.get("ContainerDispatch", []), kinds.get("PowerIntent", []), declared
        ):
            if seen.finished_at is None:
                seen.finished_at = now
            if now - max(seen.last_change, seen.finished_at) >= quiet:
                seen.quiet_since = now
                return seen
    return seen


def parse_event(event: dict[str, Any]) -> dict[str, Any] | None:
    """(decision, reasons, before, after) from a decision Event's message, None otherwise."""
    if event.get("reason") not in DECISION_REASONS:
        return None
    if (event.get("involvedObject") or {}).get("kind") != "WorkerNode":
        return None
    message: str = event.get("message") or ""
    head, _, summary = message.partition(": ")
    decision, _, rest = head.partition(" [")
    codes = rest.split("]", 1)[0]
    parts = summary.split(" | ")
    before, _, after = (parts[1] if len(parts) > 1 else "").partition("->")
    return {
        "decision": decision,
        "reasons": [c for c in codes.split(",") if c],
        "before": before,
        "after": after,
    }


def sequences(
    events: Sequence[dict[str, Any]], seen: Observed, node_types: dict[str, str]
) -> dict[str, list[dict[str, Any]]]:
    """Per node: its decision records in order, with the trigger event from the history."""
    per_node: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for ev in events:
        parsed = parse_event(ev)
        if parsed is None:
            continue
        node = ev["involvedObject"]["name"]
        order = ev.get("eventTime") or ev.get("firstTimestamp") or ""
        rv = ev["metadata"].get("resourceVersion", "0")
        per_node.setdefault(node, []).append((order, rv.zfill(20), parsed))
    out: dict[str, list[dict[str, Any]]] = {}
    for node, rows in per_node.items():
        rows.sort(key=lambda r: (r[0], r[1]))
        history = list(seen.history.get(node, []))
        records: list[dict[str, Any]] = []
        for _, _, rec in rows:
            match = next(
                (
                    i
                    for i, h in enumerate(history)
                    if h.get("decision") == rec["decision"]
                    and list(h.get("reasons") or []) == rec["reasons"]
                    and h.get("stateBefore") == rec["before"]
                    and h.get("stateAfter") == rec["after"]
                ),
                None,
            )
            trigger = "?"
            if match is not None:
                trigger = str(history[match].get("event"))
                del history[: match + 1]
            records.append({**rec, "event": trigger})
        out[node] = records
    for node in out:
        node_types.setdefault(node, seen.node_types.get(node, "?"))
    return out


def collapse(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Consecutive duplicates (same decision, reasons, event, states) collapsed."""
    out: list[dict[str, Any]] = []
    for r in records:
        if not out or out[-1] != r:
            out.append(r)
    return out


def without_reverify_trips(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Drop each round trip BLOCKED -> UNKNOWN -> the same BLOCK record again: a BLOCKED
    node is re-verified on every ManualOverride / PolicyChanged it is handed, and how
    many of those a start-up round batches (0 to 4 per node, within 30 ms) varies run
    to run."""
    out: list[dict[str, Any]] = []
    for r in records:
        if (
            len(out) >= 2
            and out[-1]["before"] == "BLOCKED"
            and out[-1]["after"] == "UNKNOWN"
            and compared(out[-2], strict=False) == compared(r, strict=False)
        ):
            out.pop()
            continue
        out.append(r)
    return out


def compared(rec: dict[str, Any], strict: bool) -> dict[str, Any]:
    """The fields of a record that are compared (`event` only with --strict)."""
    return rec if strict else {k: v for k, v in rec.items() if k != "event"}


def without_queue_timing(rec: dict[str, Any]) -> dict[str, Any]:
    """A cloud VM's NONE record without DEMAND_PRESENT: whether another container was
    still queued when the VM took its first one depends on when the cloud's VMs came up
    (seen both ways in two runs of one revision); it decides nothing on a NONE."""
    if rec["decision"] != "NONE" or "DEMAND_PRESENT" not in rec["reasons"]:
        return rec
    return {**rec, "reasons": [r for r in rec["reasons"] if r != "DEMAND_PRESENT"]}


def reduce(raw: dict[str, Any], strict: bool = False) -> dict[str, Any]:
    """The deterministic part of a run's records (see the module docstring): per node,
    the records that change its state (all of them, collapsed, with --strict); cloud VMs
    as a sorted multiset of such sequences."""
    nodes: dict[str, list[dict[str, Any]]] = {}
    vms: list[list[dict[str, Any]]] = []
    for node, records in sorted(raw["records"].items()):
        seq = collapse(records)
        if not strict:
            seq = without_reverify_trips([r for r in seq if r["before"] != r["after"]])
        if raw["nodeTypes"].get(node) == CLOUD_VM and node not in raw["declared"]:
            if not strict:
                seq = [without_queue_timing(r) for r in seq]
            vms.append(seq)
        else:
            nodes[node] = seq
    vms.sort(key=lambda seq: json.dumps([compared(r, strict) for r in seq]))
    return {"nodes": nodes, "cloudVMs": vms}


def run_demo(rev: str, args: argparse.Namespace) -> dict[str, Any]:
    """Run the demo at `rev` and return its records (raw and reduced)."""
    python = Path(sys.executable)
    with (
        tempfile.TemporaryDirectory(prefix="nwcmp-") as tmp,
        worktree(rev, Path(tmp)) as (
            tree,
            sha,
        ),
    ):
        state = Path(tmp) / "state"
        port = unused_loopback_port()
        log = Path(args.log_dir or tmp) / f"demo-{sha[:12]}-{time.strftime('%H%M%S')}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                [str(tree / "operator"), *filter(None, [os.environ.get("PYTHONPATH")])]
            ),
        }
        print(f">> {rev} ({sha[:12]}): demo in {tree} (log {log})", file=sys.stderr, flush=True)
        started = time.monotonic()
        with log.open("wb") as out:
            demo = subprocess.Popen(
                [
                    str(python),
                    str(tree / "e2e" / "demo.py"),
                    f"--duration={args.timeout + 60:.0f}",
                    "--keep",
                    f"--state-dir={state}",
                    f"--http-port={port}",
                ],
                cwd=tree,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                seen = watch(demo, state, port, args.timeout, args.quiet, declared_nodes(tree))
            finally:
                if demo.poll() is None:
                    demo.send_signal(signal.SIGTERM)
                try:
                    demo.wait(timeout=90)
                except subprocess.TimeoutExpired:
                    os.killpg(demo.pid, signal.SIGKILL)
                    demo.wait()
        try:
            kube = Kubectl(state / "kubeconfig")
            events = (kube.json("events") or {}).get("items", [])
        finally:
            subprocess.run(
                [
                    str(python),
                    str(tree / "e2e" / "localcluster.py"),
                    "down",
                    f"--state-dir={state}",
                ],
                cwd=tree,
                env=env,
                check=False,
                capture_output=True,
                timeout=120,
            )
        node_types = dict(seen.node_types)
        records = sequences(events, seen, node_types)
        raw = {
            "revision": rev,
            "commit": sha,
            "storyTold": seen.quiet_since is not None,
            "seconds": round(time.monotonic() - started, 1),
            "nodeTypes": node_types,
            "declared": sorted(declared_nodes(tree)),
            "records": records,
        }
        if seen.quiet_since is None:
            tail = log.read_text(errors="replace").splitlines()[-30:]
            print("\n".join(tail), file=sys.stderr)
        return {**raw, "reduced": reduce(raw), "reducedStrict": reduce(raw, strict=True)}


def fmt(rec: dict[str, Any] | None) -> str:
    if rec is None:
        return ""
    reasons = ",".join(rec["reasons"])
    return f"{rec['before']}->{rec['after']} {rec['decision']} [{reasons}] ({rec['event']})"


def side_by_side(
    name: str, a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]], strict: bool
) -> bool:
    """Print one node's two sequences; True when their compared fields are equal."""
    ka = [compared(r, strict) for r in a]
    kb = [compared(r, strict) for r in b]
    same = ka == kb
    print(f"\n{name}: {'same' if same else 'DIFFERENT'} ({len(a)} | {len(b)} records)")
    width = max([len(fmt(r)) for r in a] + [10])
    for i in range(max(len(a), len(b))):
        left = fmt(a[i]) if i < len(a) else ""
        right = fmt(b[i]) if i < len(b) else ""
        mark = "  " if i < len(a) and i < len(b) and ka[i] == kb[i] else "!="
        print(f"  {i:3d} {left:<{width}} {mark} {right}")
    return same


def compare(before: dict[str, Any], after: dict[str, Any], strict: bool = False) -> bool:
    # reduced again: a saved run is reduced by this version of the rules
    a, b = reduce(before, strict), reduce(after, strict)
    print(
        f"before: {before['revision']} ({before['commit'][:12]}, {before['seconds']} s) | "
        f"after: {after['revision']} ({after['commit'][:12]}, {after['seconds']} s)"
    )
    if strict:
        print("every record compared, its trigger event included")
    else:
        print("compared: records that change the node's state; (event) shown, not compared")
    equal = True
    for node in sorted(set(a["nodes"]) | set(b["nodes"])):
        equal &= side_by_side(node, a["nodes"].get(node, []), b["nodes"].get(node, []), strict)
    # cloud VMs: a multiset of sequences, each distinct sequence once with its counts
    groups: dict[str, list[Any]] = {}
    for side, vms in ((0, a["cloudVMs"]), (1, b["cloudVMs"])):
        for seq in vms:
            key = json.dumps([compared(r, strict) for r in seq])
            groups.setdefault(key, [seq, 0, 0])[side + 1] += 1
    print(f"\ncloud VMs: {len(a['cloudVMs'])} | {len(b['cloudVMs'])}")
    for i, (seq, n_a, n_b) in enumerate(groups.values()):
        equal &= side_by_side(
            f"cloud VM sequence #{i + 1}, on {n_a} | {n_b} VMs",
            seq if n_a else [],
            seq if n_b else [],
            strict,
        )
        equal &= n_a == n_b
    print(f"\nrecords {'EQUAL' if equal else 'DIFFER'}")
    return equal


def load_or_run(rev: str | None, path: Path | None, args: argparse.Namespace) -> dict[str, Any]:
    if path is not None:
        data: dict[str, Any] = json.loads(path.read_text())
        return data
    assert rev is not None
    return run_demo(rev, args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--before", help="git revision")
    parser.add_argument("--after", help="git revision")
    parser.add_argument("--before-json", type=Path, help="records written by --out")
    parser.add_argument("--after-json", type=Path, help="records written by --out")
    parser.add_argument("--run", help="run the demo at this revision only (with --out)")
    parser.add_argument("--out", type=Path, help="write the records (JSON) here")
    parser.add_argument("--save-dir", type=Path, help="write each run's records here too")
    parser.add_argument("--log-dir", type=Path, help="keep the demo logs here")
    parser.add_argument("--timeout", type=float, default=420.0, help="seconds per demo run")
    parser.add_argument(
        "--quiet", type=float, default=15.0, help="seconds without a new decision at the end"
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        help="compare every record and its event (timing-dependent: differs run to run)",
    )
    args = parser.parse_args(argv)
    if args.run:
        result = run_demo(args.run, args)
        text = json.dumps(result, indent=2)
        if args.out:
            args.out.write_text(text + "\n")
        else:
            print(text)
        return 0 if result["storyTold"] else 2
    if not (args.before or args.before_json) or not (args.after or args.after_json):
        parser.error("give --before/--before-json and --after/--after-json (or --run)")
    runs = []
    for rev, path, tag in (
        (args.before, args.before_json, "before"),
        (args.after, args.after_json, "after"),
    ):
        result = load_or_run(rev, path, args)
        if args.save_dir is not None and path is None:
            args.save_dir.mkdir(parents=True, exist_ok=True)
            (args.save_dir / f"{tag}-{result['commit'][:12]}.json").write_text(
                json.dumps(result, indent=2) + "\n"
            )
        runs.append(result)
    equal = compare(runs[0], runs[1], args.strict)
    if not all(r["storyTold"] for r in runs):
        print("a demo run did not finish its story (see its log above)", file=sys.stderr)
        return 2
    return 0 if equal else 1


if __name__ == "__main__":
    raise SystemExit(main())
