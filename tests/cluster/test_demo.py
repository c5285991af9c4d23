"""`make demo`: its side nodes really power-cycle, and Ctrl-C leaves nothing behind.

One run of e2e/demo.py (what `make demo` runs), watched from outside through the API, the
side nodes' own BMCs and the side-node process's admin API:

- each demo side node (demo-side-redfish behind sushy-tools, demo-side-wol switched off
  over SSH and woken by a magic packet) is drained and switched off, and its WorkerNode
  says Off only once its BMC itself answers PowerState Off;
- the GPU container that only that node can run (applied by the demo once the node is
  Off) wakes it and runs there exactly once, after the node was Ready;
- the Shutdown and Wake PowerIntents are Succeeded and carry their Safety Records (the
  request proof apart from the BMC's observation);
- the example side nodes on a lab network stay EndpointNotAdmitted, and no process of the
  demo looks up a name or sends a packet anywhere but loopback (every Python process
  records its lookups and outgoing addresses: tests/cluster/netprobe);
- before demo-side-redfish's first shutdown, `kubectl get pp` shows the policy in force
  (nodes on / off, budget left, window) and `kubectl describe wn demo-side-redfish` its
  eligibility time, which is when the shutdown began (the PowerIntent's startedAt, its
  first Safety Record) within one evaluation interval (issue 27);
- a lightly used m5.2xlarge whose container fits on another VM is drained for
  consolidation (a Drain PowerIntent, reason CONSOLIDATION_DRAIN, its Safety Record with
  utilisation, price and where the work could go); the container runs to its end there;
- SIGINT (Ctrl-C) -> exit 0, every recorded process gone, the demo's state removed.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import requests
from pydantic import SecretStr

from clusterkit import wait_for
from localcluster import REPO, LocalCluster, kubectl_path
from nodewarden_doubles.ports import unused_loopback_port
from nodewarden_doubles.sidenode.process import SideNodeAdmin
from nodewarden_doubles.sidenode.server import STATE_FILE, TOKEN_FILE

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

# side node -> (its GPU container, the request that switches it off, the one that wakes it)
SIDE = {
    "demo-side-redfish": ("demo-gpu-l40s", "GracefulShutdown", "On"),
    "demo-side-wol": ("demo-gpu-a4000", "SshPoweroff", "WakeOnLan"),
}
LAB = ("gpu-a100-01", "ws-rtx-07")
NETPROBE = Path(__file__).parent / "netprobe"
LOOPBACK = {"127.0.0.1", "::1", "localhost"}
# From the operator's start to both GPU containers Complete: ~85 s on an idle 2-core
# machine (idle threshold 30 s, min-off 10 s, sushy's 1-11 s reset delay, 20 s runs).
SEQUENCE_DEADLINE = 240
EVALUATE_INTERVAL = 3.0
"""Seconds: `power.evaluate_interval` in e2e/demo-config.yaml."""
KEPT = "zzzzz-dz642-democonsol00002"  # demo-consolidate-kept
Guard = Callable[[Callable[[], Any]], Callable[[], Any]]
"""Wraps a wait's predicate so that a demo that has exited fails the wait at once."""
WATCH_TEMPLATE = "jsonpath={.metadata.name}={.status.state}{'\\n'}"


def _pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


class Demo:
    """Read-only views of a running demo (kubectl as admin, the BMCs, the admin API)."""

    def __init__(self, state: Path, workdir: Path) -> None:
        self.state = state
        self.kubeconfig = state / "kubeconfig"
        self.ca_file = workdir / "bmc-ca.pem"
        self._bmc: tuple[str, str] | None = None

    def kubectl(self, *args: str) -> list[str]:
        return [kubectl_path(), f"--kubeconfig={self.kubeconfig}", "-n", "nodewarden", *args]

    def kubectl_json(self, *args: str) -> dict[str, Any]:
        out = subprocess.run(
            self.kubectl("get", *args, "-o", "json"),
            capture_output=True,
            text=True,
            check=False,
        )
        return json.loads(out.stdout) if out.returncode == 0 else {"items": []}

    def items(self, kind: str) -> dict[str, dict[str, Any]]:
        return {o["metadata"]["name"]: o for o in self.kubectl_json(kind)["items"]}

    def bmc_power(self, node: dict[str, Any]) -> str:
        """PowerState as the node's BMC itself answers it now (Basic auth, its CA)."""
        if self._bmc is None:
            login = self.kubectl_json("secret", "demo-side-bmc")["data"]
            ca = self.kubectl_json("secret", "demo-side-bmc-ca")["data"]["caBundle"]
            self.ca_file.write_bytes(base64.b64decode(ca))
            user, password = (base64.b64decode(login[k]).decode() for k in ("username", "password"))
            self._bmc = (user, password)
        bmc = node["spec"]["bmc"]
        assert bmc["endpoint"].startswith("https://127.0.0.1:")
        reply = requests.get(
            f"{bmc['endpoint']}/redfish/v1/Systems/{bmc['systemId']}",
            auth=self._bmc,
            verify=str(self.ca_file),
            timeout=10,
        )
        reply.raise_for_status()
        return str(reply.json()["PowerState"])

    def admin(self) -> SideNodeAdmin:
        state = self.state / "side-nodes" / "state"
        url = json.loads((state / STATE_FILE).read_text())["admin_url"]
        return SideNodeAdmin(url, SecretStr((state / TOKEN_FILE).read_text().strip()))


