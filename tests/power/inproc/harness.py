"""The power controller in process: a fake clock, fake ports, the in-memory API.

`PowerHarness` builds a real `PowerController` (its constructor and public surface only)
on `memkube.MemoryKube`, with:

- `FakeClock` -- the one clock (controller, adapters, records); the test advances it;
- `FakeControl` -- a structural fake of `power.control.PowerControl` (the methods the
  controller calls: `read_power`, `discover`, `request`, `forget`, `close`, and the
  `last_error` / `system_uuids` it reads). Each side node is a `Host` whose power the
  fake BMC reports and whose requests it applies after a scripted delay (or never);
  every request is recorded (`control.requests`), and a test may script an answer per
  action (`control.answers`: accepted / rejected / errored);
- `FakePool` -- the worker pool's port (`fleet.ports.PoolPort`): it records probe and
  sync requests and destroys, and answers probes from the `Host`s as `WorkerSnapshot`s
  and `ProbeReport`s through the controller's observer methods (`probed`, `listed`,
  `gone`, `held`, `should_probe`);
- an informer echo: every object the controller writes (WorkerNode status, PowerIntents)
  comes back to it through `observe_node` / `observe_intent`, as the watch would bring it.

`h.run_until(cond, within=...)` runs rounds, advancing the fake clock a tick at a time,
until `cond()` holds; it fails with the node's state after `within` fake seconds. Nothing
sleeps: real time passes only while the event loop runs the tasks a round spawned.
"""

from __future__ import annotations

import asyncio
import copy
import zlib
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

from powerfakes import (
    BMC_SPEC,
    DISPATCHER,
    KNOWN_HOSTS,
    NS,
    EchoKube,
    FakeClock,
    FakeControl,
    FakePool,
    Host,
    container_uuid,
)

from nodewarden.api.containerdispatch import ContainerResources
from nodewarden.api.kinds import CONTAINER_DISPATCH, POWER_INTENT, POWER_POLICY, WORKER_NODE
from nodewarden.cloud.model import CloudInstance
from nodewarden.credentials import CredentialResolver
from nodewarden.credentials.settings import CredentialsConfig
from nodewarden.fleet.board import PowerBoard
from nodewarden.fleet.policies import PolicyBook
from nodewarden.fleet.ports import WorkerSnapshot
from nodewarden.fleet.status import NodeStatusWriter
from nodewarden.kube.requesters import RequesterAdmission
from nodewarden.ownership import DISPATCHER_LABEL
from nodewarden.power.controller import PowerController
from nodewarden.power.runtime import ControllerSettings
from nodewarden.scheduling.caps import Admission
from nodewarden.scheduling.views import ContainerView, Phase, Plan
from nodewarden.ssh.errors import SshError
from nodewarden.ssh.facts import (
    HostUuidFact,
    Inhibitor,
    InhibitorsFact,
    ProbeReport,
    ReadyFact,
    RunnerProcess,
    RunnersFact,
    UptimeFact,
)

POLICY: dict[str, Any] = {
    "idleThreshold": "60s",
    "bootGrace": "120s",
    "minOn": "0s",
    "minOff": "0s",
    "cooldown": "0s",
    "telemetryMaxAge": "30s",
    "heartbeatStaleAfter": "120s",
    "billing": {"period": "0s", "windowStart": "0s", "windowEnd": "1s"},
    "deadlines": {"shutdown": "60s", "wake": "60s", "ready": "60s", "drain": "120s"},
    "retry": {"budget": 2, "initialBackoff": "5s", "maxBackoff": "10s", "jitter": 0.0},
    "disruptionBudget": {"maxConcurrentTransitions": 10},
}
"""The harness's default PowerPolicy: short times, in fake seconds."""


# ---------------------------------------------------------------------- the harness


