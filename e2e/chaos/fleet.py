"""The chaos fleet: stub cloud + side nodes behind fake BMCs + two operator replicas, and the
driver that plays a `FaultSchedule` against them.

    fleet = ChaosFleet.create(cluster, namespace, workdir, schedule)
    fleet.run(deadline=420)          # bursts, timed faults, triggers; until the queue drains
    fleet.wait_no_orphans(60)        # instances nobody needs, 60 s after the drain
    evidence = fleet.evidence()      # everything the invariants read (operators stopped)
    fleet.close()

Everything listens on 127.0.0.1. The operators reach the API server only through a
loopback TCP proxy (`nodewarden_doubles.tcpproxy`) so the schedule can drop their
connection; the test's own kubectl goes direct. The run loop polls the cluster at a
fixed interval under a deadline: timed faults fire at their schedule time, triggers
when a WorkerNode reaches their state -- nothing waits on a sleep for synchronisation.
"""

from __future__ import annotations

import glob
import json
import signal
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from chaos.schedule import SIDE_GPU_MODEL, SIDE_NODES, FaultSchedule, TimedFault, Trigger
from clusterkit import ClusterHandle, OperatorProcess, start_operator, wait_for
from dispatchkit import CATALOGUE, DispatchEnv, apply_many
from nodewarden.ownership import DISPATCHER_LABEL
from nodewarden_doubles.tcpproxy import ProxyThread
from powerkit import BMC_PASSWORD, FAST_POWER_POLICY, SECURE_ON, PowerEnv, side_node_entry

DISPATCHER_ID = "chaos"
LEASE = f"nodewarden-{DISPATCHER_ID}"
SECOND_ID = "chaos-b"
"""The second install in the namespace (`make chaos`): one replica, side nodes only
(`SECOND_NODES`), the same queue of containers (each locked by one install)."""
SECOND_NODES = ("side-e",)
LIBFAKETIME = next(iter(sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))), None)
FINAL_PHASES = frozenset({"Complete", "Failed", "Cancelled"})
KILL_WAITS_FOR_START = 9.0
"""Seconds a leader-kill waits, once it has slowed a side node, for a runner start in
flight there (a container Locked on it) before it kills the leader anyway."""
SLOW_DRAIN_COMMANDS = 5.0
"""Seconds each SSH command of a side node takes while a trigger waits for its drain
(so DRAINING lasts long enough for the inhibitor / the demand to land in it)."""

SIDE_CAPACITY: dict[str, Any] = {"vcpus": 16, "ram": "64Gi", "gpus": 1}
"""Each side node's WorkerNode capacity (the report's capacity of its host)."""

POLICY: dict[str, Any] = {
    **FAST_POWER_POLICY,
    "idleThreshold": "4s",
    "telemetryMaxAge": "20s",
    "heartbeatStaleAfter": "30s",
    "deadlines": {"shutdown": "15s", "wake": "20s", "ready": "15s", "drain": "60s"},
    "retry": {"budget": 2, "initialBackoff": "1s", "maxBackoff": "3s", "jitter": 0.1},
    "maxNodes": 12,
    "dispatch": {"maxAttempts": 4, "lameAfter": "40s", "lameMinProbes": 3, "takeoverAfter": "20s"},
}
SPOT = [
    base.model_copy(
        update={
            "name": f"{base.name}-spot",
            "provider_type": f"{base.provider_type}-spot",
            "price": round(base.price * 0.35, 4),
            "preemptible": True,
        }
    )
    for base in CATALOGUE
    if base.name in ("small", "medium")
]
"""Preemptible types, so that preemptible containers have somewhere to go."""
POLICY_EDIT = {"idleThreshold": "6s", "maxNodes": 14}


@dataclass
class ProxiedCluster(ClusterHandle):
    """The cluster as the operators see it: their kubeconfig points at the proxy."""

    via: Path = field(default_factory=Path)

    @property
    def operator_kubeconfig(self) -> Path:
        return self.via


@dataclass
class Injected:
    at: float
    kind: str
    detail: str