class OffWatch(threading.Thread):
    """Watches the WorkerNodes; the moment a side node's state first reads Off, asks its BMC.

    A watch, not a poll: the BMC is asked within moments of the state change, so a node
    recorded Off on the mere acceptance of its request (sushy applies a reset 1-11 s
    later; the Wake-on-LAN node powers off 2 s after `systemctl poweroff`) is caught.
    A `kubectl get --watch` that ends before it is stopped (the API server may close a
    watch) is started again: its first lines list every node's state as it is now, and
    a node stays Off at least minOff (10 s), far longer than a restart takes.
    """

    RESTARTS = 5

    def __init__(self, demo: Demo, nodes: dict[str, dict[str, Any]]) -> None:
        super().__init__(daemon=True)
        self.demo = demo
        self.nodes = nodes
        self.bmc_when_off: dict[str, str] = {}
        self.error: Exception | None = None
        self.ended: list[str] = []
        self._stopping = threading.Event()
        self.proc = self._watch()

    def _watch(self) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.demo.kubectl("get", "wn", "--watch", "-o", WATCH_TEMPLATE),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def run(self) -> None:
        try:
            while True:
                assert self.proc.stdout is not None and self.proc.stderr is not None
                for line in self.proc.stdout:
                    name, _, state = line.strip().partition("=")
                    if name in self.nodes and state == "Off" and name not in self.bmc_when_off:
                        self.bmc_when_off[name] = self.demo.bmc_power(self.nodes[name])
                code = self.proc.wait()
                if self._stopping.is_set():
                    return
                self.ended.append(f"exit {code}: {self.proc.stderr.read().strip()[-300:]}")
                if len(self.ended) > self.RESTARTS:
                    raise RuntimeError(f"kubectl get --watch kept ending: {self.ended}")
                self.proc = self._watch()
        except Exception as exc:  # handed to the waiting test (`done`)
            self.error = exc

    def done(self) -> bool:
        """Every side node seen Off; a watcher that failed fails the wait at once."""
        if self.error is not None:
            raise AssertionError(f"the Off watcher failed: {self.error!r}") from self.error
        return len(self.bmc_when_off) == len(self.nodes)

    def stop(self) -> None:
        self._stopping.set()
        self.proc.terminate()
        self.proc.wait(10)
        if self.ended:
            print(f"the Off watch was restarted {len(self.ended)} time(s): {self.ended}")


def _valid(node: dict[str, Any]) -> dict[str, Any]:
    conds = (node.get("status") or {}).get("conditions", [])
    return next((c for c in conds if c["type"] == "Valid"), {})


def _intent(intents: dict[str, dict[str, Any]], node: str, action: str) -> dict[str, Any]:
    found = [
        i
        for i in intents.values()
        if i["spec"]["nodeName"] == node
        and i["spec"]["action"] == action
        and (i.get("status") or {}).get("phase") == "Succeeded"
    ]
    assert found, f"no Succeeded {action} PowerIntent for {node}"
    return min(found, key=lambda i: i["metadata"]["creationTimestamp"])


