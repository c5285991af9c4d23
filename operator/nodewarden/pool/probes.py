"""The pool's probes: where each node answers SSH, the probe loop of each worker, and
what a probe's result changes in the worker (readiness, runners, host key, tags).

Every instance is probed with a kept-alive SSH connection (booting nodes more often);
a cloud VM is tagged with the probe time at most every `probe_tag_interval` (the tag a
dispatcher elsewhere reads before it takes the VM over). The power controller hears
each result through `observer.probed` (a `WorkerSnapshot`, never the worker).

Probes that push (``ssh.stream``, default on): beside its probe loop each worker has a
stream loop that keeps ``RUNNER --watch`` running on the node's connection
(`nodewarden.ssh.stream`). While the stream is up no command is run for the runner list
or the ready state unless one is asked for (`request_probe`, e.g. a drain's fresh
reading; nothing asks at rest): each pushed change and each heartbeat (every ``ssh.stream_heartbeat``
seconds) is folded in as a probe result, observed when its line arrived. A side node's
inhibitors, boot time and product UUID are still polled every `probe_interval` (one
bundle, throttled, with the streamed facts). A node whose runner has no ``--watch``
(`WatchUnsupported`) is probed with the command pair and not asked again for
``ssh.stream_unsupported_retry`` seconds. A stream that stops (channel closed, no line
for 3 heartbeats) refreshes nothing: its facts age by the usual freshness rules while it
is reopened with backoff (doubling up to ``ssh.stream_reconnect_max``; a booting node's
at most `boot_probe_interval`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from datetime import datetime

from nodewarden.cloud.errors import CloudError
from nodewarden.credentials import Refusal
from nodewarden.metrics import PROBE_SECONDS, UNOWNED_RUNNERS
from nodewarden.pool.context import PoolContext
from nodewarden.pool.identity import instance_secret
from nodewarden.pool.probetag import tag_due, tag_interval
from nodewarden.pool.times import iso, parse_time
from nodewarden.pool.worker import PoolState, Worker
from nodewarden.ssh.credentials import InstanceSecretTrust, KnownHostKeys, SshTarget
from nodewarden.ssh.errors import SshError
from nodewarden.ssh.facts import LearnedHostKey, ProbeReport, RunnerProcess
from nodewarden.ssh.stream import StreamedFacts, WatchUnsupported

log = logging.getLogger(__name__)

REFUSED_RECHECK = 60.0
"""Seconds between credential checks of a side node whose SSH login is refused."""


STREAM_FIRST_BACKOFF = 1.0
"""Seconds before a stopped stream is first reopened (then doubling)."""


@dataclass(slots=True)
class NodeStream:
    """The watch stream of one worker, as the probe loops see it."""

    task: asyncio.Task[None] | None = None
    facts: StreamedFacts | None = None
    """The latest streamed facts while the stream is up; None while it is down."""
    unsupported_until: float | None = None
    """Monotonic time until which this node is probed with commands (no --watch)."""


@dataclass(slots=True)
class StreamCounters:
    """What the streams brought, for tests and benchmarks (counted, not timed)."""

    opened: int = 0
    changes: int = 0
    heartbeats: int = 0
    stopped: int = 0
    unsupported: int = 0


class ProbeLoop:
    """Probes the pool's workers (one loop per worker) and folds in what they find."""

    def __init__(self, ctx: PoolContext) -> None:
        self.ctx = ctx
        self.streams: dict[str, NodeStream] = {}
        self.stream_counters = StreamCounters()

    async def target(self, worker: Worker) -> SshTarget | None:
        """Where and how to reach `worker` over SSH now, or None. Side nodes: through the
        credential resolver with the node's spec as it is at this moment (admitted
        address, designated key and known_hosts); a refusal is kept in
        `worker.target_refusal` and nothing is dialled."""
        if worker.side:
            return await self._side_target(worker)
        inst = worker.instance
        if inst is None or self.ctx.cloud is None or self.ctx.client_key is None:
            return None
        host = inst.address(self.ctx.cloud_.config.use_public_ip)
        if host is None:
            return None
        port = self.ctx.cloud_.config.ssh_port
        trust: KnownHostKeys | InstanceSecretTrust
        # The key learned on first use in this process stays pinned in the prober, so the
        # same trust object is kept (changing it would reopen the connection); after a
        # restart the key recorded in status.sshHostKey is trusted instead.
        if worker.host_key and self.ctx.prober.pinned_host_key(worker.name) is None:
            trust = KnownHostKeys.for_key(host, port, worker.host_key)
        else:
            nonce = inst.tags.get(self.ctx.tags.secret_nonce)  # None: made before nonces
            trust = InstanceSecretTrust(instance_secret(self.ctx.master, worker.name, nonce))
        return SshTarget(
            node=worker.name,
            host=host,
            client_key=self.ctx.client_key,
            trust=trust,
            port=port,
            user=self.ctx.settings.ssh_user,
        )

    async def _side_target(self, worker: Worker) -> SshTarget | None:
        spec = worker.spec
        if spec is None or self.ctx.credentials is None:
            worker.target_refusal = "no usable spec or no credential resolver"
            return None
        creds = await self.ctx.credentials.ssh(worker.name, spec)
        if isinstance(creds, Refusal):
            if worker.target_refusal != creds.message:
                log.info("WorkerNode %s: no SSH: %s", worker.name, creds.message)
            worker.target_refusal = creds.message
            return None
        worker.target_refusal = None
        return creds.target(worker.name)

    def ensure(self, worker: Worker) -> None:
        if self.ctx.closing or not worker.probing:
            return
        if worker.probe_task is None or worker.probe_task.done():
            worker.probe_task = asyncio.ensure_future(self._probe_loop(worker))
        if self._streams_on():
            stream = self.streams.setdefault(worker.name, NodeStream())
            if stream.task is None or stream.task.done():
                stream.task = asyncio.ensure_future(self._stream_loop(worker, stream))

    def ensure_probes(self) -> None:
        for worker in self.ctx.workers.values():
            if worker.instance is not None or worker.side:
                self.ensure(worker)

    async def _probe_loop(self, worker: Worker) -> None:
        # A probe asked for at once (`request_probe`) still waits this long after the last
        # one, so a caller that asks after every result cannot make probes spin.
        min_gap = min(self.ctx.settings.boot_probe_interval, 1.0)
        asked = False
        while not self.ctx.closing and worker.probing:
            wanted = not worker.side or self.ctx.observer.should_probe(worker.name)
            stream = self._streaming(worker)
            if wanted and (stream is None or asked):
                # asked for (`request_probe`: a drain's or verification's fresh reading,
                # a signalled runner, an edit): the command pair now, even on a streaming
                # node, whose next heartbeat may be seconds away; at rest nobody asks
                await self.probe_once(worker)
            elif wanted and worker.side and stream is not None and stream.facts is not None:
                # the stream carries runners and readiness; the rest still polls
                await self.probe_once(worker, streamed=stream.facts)
            interval = (
                self.ctx.settings.probe_interval
                if worker.ready
                else self.ctx.settings.boot_probe_interval
            )
            if worker.side and not wanted:
                # Off by its trusted power source: nothing answers SSH; the controller asks
                # (`request_probe`) when it wants readiness, this is only the safety net
                interval = self.ctx.settings.probe_interval
            elif worker.side and not worker.reachable:
                # its login is refused: nothing is dialled until the spec changes (`take`
                # asks for a probe then) or a designated Secret may have (this interval)
                interval = max(self.ctx.settings.probe_interval, REFUSED_RECHECK)
            worker.probe_now.clear()
            await asyncio.sleep(min(min_gap, interval))
            asked = worker.probe_now.is_set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    worker.probe_now.wait(), timeout=max(0.0, interval - min_gap)
                )
                asked = True

    def _streams_on(self) -> bool:
        """``ssh.stream`` of the prober (a prober double without settings never streams)."""
        settings = getattr(self.ctx.prober, "settings", None)
        return bool(getattr(settings, "stream", False))

    def _streaming(self, worker: Worker) -> NodeStream | None:
        """The worker's stream when it carries (or is about to carry) the runner list and
        ready state; None: probe them with commands (streams off, or no --watch)."""
        if not self._streams_on():
            return None
        stream = self.streams.get(worker.name)
        if stream is None or stream.task is None or stream.task.done():
            return None
        if stream.unsupported_until is not None and time.monotonic() < stream.unsupported_until:
            return None
        return stream

    async def _stream_loop(self, worker: Worker, stream: NodeStream) -> None:
        """Keep the worker's watch stream open and fold in what it pushes (see the module)."""
        settings = self.ctx.settings
        backoff = STREAM_FIRST_BACKOFF
        while not self.ctx.closing and worker.probing and self._streams_on():
            ssh = self.ctx.prober.settings
            if stream.unsupported_until is not None:
                wait = stream.unsupported_until - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                    continue
                stream.unsupported_until = None
            wanted = not worker.side or self.ctx.observer.should_probe(worker.name)
            target = await self.target(worker) if wanted else None
            if target is None:
                await asyncio.sleep(settings.probe_interval)
                continue
            try:
                self.stream_counters.opened += 1
                async for facts in self.ctx.prober.watch(target):
                    backoff = STREAM_FIRST_BACKOFF
                    stream.facts = facts
                    self._streamed(worker, target.address, facts)
            except WatchUnsupported as exc:
                stream.facts = None
                self.stream_counters.unsupported += 1
                stream.unsupported_until = time.monotonic() + ssh.stream_unsupported_retry
                log.info(
                    "WorkerNode %s: no watch stream (%s); probing with commands for %gs",
                    worker.name,
                    exc.detail,
                    ssh.stream_unsupported_retry,
                )
                worker.probe_now.set()  # the command probes take over now
                continue
            except SshError as exc:
                self.stream_counters.stopped += 1
                if stream.facts is None:  # never came up: a failed probe, as before
                    self._probe_failed(worker, exc)
                log.debug("watch stream of %s stopped: %s", worker.name, exc)
            stream.facts = None  # nothing refreshes the facts now: they age
            cap = ssh.stream_reconnect_max if worker.ready else settings.boot_probe_interval
            await asyncio.sleep(min(backoff, cap))
            backoff = min(backoff * 2, ssh.stream_reconnect_max)

    def _streamed(self, worker: Worker, endpoint: str, facts: StreamedFacts) -> None:
        """Fold one streamed change or heartbeat in as a probe result."""
        if facts.changed:
            self.stream_counters.changes += 1
        else:
            self.stream_counters.heartbeats += 1
        report = ProbeReport(
            node=worker.name,
            endpoint=endpoint,
            started_at=facts.observed_at,
            finished_at=facts.observed_at,
            ready=facts.ready,
            runners=facts.runners,
            learned_host_key=self.ctx.prober.take_learned(worker.name),
        )
        self._fold(worker, report, changed=facts.changed)

    def _probe_failed(self, worker: Worker, exc: SshError) -> None:
        worker.attempts_since_success += 1
        worker.probe_result = exc.probe_result
        worker.probe_message = str(exc)[:300]
        log.debug("probe of %s failed: %s", worker.name, exc)
        self.ctx.observer.probed(self.ctx.snapshot_of(worker), None, exc)
        self.ctx.on_change()

    async def probe_once(
        self, worker: Worker, streamed: StreamedFacts | None = None
    ) -> ProbeReport | None:
        """Probe `worker` now (with `streamed`: only what its stream does not carry)."""
        target = await self.target(worker)
        if target is None:
            return None
        now = self.ctx.clock()
        worker.last_attempt = now
        worker.attempts_total += 1
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        try:
            # side nodes: the power gates need inhibitors and the boot time as well, and
            # those with a BMC the host's product UUID (one machine, one BMC)
            report = await self.ctx.prober.probe(
                target,
                inhibitors=worker.side,
                uptime=worker.side,
                host_uuid=worker.side and worker.spec is not None and worker.spec.bmc is not None,
                streamed=streamed,
            )
        except SshError as exc:
            PROBE_SECONDS.labels("error").observe(loop.time() - t0)
            self._probe_failed(worker, exc)
            return None
        PROBE_SECONDS.labels("ready" if report.ready.ready else "booting").observe(loop.time() - t0)
        self._fold(worker, report)
        return report

    def _fold(self, worker: Worker, report: ProbeReport, *, changed: bool = True) -> None:
        """What a probe result (or a streamed line) changes in the worker; the observer
        hears it. `changed=False` (a heartbeat): the same facts, fresher; no change hook."""
        worker.probe_result = "Ready" if report.ready.ready else "Booting"
        worker.probe_message = None if report.ready.ready else report.ready.detail[:300]
        if report.learned_host_key is not None:
            self._learned(worker, report.learned_host_key)
        if report.ready.ready:
            worker.last_success = report.finished_at
            worker.attempts_since_success = 0
            if not worker.ready and worker.move(PoolState.READY, "a probe found it ready"):
                log.info("WorkerNode %s is ready", worker.name)
            if report.runners is not None:
                worker.runners_listed(report.runners)
                self._report_unowned(worker, report.runners.unowned)
                if report.runners.broken and not worker.broken:
                    log.warning("the runner on %s reports the node broken; draining", worker.name)
                    worker.broken = True
            if not worker.side:
                # in the background: a tag write yields to pending creates and destroys
                # (cloud rate-limit priorities) and must not hold back the probe's result
                self.ctx.background(self._maybe_tag_probe(worker, report.finished_at))
        else:
            worker.attempts_since_success += 1
            if worker.side:  # a side node that powered off boots again
                worker.move(PoolState.BOOTING, "a probe found it not ready")
        self.ctx.observer.probed(self.ctx.snapshot_of(worker), report, None)
        if changed:
            self.ctx.on_change()

    def _report_unowned(self, worker: Worker, unowned: tuple[RunnerProcess, ...]) -> None:
        """Runners naming no owner are never killed; they are reported (the log once per
        change here; the WorkerNode's `RunnersOwned` condition by the power controller;
        `nodewarden_unowned_runners`)."""
        uuids = tuple(sorted(r.uuid for r in unowned))
        if uuids != worker.unowned_runners:
            if uuids:
                log.warning(
                    "WorkerNode %s runs %d runner(s) that name no owner (an older operator "
                    "or runner program): they are never killed; %s",
                    worker.name,
                    len(uuids),
                    ", ".join(uuids[:10]),
                )
            worker.unowned_runners = uuids
        UNOWNED_RUNNERS.set(sum(len(w.unowned_runners) for w in self.ctx.workers.values()))

    def _learned(self, worker: Worker, learned: LearnedHostKey) -> None:
        worker.host_key = learned.public_key
        log.info(
            "learned SSH host key of %s (%s %s) after it proved its instance secret",
            worker.name,
            learned.algorithm,
            learned.fingerprint,
        )

    async def _maybe_tag_probe(self, worker: Worker, now: datetime) -> None:
        if worker.instance is None:
            return
        interval = tag_interval(self.ctx.settings.probe_tag_interval, self.ctx.takeover_after())
        listed = parse_time(worker.instance.tags.get(self.ctx.tags.last_probe))
        if not tag_due(now, written_at=worker.last_tag_at, listed_stamp=listed, interval=interval):
            return
        tags = {
            **{k: v for k, v in worker.instance.tags.items() if self.ctx.tags.owns(k)},
            self.ctx.tags.last_probe: iso(now) or "",
            self.ctx.tags.idle_behavior: worker.idle_behavior,
        }
        tags.pop(self.ctx.tags.dispatcher, None)
        worker.last_tag_at = now  # remembered in memory even if tagging fails
        try:
            await self.ctx.cloud_.set_tags(worker.instance, tags)
        except CloudError as exc:
            log.info("tagging %s with its probe time failed: %s", worker.instance.id, exc)

    async def retag(self, worker: Worker) -> None:
        if worker.instance is None:
            return
        tags = {
            **{k: v for k, v in worker.instance.tags.items() if self.ctx.tags.owns(k)},
            self.ctx.tags.idle_behavior: worker.idle_behavior,
        }
        tags.pop(self.ctx.tags.dispatcher, None)
        with contextlib.suppress(CloudError):
            await self.ctx.cloud_.set_tags(worker.instance, tags)

    # --- probes -------------------------------------------------------------------------

    async def close(self) -> None:
        """Stop every probe loop and background task of the pool."""
        self.ctx.closing = True
        tasks = [w.probe_task for w in self.ctx.workers.values() if w.probe_task is not None]
        tasks += [s.task for s in self.streams.values() if s.task is not None]
        tasks += list(self.ctx.tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