class PowerHarness:
    """See the module docstring. Use as `async with PowerHarness() as h:`."""

    def __init__(
        self,
        policy: Mapping[str, Any] | None = None,
        settings: ControllerSettings | None = None,
        probe_interval: float = 5.0,
        clock: FakeClock | None = None,
        kube: EchoKube | None = None,
        hosts: dict[str, Host] | None = None,
        acknowledge_after: float | None = None,
    ) -> None:
        self.clock = clock or FakeClock()
        self.acknowledge_after = acknowledge_after
        """None: admission closes acknowledged at once (no dispatcher). Seconds: the
        harness is the dispatcher, which acknowledges at the start of its first round
        this long after the close (its API round trip)."""
        self.kube = kube or EchoKube()
        self.hosts: dict[str, Host] = hosts if hosts is not None else {}
        self.pool = FakePool()
        self.probe_interval = probe_interval
        self.answer_probe_requests = True
        """False: the pool probes only on its own schedule (`probe_interval`), not when
        the controller asks (a slow pool)."""
        self._last_probe: dict[str, datetime] = {}
        self.silent: set[str] = set()
        """Hosts the pool no longer hears from (no probe report at all: a stream that
        stopped, a probe that hangs)."""
        self.plan_changes = False
        """True: the dispatcher plans only when its containers changed, and otherwise
        says its plan is unchanged (`plan_unchanged`), as the real loop does at rest.
        False: it plans every round."""
        self.plans = 0
        self.recovering = False
        """True: the dispatcher is still recovering (no plan at all yet)."""
        self._plan_key: object = None
        self._last_list: datetime | None = None
        self._seen: dict[tuple[str, str], str] = {}
        self.containers: dict[str, ContainerView] = {}
        self._wakes: dict[str, str | None] = {}
        self.vms: dict[str, CloudInstance] = {}
        if kube is None:
            self.kube.secret("bmc", "bmc", username="admin", password="bmc-password-7f3a")
            self.kube.secret("known-hosts", "ssh", knownHosts=KNOWN_HOSTS)
        self.credentials = CredentialResolver(
            self.kube,  # type: ignore[arg-type]
            NS,
            CredentialsConfig(ssh_endpoints=["127.0.0.1"], bmc_endpoints=["127.0.0.1"]),
        )
        self.control = FakeControl(self.clock, self.hosts, self.kube, self.credentials)
        self.book = PolicyBook(namespace=NS, default_name="default")
        self.board = PowerBoard()
        self.settings = settings or ControllerSettings()
        self.ctrl = PowerController(
            kube=self.kube,  # type: ignore[arg-type]
            namespace=NS,
            dispatcher_id=DISPATCHER,
            default_policy="default",
            credentials=self.credentials,
            policies=self.book,
            pool=self.pool,
            board=self.board,
            status=NodeStatusWriter(self.kube, NS),  # type: ignore[arg-type]
            control=self.control,  # type: ignore[arg-type]
            settings=self.settings,
            clock=self.clock,
            acknowledge_admission=acknowledge_after is None,
        )
        if kube is None or not any(k == POWER_POLICY.kind for k, _, _ in self.kube.objects):
            self.set_policy("default", **(POLICY if policy is None else policy))
        else:
            for body in self.kube.changed(POWER_POLICY.kind, self._seen):
                self.book.observe(body)
                self.ctrl.observe_policy(body)  # as the feed's first LIST hands it over

    async def __aenter__(self) -> PowerHarness:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.ctrl.stop()
        await self.settle()

    # -- objects ----------------------------------------------------------------------

    def set_policy(self, name: str, **spec: Any) -> dict[str, Any]:
        body = self.kube.put(
            POWER_POLICY, NS, {"metadata": {"name": name, "namespace": NS}, "spec": spec}
        )
        self.book.observe(body)
        self.ctrl.observe_policy(body)
        self._seen[(POWER_POLICY.kind, name)] = body["metadata"]["resourceVersion"]
        return body

    def side_node(
        self,
        name: str,
        *,
        method: str = "Redfish",
        bmc: bool | None = None,
        power: str = "On",
        spec: Mapping[str, Any] | None = None,
        **host: Any,
    ) -> Host:
        """A side node (Redfish BMC, or Wake-on-LAN with `method="WakeOnLan"`) and its host."""
        uuid = f"4c4c4544-0000-1000-8000-{zlib.crc32(name.encode()):012x}"
        host.setdefault("host_uuid", uuid)
        host.setdefault("bmc_uuid", uuid)
        h = self.hosts[name] = Host(name, power=power, **host)
        body_spec: dict[str, Any] = {
            "nodeType": "SideNode",
            "controlMethod": method,
            "capacity": {"vcpus": 16, "ram": "64Gi", "gpus": 1, "gpuModel": "a10"},
            "ssh": {
                "address": "127.0.0.1",
                "port": 2222,
                "user": "nodewarden",
                "knownHostsSecretRef": {"name": "known-hosts", "key": "knownHosts"},
            },
        }
        if bmc is None:
            bmc = method == "Redfish"
        if bmc:
            body_spec["bmc"] = {**BMC_SPEC, "systemId": name}  # one BMC system per node
        if method == "WakeOnLan":
            body_spec["wakeOnLan"] = {"mac": "52:54:00:00:00:01", "broadcastAddress": "127.0.0.1"}
        body_spec.update(spec or {})
        self.put_node(name, body_spec)
        return h

    def cloud_vm(self, name: str, *, itype: str = "small", listed: bool = True) -> None:
        """A cloud VM WorkerNode whose instance the fake cloud lists as running."""
        self.hosts[name] = Host(name, booted_at=self.clock(), ready_delay=0.0)
        self.put_node(name, {"nodeType": "CloudVM", "instanceType": itype})
        self.vms[name] = CloudInstance(
            id=f"i-{name}",
            name=name,
            instance_type=itype,
            provider_type=itype,
            state="Running",  # type: ignore[arg-type]
            price=0.1,
            created_at=self.clock(),
            observed_at=self.clock(),
            source="cloud:fake",
        )
        self.worker(name, booted_at=self.clock())

    def worker(self, name: str, **fields: Any) -> WorkerSnapshot:
        """Set (a part of) the pool's snapshot of VM `name`."""
        old = self.pool.snapshots.get(name)
        base: dict[str, Any] = (
            {f: getattr(old, f) for f in WorkerSnapshot.__dataclass_fields__}
            if old is not None
            else dict(
                name=name,
                side=False,
                booted_at=self.clock(),
                last_attempt=None,
                last_success=None,
                attempts_since_success=0,
                attempts_total=0,
                broken=False,
                deletion_requested=False,
                instance_id=f"i-{name}",
                instance_stopped=False,
                listed_at=None,
            )
        )
        base.update(fields)
        snap = self.pool.snapshots[name] = WorkerSnapshot(**base)
        return snap

    def put_node(self, name: str, spec: Mapping[str, Any], **meta: Any) -> dict[str, Any]:
        old = self.kube.objects.get((WORKER_NODE.kind, NS, name))
        metadata = dict(old["metadata"]) if old else {"name": name, "namespace": NS}
        metadata.setdefault("labels", {DISPATCHER_LABEL: DISPATCHER})
        metadata.setdefault("creationTimestamp", self.clock().isoformat())
        metadata.update(meta)
        body = self.kube.put(WORKER_NODE, NS, {"metadata": metadata, "spec": dict(spec)})
        self._seen[(WORKER_NODE.kind, name)] = body["metadata"]["resourceVersion"]
        self.ctrl.observe_node(body)
        return body

    def edit_node(self, name: str, **spec: Any) -> dict[str, Any]:
        old = self.kube.objects[(WORKER_NODE.kind, NS, name)]
        return self.put_node(name, {**old["spec"], **spec})

    def delete_node(self, name: str) -> None:
        body = self.kube.objects.pop((WORKER_NODE.kind, NS, name))
        self.ctrl.observe_node(body, deleted=True)

    def intent(
        self,
        name: str,
        node: str,
        action: str = "Shutdown",
        requester: str = "alice",
        **spec: Any,
    ) -> dict[str, Any]:
        """A manual PowerIntent by `requester` (verified only once `verify_requesters`
        says the requester admission policy is in force)."""
        body: dict[str, Any] = {
            "metadata": {
                "name": name,
                "namespace": NS,
                "creationTimestamp": self.clock().isoformat(),
            },
            "spec": {
                "nodeName": node,
                "action": action,
                "source": "Manual",
                "requestedBy": requester,
                **spec,
            },
        }
        stored = self.kube.put(POWER_INTENT, NS, body)
        self._seen[(POWER_INTENT.kind, name)] = stored["metadata"]["resourceVersion"]
        self.ctrl.observe_intent(stored)
        return stored

    def verify_requesters(self, enforced: bool = True) -> None:
        """The requester admission policy's check: in force (requestedBy is the
        authenticated user) or not."""
        self.ctrl.requester_admission(
            RequesterAdmission(enforced, "checked by the test", self.clock())
        )

    # -- demand -----------------------------------------------------------------------

    def queue(
        self, name: str, *, gpus: int = 0, vcpus: int = 1, ram: str = "1Gi", wake: str | None = None
    ) -> str:
        """A queued container (a ContainerDispatch in the API, and in the dispatcher's next
        plan); `wake`: the plan waits for side node `wake` to come up for it. Returns its
        uuid (`uuid(name)`)."""
        uuid = container_uuid(name)
        resources = {"vcpus": vcpus, "ram": ram, "gpus": gpus}
        self.kube.put(
            CONTAINER_DISPATCH,
            NS,
            {"metadata": {"name": uuid}, "spec": {"uuid": uuid, "resources": resources}},
        )
        self.containers[uuid] = ContainerView(
            uuid, Phase.QUEUED, 500, self.clock(), ContainerResources.model_validate(resources)
        )
        self._wakes[uuid] = wake
        self.plan()
        return uuid

    def place(self, name: str, node: str) -> None:
        """The dispatcher chose `node` for container `name` (Locked on it)."""
        uuid = container_uuid(name)
        c = self.containers[uuid]
        self.containers[uuid] = ContainerView(
            c.uuid, Phase.LOCKED, c.priority, c.first_seen, c.resources, node=node
        )
        self.kube.objects[(CONTAINER_DISPATCH.kind, NS, uuid)]["status"] = {"phase": "Locked"}
        self.plan()

    def finish(self, name: str) -> None:
        """Container `name` is gone from the queue (complete or cancelled)."""
        uuid = container_uuid(name)
        self.containers.pop(uuid, None)
        self.kube.objects.pop((CONTAINER_DISPATCH.kind, NS, uuid), None)
        self.plan()

    def plan(self) -> None:
        """Hand the controller the dispatcher's plan of the containers now."""
        self.plans += 1
        self._plan_key = (
            tuple(self.containers.values()),
            tuple(sorted(self._wakes.items(), key=str)),
        )
        wakes: dict[str, list[str]] = {}
        for uuid, node in self._wakes.items():
            c = self.containers.get(uuid)
            if node is not None and c is not None and c.phase is Phase.QUEUED:
                wakes.setdefault(node, []).append(uuid)
        self.ctrl.planned(list(self.containers.values()), Plan(wakes=wakes), self.clock())

    # -- observations -------------------------------------------------------------------

    def report(self, name: str) -> ProbeReport:
        """A probe of `name`'s host now, as the SSH prober reports it."""
        host = self.hosts[name]
        now = self.clock()
        src = f"ssh nodewarden@127.0.0.1:2222 ({name})"
        ready = host.is_ready(now)
        return ProbeReport(
            node=name,
            endpoint="127.0.0.1:2222",
            started_at=now,
            finished_at=now,
            ready=ReadyFact(name, "Ready" if ready else "Booting", 0 if ready else 1, "", now, src),
            runners=RunnersFact(
                name,
                tuple(RunnerProcess(100 + i, f"run-{i}", DISPATCHER) for i in range(host.runners)),
                now,
                src,
            )
            if ready
            else None,
            inhibitors=InhibitorsFact(
                name,
                tuple(Inhibitor(("shutdown",), who, "test", "block") for who in host.inhibitors),
                "busctl",
                now,
                src,
            ),
            uptime=UptimeFact(
                name, host.booted_at, (now - host.booted_at).total_seconds(), now, src
            ),
            host_uuid=HostUuidFact(name, host.host_uuid, None, now, src)
            if host.host_uuid is not None
            else None,
        )

    def probe(self, name: str) -> None:
        """The pool probes side node `name` now and reports it (an error while it is Off)."""
        host = self.hosts[name]
        host.settle(self.clock())
        now = self.clock()
        self._last_probe[name] = now
        fails = host.power != "On" or host.probe_fails
        if name in self.pool.snapshots:  # a VM: the pool's worker counts its probes
            old = self.pool.snapshots[name]
            self.worker(
                name,
                last_attempt=now,
                last_success=old.last_success if fails else now,
                attempts_since_success=old.attempts_since_success + 1 if fails else 0,
                attempts_total=old.attempts_total + 1,
            )
        snap = self.worker_snapshot(name)
        if fails:
            self.ctrl.probed(snap, None, SshError(name, "127.0.0.1:2222", "connection refused"))
            return
        self.ctrl.probed(snap, self.report(name), None)

    def worker_snapshot(self, name: str) -> WorkerSnapshot:
        snap = self.pool.snapshots.get(name)
        if snap is not None:
            return snap
        host = self.hosts[name]
        return WorkerSnapshot(
            name, True, host.booted_at, self.clock(), self.clock(), 0, 1, False, False,
            None, False, None,
        )  # fmt: skip

    def list_cloud(self) -> None:
        """The pool reads the cloud list: the VMs' snapshots and the instances."""
        now = self.clock()
        for name in list(self.vms):
            self.vms[name] = self.vms[name].model_copy(update={"observed_at": now})
            self.worker(name, listed_at=now)
        self.ctrl.listed(dict(self.vms), now)

    async def vm_gone(self, name: str) -> None:
        """VM `name`'s instance left the cloud list (destroyed)."""
        self.vms.pop(name, None)
        snap = self.pool.snapshots.pop(name)
        await self.ctrl.gone(snap, self.clock())

    def hold(self, name: str, refusal: Admission | None) -> None:
        if refusal is None:
            self.pool._holds.pop(name, None)
        else:
            self.pool._holds[name] = refusal
        self.ctrl.held(name, refusal)

    # -- rounds -------------------------------------------------------------------------

    def _list_due(self, now: datetime) -> bool:
        last = self._last_list
        if last is not None and (now - last).total_seconds() < self.probe_interval:
            return False
        self._last_list = now
        return True

    async def settle(self) -> None:
        """Let every task the controller spawned run to its end."""
        me = asyncio.current_task()
        for _ in range(50):
            pending = [t for t in asyncio.all_tasks() if t is not me and not t.done()]
            if not pending:
                return
            await asyncio.wait(pending, timeout=5.0)

    def forget_seen(self, kind: str) -> None:
        """The informer hands every object of `kind` over again at the next round (a watch
        that delivered late)."""
        for key in [k for k in self._seen if k[0] == kind]:
            del self._seen[key]

    def _echo(self) -> None:
        """The informer: what was written comes back to the controller."""
        for body in self.kube.changed(WORKER_NODE.kind, self._seen):
            self.ctrl.observe_node(body)
        for body in self.kube.changed(POWER_INTENT.kind, self._seen):
            self.ctrl.observe_intent(body)

    async def round(self) -> None:
        """One round of the controller, with the pool's periodic probes due now."""
        now = self.clock()
        for host in self.hosts.values():
            host.settle(now)
        asked = set(self.pool.probe_requests)
        self.pool.probe_requests.clear()
        for name in self.hosts:
            if (WORKER_NODE.kind, NS, name) not in self.kube.objects:
                continue
            last = self._last_probe.get(name)
            due = last is None or (now - last).total_seconds() >= self.probe_interval
            asked_now = name in asked and self.answer_probe_requests
            if name in self.silent:
                continue
            if (due or asked_now) and self.ctrl.should_probe(name):
                self.probe(name)
        key = (tuple(self.containers.values()), tuple(sorted(self._wakes.items(), key=str)))
        if self.recovering:
            pass
        elif not self.plan_changes or key != self._plan_key:
            self.plan()  # the dispatcher plans every round of its own
        else:
            self.ctrl.plan_unchanged(now)
        self._acknowledge_closed(now)
        for name in list(self.vms):
            if self.hosts[name].power == "Off":  # destroyed: it leaves the cloud list
                await self.vm_gone(name)
        if self.vms and (self.pool.sync_requests or self._list_due(now)):
            self.pool.sync_requests = 0
            self.list_cloud()
        await self.settle()
        await self.ctrl.round()
        await self.settle()
        self._echo()
        await self.settle()

    def _acknowledge_closed(self, now: datetime) -> None:
        """The dispatcher's acknowledgement of a closed admission (`acknowledge_after`)."""
        if self.acknowledge_after is None:
            return
        board = self.board
        for node, closed in list(board.closing.items()):
            if (now - closed).total_seconds() >= self.acknowledge_after:
                board.acknowledge(node, now)

    async def start(self) -> None:
        """The controller has the whole fleet (`start`), then its first round. A harness
        on another's `kube` (a second replica) first reads every object there, as its
        informers' first LIST would."""
        self._echo()
        await self.settle()
        await self.ctrl.start()
        await self.round()

    async def run_until(
        self,
        cond: Callable[[], bool],
        within: float = 300.0,
        tick: float = 1.0,
        what: str = "",
    ) -> float:
        """Rounds, `tick` fake seconds apart, until `cond()` holds; the fake seconds it took.
        Fails after `within` fake seconds, showing every node's status."""
        start = self.clock()
        while True:
            await self.round()
            if cond():
                return (self.clock() - start).total_seconds()
            if (self.clock() - start).total_seconds() >= within:
                raise AssertionError(
                    f"not within {within}s of fake time: {what or cond}\n" + self.dump()
                )
            self.clock.advance(tick)

    async def run_for(self, seconds: float, tick: float = 1.0) -> None:
        """Rounds for `seconds` fake seconds."""
        end = self.clock() + timedelta(seconds=seconds)
        while self.clock() < end:
            await self.round()
            self.clock.advance(tick)
        await self.round()

    # -- what the test reads --------------------------------------------------------------

    def status(self, name: str) -> dict[str, Any]:
        return self.kube.status(WORKER_NODE, NS, name)

    def state(self, name: str) -> str | None:
        return self.status(name).get("state")

    def power_state(self, name: str) -> dict[str, Any]:
        return dict(self.status(name).get("powerState") or {})

    def record(self, name: str) -> dict[str, Any]:
        """The WorkerNode's last Safety Record summary."""
        return dict(self.status(name).get("lastSafetyRecord") or {})

    def reasons(self, name: str) -> list[str]:
        return list(self.record(name).get("reasons") or [])

    def decision(self, name: str) -> str | None:
        return self.record(name).get("decision")

    def intents(self, node: str | None = None) -> list[dict[str, Any]]:
        """PowerIntents in creation order (of `node`, when given)."""
        out = [
            copy.deepcopy(obj)
            for (k, _, _), obj in self.kube.objects.items()
            if k == POWER_INTENT.kind
            and (node is None or (obj.get("spec") or {}).get("nodeName") == node)
        ]
        return sorted(out, key=lambda o: str(o["metadata"].get("creationTimestamp") or ""))

    def intent_status(self, name: str) -> dict[str, Any]:
        return self.kube.status(POWER_INTENT, NS, name)

    def events(self, node: str | None = None) -> list[dict[str, Any]]:
        return [e for e in self.kube.events if node is None or e["name"] == node]

    def history(self, node: str) -> list[tuple[str, tuple[str, ...]]]:
        """Every (decision, reasons) the node's Events announced, in order."""
        out = []
        for e in self.events(node):
            msg = e["message"]
            if "[" in msg and "]" in msg:
                decision = msg.split(" ", 1)[0]
                codes = msg[msg.index("[") + 1 : msg.index("]")]
                out.append((decision, tuple(c for c in codes.split(",") if c)))
        return out

    def dump(self) -> str:
        lines = []
        for (k, _, name), obj in sorted(self.kube.objects.items()):
            if k == WORKER_NODE.kind:
                st = obj.get("status") or {}
                lines.append(
                    f"  {name}: state={st.get('state')} power={st.get('observedPower')} "
                    f"record={st.get('lastSafetyRecord', {}).get('decision')} "
                    f"{st.get('lastSafetyRecord', {}).get('reasons')}"
                )
        lines.append(
            f"  requests: {[(r.node, r.action, r.attempt) for r in self.control.requests]}"
        )
        return "\n".join(lines)