def _check_records(node: str, uuid: str, shutdown: dict[str, Any], wake: dict[str, Any]) -> None:
    _, off_request, on_request = SIDE[node]
    off = shutdown["status"]["safetyRecord"]
    assert "POWER_OFF_CONFIRMED" in shutdown["status"]["reasons"]
    assert off["request"]["action"] == off_request and off["request"]["result"] == "Accepted"
    # the request proves acceptance only; the BMC's PowerState proves Off
    assert [e["name"] for e in off["proof"]["request"]] == ["requested", "result"]
    confirmation = off["confirmation"]
    assert confirmation["confirmed"] is True and confirmation["observed"] == "Off"
    assert confirmation["source"].startswith("redfish:https://127.0.0.1:")
    assert _time(confirmation["observedAt"]) > _time(off["request"]["resultAt"])
    assert off["policy"]["name"] == "demo-sidenodes"
    on = wake["status"]["safetyRecord"]
    assert {"POWER_ON_CONFIRMED", "READY_CONFIRMED"} <= set(wake["status"]["reasons"])
    assert wake["status"]["decision"] == "START"
    assert on["request"]["action"] == on_request
    assert on["readiness"] == "Ready" and on["readyProbe"]["passed"] is True
    assert on["confirmation"]["observed"] == "On"
    assert uuid in on["demand"]["containers"]  # woken for the container that only it fits
    # admission opened only after the observed On and the passing ready probe
    opened = _time(on["drain"]["admissionSince"])
    assert opened >= _time(on["confirmation"]["observedAt"])
    assert opened >= _time(on["readyProbe"]["observedAt"])


def _off_loopback(netlog: Path) -> list[dict[str, Any]]:
    """Recorded lookups / connects / sends whose target is not loopback (unix sockets are)."""
    out = []
    for line in netlog.read_text().splitlines():
        record = json.loads(line)
        target = record["target"]
        host = target[0] if isinstance(target, list) else target
        if not (isinstance(host, str) and (host in LOOPBACK or host.startswith("/"))):
            out.append(record)
    return out


def _check_energy(demo: Demo, alive: Guard) -> None:
    """`kubectl get pp` and `kubectl describe wn` show energy and money saved (docs/
    energy.md): demo-side-wol's fake BMC reports its draw, sushy-tools (demo-side-redfish)
    none -- "no reading", its time off still counted at the configured draws."""

    def shown() -> tuple[str, str, str] | None:
        pp = subprocess.run(
            demo.kubectl("get", "pp", "default"), capture_output=True, text=True, check=False
        ).stdout
        wol, redfish = (
            subprocess.run(
                demo.kubectl("describe", "wn", name), capture_output=True, text=True, check=False
            ).stdout
            for name in ("demo-side-wol", "demo-side-redfish")
        )
        header, _, row = pp.partition("\n")
        columns = dict(zip(header.split(), row.split(), strict=False))
        ready = (
            columns.get("KWH-SAVED-TODAY", "<none>") != "<none>"
            and "Saved Kwh:" in wol
            and "Integrated" in wol
            and "no reading" in redfish
        )
        return (pp, wol, redfish) if ready else None

    pp, wol, redfish = wait_for(alive(shown), timeout=90, interval=2, what="energy in pp and wn")
    print(pp, wol[wol.index("Energy:") :][:900], redfish[redfish.index("Energy:") :][:600])
    assert "Saved-Today".upper() in pp.upper()
    for field in ("Used Kwh:", "Idle Watts:", "Off Seconds:", "Saved Kwh:", "Money Saved:"):
        assert field in wol, field
    assert "Currency:" in wol and "Method:" in wol and "Integrated" in wol


KNOWN_WARNINGS = ("is invalid:", "requester admission:")
"""Warnings every demo run logs by design (the lab examples; no admission policy)."""


def _failure_report(text: str) -> str:
    """The demo's log cut to what explains a failure, smallest first: why the operator
    stopped (errors, warnings, tracebacks), what a forced exit found unfinished, the
    demo's own steps, then the last lines before any stack dump (a thread dump of a
    stuck stop is long and says less than the lines that led to it)."""
    lines = text.splitlines()
    dump = next((i for i, line in enumerate(lines) if line.startswith("Thread 0x")), len(lines))
    notable: list[str] = []
    for i, line in enumerate(lines[:dump]):
        if line.startswith("Traceback"):
            notable.extend(lines[i : i + 25])
        elif (" ERROR " in line or " WARNING " in line) and not any(
            k in line for k in KNOWN_WARNINGS
        ):
            notable.append(line[:400])
    tasks = next((i for i, line in enumerate(lines) if "unfinished task(s):" in line), None)
    steps = [line for line in lines if line.startswith((">>", "demo:"))]
    return "\n".join(
        [
            "--- the demo's log: errors and warnings ---",
            *notable[-60:],
            "--- unfinished tasks at a forced exit ---",
            *(lines[tasks : tasks + 22] if tasks is not None else ["(none: no forced exit)"]),
            "--- the demo's steps ---",
            *steps,
            "--- the last 30 lines before any stack dump ---",
            *lines[:dump][-30:],
        ]
    )


