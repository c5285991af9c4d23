#!/usr/bin/env python3
"""`make demo`: a real local control plane, a stub cloud, side nodes, the examples, the operator.

Steps: build/reuse the control plane binaries → start etcd, kube-apiserver and
kube-controller-manager on 127.0.0.1 (state in .nodewarden/demo) → install the CRDs →
start the stub cloud (a separate process whose VMs are real SSH servers on 127.0.0.1;
catalogue in e2e/demo/catalogue.yaml) and the demo's side nodes (one process: SSH stub
workers that are up only while their power is On -- one behind the sushy-tools Redfish
emulator, one woken by Wake-on-LAN; e2e/demo_sidenodes.py) → create the Secrets (a fresh
SSH key, the stub cloud's credentials, the status API token, the side nodes' designated
BMC / SSH / SecureOn Secrets) → apply `examples/`, the fast demo policies, the side
nodes' WorkerNodes and the demo batch of containers (e2e/demo/) into namespace
`nodewarden` → run `nodewarden run` with the embedded demo configuration
(e2e/demo-config.yaml + the stub cloud's URL + the side nodes' loopback ports in the
credentials.* allow-lists) in the foreground. While it runs, each side node's GPU
container (e2e/demo/sidenode-containers.yaml) is applied once the operator has switched
that node Off, so the viewer sees it drained, switched off, woken and running the
container. Once the first batch of containers is complete, the consolidation
scenario (e2e/demo/consolidation-containers.yaml, e2e/demo_consolidation.py) leaves an
m5.2xlarge lightly used while its work fits on another: the power controller drains it
(a Drain PowerIntent with its Safety Record; nothing is evicted). An operator that
exits with an error (a lost Lease) is started again, as its Pod would be, up to
`OPERATOR_RESTARTS` times. On Ctrl-C, TERM, HUP or after `--duration` seconds: stop the operator, the side
nodes, the stub cloud and the control plane, remove their state and exit 0. Every
process the demo starts is recorded in `<state>/pids.json` (control plane) or
`<state>/demo-pids.json` (the rest); nothing is left running afterwards.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import yaml

from demo_consolidation import ConsolidationArrivals
from demo_sidenodes import DemoSideNodes, GpuArrivals
from localcluster import REPO, ClusterError, LocalCluster
from nodewarden.ssh.credentials import SshClientKey
from nodewarden_doubles.stubcloud.process import StubCloudProcess
from nodewarden_doubles.stubcloud.serverconfig import StubServerConfig, StubServerCredentials

NAMESPACE = "nodewarden"
CONFIG = REPO / "e2e" / "demo-config.yaml"
DEMO = REPO / "e2e" / "demo"
DEMO_PIDS = "demo-pids.json"
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def start_stub_cloud(state: Path) -> StubCloudProcess:
    catalogue = yaml.safe_load((DEMO / "catalogue.yaml").read_text())
    stub = StubCloudProcess(
        StubServerConfig(
            name="demo",
            credentials=StubServerCredentials(
                key="AKIADEMOSTUBCLOUD01", secret=secrets.token_hex(20)
            ),
            instance_types=catalogue,
            faults={"boot_delay": 3.0, "seed": 1},
        ),
        workdir=state / "stub-cloud",
        new_session=True,
    )
    stub.start()
    return stub


def write_secrets_and_config(
    cluster: LocalCluster, stub: StubCloudProcess, side: DemoSideNodes, state: Path, port: int
) -> Path:
    key = SshClientKey.generate()
    creds = stub.cloud_credentials()
    assert creds is not None and creds.secret is not None
    token = secrets.token_hex(16)
    for name, data in {
        "nodewarden-ssh": {"id": key.export_private().get_secret_value()},
        "nodewarden-cloud": {
            "key": creds.key.get_secret_value(),
            "secret": creds.secret.get_secret_value(),
        },
        "nodewarden-status": {"token": token},
    }.items():
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name},
            "stringData": data,
        }
        cluster.kubectl("-n", NAMESPACE, "apply", "-f", "-", input=json.dumps(secret))
    for obj in side.objects():
        cluster.kubectl("-n", NAMESPACE, "apply", "-f", "-", input=json.dumps(obj))
    config = yaml.safe_load(CONFIG.read_text())
    for name, entries in side.allow_lists().items():
        config["credentials"][name] = [*config["credentials"].get(name, []), *entries]
    config["cloud"]["driver_params"] = {"cloud": stub.url}
    config["cloud"]["instance_types"] = yaml.safe_load((DEMO / "catalogue.yaml").read_text())
    config["http"]["port"] = port
    path = state / "operator-config.yaml"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    (state / "status-token").write_text(token)
    (state / "status-token").chmod(0o600)
    return path


def banner(kubeconfig: Path, port: int, token_file: Path) -> str:
    bindir = Path(sys.executable).parent
    return f"""