@dataclass
class ChaosFleet:
    cluster: ClusterHandle
    namespace: str
    workdir: Path
    schedule: FaultSchedule
    power: PowerEnv
    cloud: DispatchEnv
    proxy: ProxyThread
    proxied: ProxiedCluster
    config_path: Path
    skew: str | None = None
    """libfaketime's FAKETIME for every second replica of the install (`+30s`: its wall
    clock ahead, its monotonic clock left alone); None: no skew."""
    second: bool = False
    """A second install (`SECOND_ID`) runs beside this one in the namespace."""
    replicas: list[OperatorProcess] = field(default_factory=list)
    others: list[OperatorProcess] = field(default_factory=list)
    """The second install's replica (restarted when it exits)."""
    killed: list[OperatorProcess] = field(default_factory=list)
    exited: list[OperatorProcess] = field(default_factory=list)
    """Replicas that ended by themselves (a leader that lost its Lease exits with 1)."""
    injected: list[Injected] = field(default_factory=list)
    vm_deaths: dict[str, float] = field(default_factory=dict)
    """Instance id -> monotonic time the schedule powered it off."""
    node_states: list[tuple[float, str, str]] = field(default_factory=list)
    """(seconds after t0, WorkerNode, state) at each state change the run loop saw."""
    armed: dict[Trigger, str] = field(default_factory=dict)
    """Each drain trigger's stage (waiting, slowed, fired)."""
    stages: list[tuple[float, str, str]] = field(default_factory=list)
    """(seconds after t0, trigger kind, stage) at each stage change: told when a trigger
    never fired."""
    slowed: str | None = None
    """The side node whose SSH commands a leader-kill slowed, until restored."""
    slowed_at: float = 0.0
    takeovers: int = 0
    drained_at: float | None = None
    t0: float = 0.0

    # -- set-up -----------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        cluster: ClusterHandle,
        namespace: str,
        workdir: Path,
        schedule: FaultSchedule,
        *,
        skew: str | None = None,
        second_install: bool = False,
    ) -> ChaosFleet:
        if skew is not None and LIBFAKETIME is None:
            raise RuntimeError("clock skew needs libfaketime (apt-get install faketime)")
        nodes = [
            side_node_entry("side-a", fakebmc={"never_apply": True}),
            side_node_entry("side-b"),
            side_node_entry("side-c", initial_power="Off", faults={"ready_fails_after_wake": True}),
            side_node_entry("side-d"),
        ]
        assert tuple(n["name"] for n in nodes) == SIDE_NODES
        owners = {name: DISPATCHER_ID for name in SIDE_NODES}
        if second_install:
            nodes += [side_node_entry(name) for name in SECOND_NODES]
            owners |= {name: SECOND_ID for name in SECOND_NODES}
        capacity = {"capacity": {**SIDE_CAPACITY, "gpuModel": SIDE_GPU_MODEL}}
        power = PowerEnv.create(
            cluster,
            namespace,
            workdir / "power",
            nodes,
            policy=POLICY,
            node_specs={name: capacity for name in owners},
            # labelled when two installs share the namespace (else claimed by the one)
            labels={n: {DISPATCHER_LABEL: o} for n, o in owners.items()}
            if second_install
            else None,
        )
        try:
            cloud = DispatchEnv.create(
                cluster,
                namespace,
                workdir / "cloud",
                faults=schedule.cloud_faults,
                policy=POLICY,
                dispatcher_id=DISPATCHER_ID,
                ssh_key=power.key,
                catalogue=[*CATALOGUE, *SPOT],
                cloud={"ops_per_second": 20, "max_concurrent_creates": 4},
            )
        except BaseException:
            power.close()
            raise
        proxy, proxied = _proxied(cluster, workdir)
        config_path = workdir / "operator.yaml"
        fleet = cls(
            cluster,
            namespace,
            workdir,
            schedule,
            power,
            cloud,
            proxy,
            proxied,
            config_path,
            skew=skew,
            second=second_install,
        )
        fleet._write_config()
        return fleet

    @property
    def side_names(self) -> tuple[str, ...]:
        """Every side node in the run (the second install's included)."""
        return SIDE_NODES + (SECOND_NODES if self.second else ())

    def owners(self) -> dict[str, str]:
        """Host (`side:<name>`, `vm:<id>`) -> the install that owns it."""
        out = {f"side:{n}": DISPATCHER_ID for n in SIDE_NODES}
        out |= {f"side:{n}": SECOND_ID for n in SECOND_NODES if self.second}
        return out

    def _write_config(self) -> None:
        config = yaml.safe_load(self.cloud.config_path.read_text())
        side = yaml.safe_load(self.power.config_path.read_text())
        config["credentials"] = side["credentials"]
        config["power"] = {**side["power"], "keep_finished_intents": 100000}
        config["dispatch"]["ssh_user"] = side["dispatch"]["ssh_user"]
        self.config_path.write_text(yaml.safe_dump(config))
        if self.second:  # side nodes only: it creates no VMs
            other = {**config, "dispatcher_id": SECOND_ID}
            other.pop("cloud", None)
            self._second_config.write_text(yaml.safe_dump(other))

    @property
    def _second_config(self) -> Path:
        return self.workdir / "operator-b.yaml"

    def start_replica(self) -> OperatorProcess:
        index = len(self.replicas) + len(self.killed) + len(self.exited)
        skewed = self.skew is not None and index % 2 == 1
        env = None
        if skewed:  # the wall clock only (the monotonic clock is left alone)
            assert LIBFAKETIME is not None and self.skew is not None
            env = {"LD_PRELOAD": LIBFAKETIME, "FAKETIME": self.skew, "DONT_FAKE_MONOTONIC": "1"}
        op = start_operator(
            self.proxied,
            self.namespace,
            self.workdir,
            f"--config={self.config_path}",
            name=f"operator-{index}" + ("-skewed" if skewed else ""),
            env=env,
        )
        self.replicas.append(op)
        return op

    def start_second(self) -> OperatorProcess:
        """The second install's replica (`SECOND_ID`), direct to the API server."""
        index = len(self.others) + sum(1 for op in self.exited if "install-b" in op.log_path.stem)
        op = start_operator(
            self.cluster,
            self.namespace,
            self.workdir,
            f"--config={self._second_config}",
            name=f"install-b-{index}",
        )
        self.others.append(op)
        return op

    # -- the run ------------------------------------------------------------------------------

    def now(self) -> float:
        return time.monotonic() - self.t0

    def note(self, kind: str, detail: str = "") -> None:
        self.injected.append(Injected(round(self.now(), 1), kind, detail))
        print(f"[chaos t={self.now():6.1f}s] {kind} {detail}", flush=True)

    def run(self, deadline: float) -> bool:
        """Play the schedule until every container is final and every fault fired (True),
        or until `deadline` (False: the invariants then name what was lost)."""
        self.start_replica()
        self.start_replica()
        if self.second:
            self.start_second()
        wait_for(self.holder, timeout=60, interval=0.5, what=f"a holder of Lease {LEASE}")
        self.t0 = time.monotonic()
        bursts = list(self.schedule.bursts)
        faults = list(self.schedule.faults)
        self.armed = {t: "waiting" for t in self.schedule.triggers}
        armed = self.armed
        releases: list[tuple[float, str, Any]] = []
        holder = self.holder()
        while True:
            now = self.now()
            if now > deadline:
                self.note("deadline", f"not drained: {Counter(self.cloud.phases().values())}")
                return False
            while bursts and bursts[0].at <= now:
                burst = bursts.pop(0)
                apply_many(self.cloud, [c.manifest() for c in burst.containers])  # type: ignore[arg-type]
                self.note("burst", f"{len(burst.containers)} containers")
            while faults and faults[0].at <= now:
                fault = faults.pop(0)
                retry = self._fire(fault, releases)
                if retry is not None:  # nothing to hit yet, or its second step: in 3 s
                    faults = sorted([*faults, replace(retry, at=now + 3)], key=lambda f: f.at)
                    break
            for at, what, undo in list(releases):
                if at <= now:
                    releases.remove((at, what, undo))
                    undo()
                    self.note("restored", what)
            self._restart_exited()
            nodes = {n["metadata"]["name"]: n for n in self.cloud.nodes()}
            self._record_states(nodes)
            self._advance_all(nodes, releases)
            current = self.holder()
            if current and current != holder:
                if holder:
                    self.takeovers += 1
                    self.note("takeover", f"{holder} -> {current}")
                holder = current
            phases = self.cloud.phases()
            if (
                not bursts
                and not faults
                and not releases
                and len(phases) == len(self.schedule.containers)
                and all(p in FINAL_PHASES for p in phases.values())
                # a drain trigger still armed fires at the next idle spell (bounded by
                # `deadline`): a short run must not end before it
                and all(stage == "fired" for stage in armed.values())
            ):
                self.drained_at = time.monotonic()
                self.note("drained", f"{Counter(phases.values())}")
                return True
            self._watch_slowed(releases, 1.0)  # the run loop's poll interval

    def _fire(self, fault: TimedFault, releases: list[tuple[float, str, Any]]) -> TimedFault | None:
        """Inject `fault`; None when done, else what to fire in 3 s (the same fault when
        there is nothing to hit yet)."""
        if fault.kind == "leader-kill":
            if fault.delay:
                self._slow_ssh(fault, releases)
                return replace(fault, delay=0.0)  # the SIGKILL, with slow commands in flight
            starting = self._starting(self.slowed)
            if self.slowed and not starting and self.now() < self.slowed_at + KILL_WAITS_FOR_START:
                return fault  # a runner start in flight on the slow node is what to hit
            return None if self._kill_leader(starting) else fault
        if fault.kind == "vm-dies":
            return None if self._kill_vm() else fault
        if fault.kind == "api-outage":
            dropped = self.proxy.drop_all()
            self.proxy.refuse()
            self.note("api-outage", f"{fault.seconds:g}s ({dropped} connections dropped)")
            releases.append((fault.at + fault.seconds, "api-connection", self.proxy.accept))
        elif fault.kind == "policy-edit":
            self.cluster.kubectl(
                "-n", self.namespace, "patch", "powerpolicy", "default", "--type=merge",
                "-p", json.dumps({"spec": POLICY_EDIT}),
            )  # fmt: skip
            self.note("policy-edit", json.dumps(POLICY_EDIT))
        elif fault.kind == "bmc-500":
            self.power.side.admin.set_bmc(fault.target, failing_resets=2, unavailable_reads=6)
            self.note("bmc-500", f"{fault.target}: next 2 resets 500, next 6 reads 503")
        return None

    def _restart_exited(self) -> None:
        """Start a replacement for a replica that exited, as a Deployment's Pod restarts."""
        for group, start in ((self.replicas, self.start_replica), (self.others, self.start_second)):
            for op in list(group):
                code = op.proc.poll()
                if code is not None:
                    group.remove(op)
                    self.exited.append(op)
                    self.note("replica-exited", f"{op.log_path.stem} exited {code}; restarted")
                    start()

    def _record_states(self, nodes: dict[str, dict[str, Any]]) -> None:
        last: dict[str, str] = {}
        for _, name, state in self.node_states:
            last[name] = state
        for name, node in sorted(nodes.items()):
            state = str((node.get("status") or {}).get("state") or "")
            if last.get(name) != state:
                self.node_states.append((round(self.now(), 1), name, state))

    def _slow_ssh(self, fault: TimedFault, releases: list[tuple[float, str, Any]]) -> None:
        """Slow every SSH command of a side node that takes work (Active first, then
        Idle; not one a drain trigger still wants) for `fault.seconds` (a slowdown of an
        earlier kill still going ends first)."""
        for release in [r for r in releases if r[1].endswith(" SSH speed")]:
            releases.remove(release)
            release[2]()
        nodes = {n["metadata"]["name"]: n for n in self.cloud.nodes()}
        wanted = {t.node for t, stage in self.armed.items() if stage != "fired"}
        state = {
            name: ((nodes.get(name) or {}).get("status") or {}).get("state")
            for name in SIDE_NODES
            if name not in wanted
        }
        rank = {"Active": 0, "Idle": 1}
        node = min(state, key=lambda n: (rank.get(str(state[n]), 2), n), default="side-a")
        admin = self.power.side.admin
        admin.set_worker_faults(node, command_delay=fault.delay)
        self.slowed, self.slowed_at = node, self.now()
        self.note("ssh-slow", f"{node} ({state.get(node)}): {fault.delay:g}s per SSH command")

        def restore() -> None:
            admin.set_worker_faults(node, command_delay=0.0)
            self.slowed = None

        releases.append((self.now() + fault.seconds, f"{node} SSH speed", restore))

    def _starting(self, node: str | None) -> list[str]:
        """Containers Locked on `node`: chosen for it, their runner start in flight."""
        if node is None:
            return []
        return [
            c["metadata"]["name"]
            for c in self.cloud.containers()
            if (c.get("status") or {}).get("phase") == "Locked"
            and (c.get("status") or {}).get("node") == node
        ]

    def _kill_leader(self, starting: list[str] | None = None) -> bool:
        holder = self.holder()
        victim = next((op for op in self.replicas if f"-{op.proc.pid}-" in holder), None)
        if victim is None:
            return False  # no leader right now (a takeover in progress)
        victim.stop(signal.SIGKILL)
        self.replicas.remove(victim)
        self.killed.append(victim)
        slowed = (
            f", {self.slowed} SSH slowed, {len(starting or [])} start(s) in flight there"
            if self.slowed
            else ""
        )
        self.note("leader-kill", f"SIGKILL {victim.log_path.stem} (pid {victim.proc.pid}){slowed}")
        self.start_replica()
        return True

    def _kill_vm(self) -> bool:
        admin = self.cloud.stub.admin
        running = [
            v for v in self.cloud.ours() if v.state == "running" and v.id not in self.vm_deaths
        ]
        busy = [vm for v in running if (vm := admin.vm(v.id)) is not None and vm.running_containers]
        if not busy:
            return False
        vm = sorted(busy, key=lambda v: v.id)[0]
        self.vm_deaths[vm.id] = time.monotonic()
        self.cloud.stub.admin.poweroff(vm.id)
        self.note("vm-dies", f"{vm.id} ({len(vm.running_containers)} containers)")
        return True

    def _advance_all(
        self, nodes: dict[str, dict[str, Any]], releases: list[tuple[float, str, Any]]
    ) -> None:
        for trigger, stage in self.armed.items():
            moved = self._advance(trigger, stage, nodes, releases)
            if moved != stage:
                self.armed[trigger] = moved
                self.stages.append((round(self.now(), 1), trigger.kind, moved))

    def _watch_slowed(self, releases: list[tuple[float, str, Any]], seconds: float) -> None:
        """Wait `seconds`; while a trigger's node is slowed, read that node every 0.25 s
        meanwhile. A round of the run loop takes several seconds on a loaded machine, a
        drain can be shorter, and a drain the loop never saw leaves its trigger armed
        until the deadline (CI, seed 227255: side-d's inhibitor never injected)."""
        end = time.monotonic() + seconds
        while True:
            watched = sorted({t.node for t, stage in self.armed.items() if stage == "slowed"})
            if watched:
                out = self.cluster.kubectl(
                    "-n", self.namespace, "get", "workernodes", *watched, "-o", "json",
                    check=False,
                )  # fmt: skip
                if out.returncode == 0:
                    data = json.loads(out.stdout)  # one name: the object itself, not a List
                    nodes = {n["metadata"]["name"]: n for n in data.get("items", [data])}
                    self._record_states(nodes)
                    self._advance_all(nodes, releases)
            left = end - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(left, 0.25) if watched else left)

    def trigger_story(self) -> str:
        """Each drain trigger's stage changes and its node's states, for a failure."""
        lines = []
        for trigger, stage in self.armed.items():
            states = ", ".join(f"{t:g} {s}" for t, n, s in self.node_states if n == trigger.node)
            moves = ", ".join(f"{t:g} {s}" for t, k, s in self.stages if k == trigger.kind)
            lines.append(
                f"  {trigger.kind} on {trigger.node}: {stage}; stages: {moves or '-'}; "
                f"{trigger.node} states: {states or '-'}"
            )
        return "\n".join(lines)

    def _advance(
        self,
        trigger: Trigger,
        stage: str,
        nodes: dict[str, dict[str, Any]],
        releases: list[tuple[float, str, Any]],
    ) -> str:
        state = ((nodes.get(trigger.node) or {}).get("status") or {}).get("state")
        admin = self.power.side.admin
        if stage == "waiting" and self.now() >= trigger.after and state == "Idle":
            admin.set_worker_faults(trigger.node, command_delay=SLOW_DRAIN_COMMANDS)
            return "slowed"
        if stage == "slowed" and state == "Draining":
            admin.set_worker_faults(trigger.node, command_delay=0.0)
            if trigger.kind == "inhibitor-mid-drain":
                admin.set_faults(trigger.node, shutdown_inhibitor=True)
                self.note("inhibitor-mid-drain", f"{trigger.node} took a shutdown inhibitor")
                releases.append(
                    (
                        self.now() + trigger.release_after,
                        f"{trigger.node} inhibitor released",
                        lambda: admin.set_faults(trigger.node, shutdown_inhibitor=False),
                    )
                )
            else:
                late = [c.manifest() for c in self.schedule.late_containers]
                apply_many(self.cloud, late)
                self.note("demand-during-draining", f"{len(late)} containers for {trigger.node}")
            return "fired"
        if stage == "slowed" and state not in ("Idle", "Draining"):
            admin.set_worker_faults(trigger.node, command_delay=0.0)
            return "waiting"  # it got work instead; try again at its next idle spell
        return stage

    def holder(self) -> str:
        out = self.cluster.kubectl(
            "-n", self.namespace, "get", "lease", LEASE, "-o", "json", check=False
        )
        if out.returncode != 0:
            return ""
        return str((json.loads(out.stdout).get("spec") or {}).get("holderIdentity") or "")

    def fired(self) -> Counter[str]:
        return Counter(i.kind for i in self.injected)

    # -- after the run ----------------------------------------------------------------------------

    def orphans(self) -> list[str]:
        """Our instances that no WorkerNode stands for (needed or being shut down)."""
        known = {(n.get("status") or {}).get("instanceId") for n in self.cloud.nodes()}
        return [vm.id for vm in self.cloud.ours() if vm.id not in known]

    def stop(self) -> None:
        for op in [*self.replicas, *self.others]:
            op.stop()

    def processes(self) -> list[OperatorProcess]:
        return [*self.killed, *self.exited, *self.replicas, *self.others]

    def close(self) -> None:
        self.stop()
        for op in self.processes():
            print(f"--- {op.log_path.name} (last 4000 chars) ---\n{op.logs()[-4000:]}")
        self.proxy.close()
        self.cloud.close()
        self.power.close()

    def secrets(self) -> dict[str, str]:
        """Every secret value the run handed out: none may appear in a log, status or Event."""
        creds = self.cloud.stub.cloud_credentials()
        assert creds is not None and creds.secret is not None
        key = self.power.key.export_private().get_secret_value()
        body = "".join(line for line in key.splitlines() if "PRIVATE KEY" not in line)
        return {
            "bmc password": BMC_PASSWORD,
            "cloud secret": creds.secret.get_secret_value(),
            "status token": "status-token-for-tests-0123456789",
            "ssh private key (body)": body[:40],
            "wol secure-on": SECURE_ON,
        }

    def evidence(self) -> dict[str, Any]:
        """Everything the invariants read; stops the operators first (sessions logged out)."""
        self.stop()
        side = self.power.side.admin
        get = self.cluster.get_json
        cloud_runs = self.cloud.stub.admin.runs()
        names = self.side_names
        side_runs = {n: side.runs(n) for n in names}
        read_at = time.monotonic()  # the ledgers' still-running runs count as running until now
        return {
            "containers": get(self.namespace, "cd")["items"],
            "workernodes": get(self.namespace, "wn")["items"],
            "intents": get(self.namespace, "pi")["items"],
            "events": get(self.namespace, "events")["items"],
            "policies": get(self.namespace, "pp")["items"],
            "cloud_runs": cloud_runs,
            "read_at": read_at,
            "capacity": {
                "side": {n: dict(SIDE_CAPACITY) for n in names},
                "types": {
                    t.provider_type: {"vcpus": t.vcpus, "ram": t.ram, "gpus": t.gpus}
                    for t in [*CATALOGUE, *SPOT]
                },
            },
            "cloud_vms": [
                {"id": v.id, "state": v.state, "size": v.size} for v in self.cloud.ours()
            ],
            "side_runs": side_runs,
            "side_events": {n: side.events(n) for n in names},
            "side_power": {n: side.node(n)["power"] for n in names},
            "bmc_logs": {n: side.bmc_log(n) for n in names},
            "vm_deaths": dict(self.vm_deaths),
            "owners": self.owners(),
            "cloud_owner": DISPATCHER_ID,
            "processes": len(self.processes()),
            "killed": len(self.killed),
            "logs": {
                **{op.log_path.name: op.logs() for op in self.processes()},
                "sidenodes.log": self.power.side.log_text(),
                "stubcloud.log": self.cloud.stub.log_text(),
            },
            "secrets": self.secrets(),
            "ready_fails_node": "side-c",
        }


def _proxied(cluster: ClusterHandle, workdir: Path) -> tuple[ProxyThread, ProxiedCluster]:
    """A loopback proxy to the API server and a kubeconfig for the operators through it."""
    source = cluster.operator_kubeconfig
    config = yaml.safe_load(source.read_text())
    server = config["clusters"][0]["cluster"]["server"]
    host, port = server.removeprefix("https://").rstrip("/").rsplit(":", 1)
    proxy = ProxyThread(host, int(port))
    for entry in config["clusters"]:
        entry["cluster"]["server"] = f"https://{host}:{proxy.port}"
    path = workdir / "operator-via-proxy.kubeconfig"
    workdir.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return proxy, ProxiedCluster(cluster.kubeconfig, cluster.local, via=path)