class Eligibility:
    """What `kubectl` showed of demo-side-redfish and its policy while it was last Idle."""

    def __init__(self) -> None:
        self.eligible_at: datetime | None = None
        self.describe = ""
        self.pp = ""
        self.wide = ""


def _columns(table: str) -> dict[str, str]:
    """The first row of `kubectl get` output by column (empty cells read as '')."""
    header, _, rest = table.partition("\n")
    row = rest.partition("\n")[0]
    starts = [i for i, c in enumerate(header) if c != " " and (i == 0 or header[i - 1] == " ")]
    ends = [*starts[1:], None]
    return {header[a:b].strip(): row[a:b].strip() for a, b in zip(starts, ends, strict=True)}


def _eligibility_before_shutdown(demo: Demo, alive: Guard) -> Eligibility:
    """Polls demo-side-redfish until it leaves Idle for its first shutdown; keeps the last
    `kubectl describe wn` / `kubectl get pp` that showed its eligibility time."""
    seen = Eligibility()

    def left_idle() -> bool:
        node = demo.kubectl_json("wn", "demo-side-redfish")
        status = node.get("status") or {}
        state = status.get("state")
        eligible = (status.get("eligibility") or {}).get("eligibleAt")
        if state == "Idle" and eligible:
            describe, pp, wide = (
                subprocess.run(demo.kubectl(*a), capture_output=True, text=True).stdout
                for a in (
                    ("describe", "wn", "demo-side-redfish"),
                    ("get", "pp", "demo-sidenodes"),
                    ("get", "wn", "demo-side-redfish", "-o", "wide"),
                )
            )
            idle = re.search(r"^ +State: +Idle$", describe, re.MULTILINE) is not None
            if _columns(wide).get("STATE") == "Idle" and idle:
                # all three read while it was still Idle (it may have moved in between)
                seen.eligible_at, seen.describe, seen.pp, seen.wide = (
                    _time(eligible),
                    describe,
                    pp,
                    wide,
                )
            return False
        return seen.eligible_at is not None and state not in ("Idle", "Active", "Unknown")

    wait_for(
        alive(left_idle), timeout=SEQUENCE_DEADLINE, interval=0.5, what="redfish node eligible"
    )
    return seen


def _check_eligibility(seen: Eligibility, shutdown: dict[str, Any]) -> None:
    """The policy in force and the node's eligibility, as shown before the shutdown, and
    the time against the shutdown's Safety Record."""
    print(seen.pp, seen.describe[seen.describe.index("Eligibility:") :][:400])
    columns = _columns(seen.pp)
    for column in ("ON", "OFF", "BUDGET-LEFT", "WINDOW"):
        assert columns.get(column, "<none>") != "<none>", (column, seen.pp)
    assert columns["WINDOW"] == "none" and int(columns["BUDGET-LEFT"]) <= 2
    wide = _columns(seen.wide)
    assert seen.eligible_at is not None
    assert wide.get("HELD-BY") == "IDLE_WINDOW_NOT_MET", seen.wide
    assert _time(wide["ELIGIBLE-AT"]) == seen.eligible_at, seen.wide
    block = seen.describe[seen.describe.index("Eligibility:") :][:600]
    assert "Eligible At:" in block and "Held By:" in block, block
    assert "Idle Threshold:" in block and "30s" in block, block
    assert seen.eligible_at is not None
    began = _time(shutdown["status"]["startedAt"])
    decided = _time(shutdown["status"]["requestRecord"]["decidedAt"])
    late = (began - seen.eligible_at).total_seconds()
    print(f"eligible at {seen.eligible_at}, shutdown began {began} ({late:+.1f} s)")
    assert -1.0 <= late <= EVALUATE_INTERVAL, (seen.eligible_at, began)
    assert decided >= seen.eligible_at