==============================================================================
 nodewarden demo is running (namespace {NAMESPACE!r}). In another terminal:

   export PATH={bindir}:$PATH KUBECONFIG={kubeconfig}
   kubectl get wn,pi -w      # nodes (STATE POWER READY) and power transitions, live
   kubectl get cd -w         # containers: Queued -> Locked -> Running -> Complete

 What you will see in the next ~3 minutes:
   * cloud VMs are created for the batch, run it, and are destroyed once idle;
   * side nodes demo-side-redfish (Redfish BMC: sushy-tools) and demo-side-wol
     (Wake-on-LAN; its BMC only observes) start On and idle. After 30 s idle
     each is drained and switched off: STATE ShuttingDown, then Off only once
     its BMC shows Off; a PowerIntent (pi) Shutdown goes Succeeded with its
     decision and reason codes;
   * then a GPU container that only that node can run arrives (demo-gpu-l40s,
     demo-gpu-a4000): the node is woken (pi Wake), becomes Ready, runs it, and
     is switched off again 30 s after it finished;
   * gpu-a100-01 and ws-rtx-07 (examples/, a lab network) are never contacted:
     Valid=False, EndpointNotAdmitted (not in the loopback allow-lists).

   kubectl describe wn demo-side-redfish   # desired/observed/readiness, last record
   kubectl get pi -o yaml                  # every transition's Safety Record
   kubectl get events --sort-by=.lastTimestamp
   kubectl get nodewarden                  # everything nodewarden owns
   curl -s localhost:{port}/metrics | grep ^nodewarden_
   curl -s -H "Authorization: Bearer $(cat {token_file})" localhost:{port}/api/v1/status

 Press Ctrl-C here to stop everything (nothing is left running).
==============================================================================
"""


@contextlib.contextmanager
def own_foreground() -> Iterator[None]:
    """Hold the terminal's foreground in a process group of our own while the demo runs.

    Ctrl-C then signals the demo only (its children run in sessions of their own), not
    `make`: make would die of the SIGINT (exit 130, "Interrupt") even after the demo
    stopped cleanly. Does nothing without a controlling terminal or when not in its
    foreground (tests, CI, `&`).
    """
    try:
        tty = os.open("/dev/tty", os.O_RDWR)
    except OSError:
        yield
        return
    try:
        before = os.getpgrp()
        if os.tcgetpgrp(tty) != before or not _set_foreground(tty, new_group=True):
            yield
            return
        # Ctrl-Z would stop a group the shell does not know of (make waits, the terminal
        # hangs): ignored while the demo holds the foreground.
        tstp = signal.signal(signal.SIGTSTP, signal.SIG_IGN)
        try:
            yield
        finally:
            signal.signal(signal.SIGTSTP, tstp)
            _set_foreground(tty, group=before)
    finally:
        os.close(tty)


def _set_foreground(tty: int, *, new_group: bool = False, group: int = 0) -> bool:
    """Make `group` (or a new group of this process) the terminal's foreground group."""
    ttou = signal.signal(signal.SIGTTOU, signal.SIG_IGN)  # asked from a background group
    old = os.getpgrp()
    try:
        if new_group:
            os.setpgid(0, 0)
        os.tcsetpgrp(tty, os.getpgrp() if new_group else group)
    except OSError:
        with contextlib.suppress(OSError):
            os.setpgid(0, old)  # back where Ctrl-C still reaches us
        return False
    finally:
        signal.signal(signal.SIGTTOU, ttou)
    return True


def _ours(pid: int, state: Path) -> bool:
    """The pid still runs a process of this demo (its command line names the state dir)."""
    try:
        return str(state) in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


def stop_leftovers(state: Path) -> None:
    """Stop the processes an earlier demo in `state` left running (demo-pids.json)."""
    path = state / DEMO_PIDS
    try:
        pids = [int(p) for p in json.loads(path.read_text()).values()]
    except (OSError, ValueError, AttributeError):
        return
    alive = [p for p in pids if _ours(p, state)]
    for pid in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_ours(p, state) for p in alive):
        time.sleep(0.1)
    for pid in alive:
        if _ours(pid, state):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    path.unlink(missing_ok=True)


def remove_demo_files(state: Path) -> None:
    """The demo's own files (configs holding the side nodes' BMC password, the token...)."""
    for sub in ("side-nodes", "stub-cloud"):
        shutil.rmtree(state / sub, ignore_errors=True)
    for name in (DEMO_PIDS, "operator-config.yaml", "status-token"):
        (state / name).unlink(missing_ok=True)


OPERATOR_RESTARTS = 3
"""Times the demo starts its operator again after a non-zero exit (then it gives up)."""


def record_pids(state: Path, pids: dict[str, int]) -> None:
    (state / DEMO_PIDS).write_text(json.dumps(pids))