def _check_consolidation(demo: Demo, alive: Guard) -> None:
    """One consolidation-by-drain decision with its record: the m5.2xlarge left running
    only "kept" (e2e/demo/consolidation-containers.yaml) is drained while "kept" fits on
    the other one; "kept" runs to its end there, once (nothing is evicted)."""

    def drained() -> dict[str, Any] | None:
        for intent in demo.items("pi").values():
            status = intent.get("status") or {}
            evidence = (status.get("safetyRecord") or {}).get("consolidation") or {}
            if intent["spec"]["action"] == "Drain" and KEPT in evidence.get("targets", {}):
                return intent
        return None

    intent = wait_for(alive(drained), timeout=300, interval=2, what="a consolidation drain")
    node, status = intent["spec"]["nodeName"], intent["status"]
    record = status["safetyRecord"]
    print(f"consolidation: {node} drained: {record['consolidation']}")
    assert intent["spec"]["source"] == "Policy" and status["phase"] in ("InProgress", "Succeeded")
    assert status["decision"] == "DRAIN" and status["reasons"] == ["CONSOLIDATION_DRAIN"]
    evidence = record["consolidation"]
    assert 0 < evidence["utilisation"] <= 0.6 and evidence["hourlyPrice"] == 0.384
    assert evidence["targets"][KEPT] != node  # where its work could go: another VM
    assert evidence["pricePerUsed"] >= 1.2 * evidence["targetPricePerUsed"]
    assert record["drain"]["admission"] in ("Closing", "Closed")

    def kept_done() -> dict[str, Any] | None:
        cd = demo.items("cd").get("demo-consolidate-kept") or {}
        return cd if (cd.get("status") or {}).get("phase") == "Complete" else None

    kept = wait_for(alive(kept_done), timeout=240, interval=2, what="kept complete")
    assert kept["status"]["node"] == node and kept["status"]["attempts"] == 1


def test_demo_power_cycles_its_side_nodes_then_cleans_up_on_ctrl_c(tmp_path: Path) -> None:
    state = tmp_path / "demo"
    log = (tmp_path / "demo.log").open("w")
    netlog = tmp_path / "net.jsonl"
    pythonpath = os.pathsep.join(filter(None, [str(NETPROBE), os.environ.get("PYTHONPATH")]))
    proc = subprocess.Popen(
        [
            sys.executable,
            str(REPO / "e2e" / "demo.py"),
            f"--state-dir={state}",
            f"--http-port={unused_loopback_port()}",
            "--duration=1200",  # a backstop only; the test stops it with SIGINT
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=REPO,
        env={
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": pythonpath,
            "NETPROBE_LOG": str(netlog),
        },
    )
    demo = Demo(state, tmp_path)
    pids: dict[str, int] = {}

    def while_running(predicate: Callable[[], Any]) -> Callable[[], Any]:
        """`predicate`, but a demo that has exited fails the wait now, not at its deadline."""

        def check() -> Any:
            if proc.poll() is not None:
                raise AssertionError(f"the demo exited with {proc.returncode} while awaited")
            return predicate()

        return check

    try:
        wait_for(while_running(demo.kubeconfig.exists), timeout=120, what="demo kubeconfig")
        pids.update(json.loads((state / "pids.json").read_text())["pids"])
        assert set(pids) == {"etcd", "kube-apiserver", "kube-controller-manager"}

        def operator_started() -> dict[str, int] | None:
            try:
                recorded: dict[str, int] = json.loads((state / "demo-pids.json").read_text())
            except (OSError, ValueError):
                return None
            return recorded if "operator" in recorded else None

        recorded = wait_for(
            while_running(operator_started), timeout=120, what="the demo's operator started"
        )
        assert set(recorded) == {"stub-cloud", "side-nodes", "sushy-emulator", "operator"}
        pids.update(recorded)
        admin = demo.admin()

        # 1. each side node is switched off; its WorkerNode says Off only once its BMC
        #    answers Off (asked the moment the watch sees Off; the node then stays Off
        #    until its wake, at least minOff = 10 s later)
        watch = OffWatch(demo, {n: w for n, w in demo.items("wn").items() if n in SIDE})
        watch.start()
        t0 = time.monotonic()
        try:
            eligibility = _eligibility_before_shutdown(demo, while_running)
            wait_for(
                while_running(watch.done),
                timeout=SEQUENCE_DEADLINE,
                interval=0.5,
                what="side nodes Off",
            )
        finally:
            watch.stop()
        assert watch.bmc_when_off == {name: "Off" for name in SIDE}

        # 2. the container only it can run wakes it and runs there
        def containers_complete() -> dict[str, dict[str, Any]] | None:
            cds = demo.items("cd")
            done = {c: cds.get(c, {}) for c, _, _ in SIDE.values()}
            phases = [(c.get("status") or {}).get("phase") for c in done.values()]
            return done if phases == ["Complete"] * len(SIDE) else None

        remaining = SEQUENCE_DEADLINE - (time.monotonic() - t0)
        done = wait_for(
            while_running(containers_complete), timeout=remaining, interval=2, what="GPU containers"
        )
        elapsed = time.monotonic() - t0
        print(f"side nodes off, woken and their containers complete in {elapsed:.0f} s")

        intents = demo.items("pi")
        nodes = demo.items("wn")
        for name, (container, _, _) in SIDE.items():
            status = done[container]["status"]
            assert status["node"] == name and status["attempts"] == 1
            uuid = done[container]["spec"]["uuid"]
            assert [r["uuid"] for r in admin.runs(name)].count(uuid) == 1  # exactly once
            shutdown = _intent(intents, name, "Shutdown")
            wake = _intent(intents, name, "Wake")
            _check_records(name, uuid, shutdown, wake)
            if name == "demo-side-redfish":
                _check_eligibility(eligibility, shutdown)
            assert _time(wake["metadata"]["creationTimestamp"]) >= _time(
                shutdown["status"]["finishedAt"]
            ).replace(microsecond=0)
            assert _time(status["startedAt"]) >= _time(
                wake["status"]["safetyRecord"]["drain"]["admissionSince"]
            )
            # `kubectl get wn` columns STATE / POWER / READY are filled for side nodes
            st = nodes[name]["status"]
            assert st.get("state") and st.get("observedPower") and st.get("readiness")
        _check_energy(demo, while_running)
        _check_consolidation(demo, while_running)
        # the magic packet reached the listener with the designated SecureOn password
        packets = [p for p in admin.wol_packets() if p["node"] == "demo-side-wol"]
        assert packets and all(p["secure_on_matched"] is True for p in packets), packets

        # 3. the example side nodes (lab addresses) were never admitted, so never used
        for name in LAB:
            assert _valid(nodes[name]).get("reason") == "EndpointNotAdmitted", nodes[name]
            assert not [
                i
                for i in intents.values()
                if i["spec"]["nodeName"] == name and i["spec"]["source"] == "Policy"
            ]
        # the manual intent of examples/ cannot be carried out (nothing is sent to the lab)
        assert intents["gpu-a100-01-maintenance-off"]["status"]["phase"] == "Blocked"
        assert _valid(nodes["vm-m5-large-warm"]).get("status") == "True"

        proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
        assert proc.wait(timeout=120) == 0
    except BaseException:
        log.flush()  # the demo's own account of a failed run, in the test report
        print(_failure_report((tmp_path / "demo.log").read_text(errors="replace")))
        raise
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            for pid in pids.values():  # never leak a process from a failed run
                if _pid_alive(pid):
                    os.kill(pid, signal.SIGKILL)
            LocalCluster.load(state).down()
        log.close()
    output = (tmp_path / "demo.log").read_text()
    assert "kubectl get wn,pi -w" in output and f"KUBECONFIG={demo.kubeconfig}" in output
    assert ">> demo-side-redfish is Off" in output
    # a restart after a lost Lease (a stall on a loaded machine) is how a Pod recovers;
    # a loop that stopped with an error is a bug, restarted or not
    print(*[line for line in output.splitlines() if "starting it again" in line], sep="\n")
    assert "stopped with an error" not in output
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_pid_alive(p) for p in pids.values()):
        time.sleep(0.2)
    assert not [n for n, p in pids.items() if _pid_alive(p)], "demo left processes behind"
    # nor any other process that refers to the demo's state (the operator's --kubeconfig)
    leftovers = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _pid_alive(int(entry.name)):
            try:
                cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if str(state) in cmdline and int(entry.name) != os.getpid():
                leftovers.append(cmdline.replace("\0", " "))
    assert not leftovers, leftovers
    assert not (state / "etcd").exists() and not demo.kubeconfig.exists()
    assert not (state / "side-nodes").exists() and not (state / "demo-pids.json").exists()
    # never a lookup or a packet off loopback; the probe did run in the operator
    assert not _off_loopback(netlog)
    probed = {json.loads(line)["pid"] for line in netlog.read_text().splitlines()}
    assert {pids["operator"], pids["side-nodes"]} <= probed