def start_operator(config: Path, kubeconfig: Path, port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "nodewarden",
            "run",
            f"--config={config}",
            f"--kubeconfig={kubeconfig}",
            f"--namespace={NAMESPACE}",
            "--log-format=text",
            "--http-host=127.0.0.1",
            f"--http-port={port}",
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        start_new_session=True,  # Ctrl-C reaches the demo alone; it stops the operator
    )


def run(args: argparse.Namespace) -> int:
    state = args.state_dir.resolve()
    cluster = LocalCluster(state_dir=state, namespace=NAMESPACE)
    old = LocalCluster.load(cluster.state_dir)
    stop_leftovers(state)
    if old.alive():
        print(">> stopping a demo control plane left from an earlier run", file=sys.stderr)
        old.down()
    operator: subprocess.Popen[bytes] | None = None
    stub: StubCloudProcess | None = None
    side: DemoSideNodes | None = None
    try:
        cluster.up()
        stub = start_stub_cloud(cluster.state_dir)
        record_pids(state, pids := {"stub-cloud": stub.pid or 0})
        side = DemoSideNodes.start(cluster.state_dir / "side-nodes")
        record_pids(state, pids := {**pids, **side.pids()})
        config = write_secrets_and_config(cluster, stub, side, cluster.state_dir, args.http_port)
        cluster.kubectl("-n", NAMESPACE, "apply", "-f", str(REPO / "examples"))
        cluster.kubectl("-n", NAMESPACE, "apply", "-f", str(DEMO / "policy-default.yaml"))
        cluster.kubectl("-n", NAMESPACE, "apply", "-f", str(DEMO / "containers.yaml"))
        print(
            banner(cluster.kubeconfig, args.http_port, cluster.state_dir / "status-token"),
            file=sys.stderr,
            flush=True,
        )
        operator = start_operator(config, cluster.kubeconfig, args.http_port)
        record_pids(state, {**pids, "operator": operator.pid})
        arrivals = GpuArrivals(cluster.kubectl, NAMESPACE)
        consolidation = ConsolidationArrivals(cluster.kubectl, NAMESPACE)
        deadline = None if args.duration is None else time.monotonic() + args.duration
        restarts = 0
        while deadline is None or time.monotonic() < deadline:
            code = operator.poll()
            if code is not None:
                # a replica that lost its Lease (an event-loop stall on a loaded machine)
                # exits on purpose and its Pod is restarted: the demo does the same
                if code == 0 or restarts >= OPERATOR_RESTARTS:
                    break
                restarts += 1
                print(
                    f">> the operator exited with {code}; starting it again, as the kubelet "
                    f"restarts its Pod ({restarts} of {OPERATOR_RESTARTS})",
                    file=sys.stderr,
                    flush=True,
                )
                operator = start_operator(config, cluster.kubeconfig, args.http_port)
                record_pids(state, {**pids, "operator": operator.pid})
                continue
            arrivals.step()
            consolidation.step()
            time.sleep(0.2)
        if operator.returncode not in (None, 0):
            print(f"demo: the operator exited with {operator.returncode}", file=sys.stderr)
            return operator.returncode
    except ClusterError as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass  # Ctrl-C, TERM or HUP: the way to stop the demo
    finally:
        # A second Ctrl-C (or the terminal closing) must not cut the cleanup short.
        for signum in STOP_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)
        # The children run in sessions of their own (a terminal's Ctrl-C reaches only
        # this process): stop them in order, the operator first, so that it never sees
        # its side nodes or its cloud vanish under it.
        if operator is not None and operator.poll() is None:
            operator.send_signal(signal.SIGTERM)
            try:
                operator.wait(timeout=15)
            except subprocess.TimeoutExpired:
                operator.kill()
                operator.wait()
        if side is not None:
            side.stop(timeout=15)
        if stub is not None:
            stub.stop(timeout=10)
        remove_demo_files(state)
        if not args.keep:
            cluster.down()
        left = f"the control plane keeps running ({state})" if args.keep else "nothing is left"
        with contextlib.suppress(OSError):  # the terminal may be gone (HUP)
            print(f">> demo stopped; {left}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--duration", type=float, default=None, help="stop after N seconds (non-interactive)"
    )
    parser.add_argument("--state-dir", type=Path, default=REPO / ".nodewarden" / "demo")
    parser.add_argument("--keep", action="store_true", help="leave the control plane running")
    parser.add_argument("--http-port", type=int, default=8080, help="operator /metrics port")
    args = parser.parse_args(argv)
    with own_foreground():
        return run(args)


if __name__ == "__main__":
    # Ctrl-C, TERM and a closed terminal (HUP) all mean "stop and clean up". Installed
    # explicitly: a process started in the background by a non-interactive shell inherits
    # SIGINT as ignored, and Python then would not turn it into KeyboardInterrupt.
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.default_int_handler)
    raise SystemExit(main())
