"""Stub worker nodes: in-process asyncssh servers on 127.0.0.1 that imitate a worker over real SSH.

Each `StubWorker` implements the node contract documented in `nodewarden.ssh.protocol`
(the contract a real node must meet), answering:

- the ready command (``systemctl is-system-running``): ``starting`` / exit 1 during the
  boot delay, then ``running`` / exit 0; ``degraded`` / exit 1 forever when broken;
- the instance-secret proof (``cat /var/run/nodewarden-instance-secret``);
- the runner (``nodewarden-runner``): ``run --detach`` (JSON config on stdin → pid),
  ``--list`` (``<pid> <uuid> dispatcher=… uid=… fence=…`` lines), ``--kill SIGNAL UUID``,
  ``--status UUID`` (one JSON line: running / exited + exitCode / killed + signal / lost /
  unknown, with the recorded owner); ``run`` and ``--kill`` take ``--dispatcher-id``,
  ``--uid`` and ``--fence`` and refuse a token below the highest seen (exit 3). A fake
  container "runs" for ``runtime.durationHintSeconds`` and ends with
  ``runtime.exitCodeHint``; `FakeRunner.ledger()` records every run's start and end;
- ``RUNNER --watch [--heartbeat N]`` (`nodewarden.ssh.watchlines`): the state line at
  once and on every change (a start or kill at once; a container's end or the boot's end
  when the worker's clock reaches it, or on `StubWorker.notify_change()`), a heartbeat
  every N seconds of the ``sleep`` the worker was given; ``watch_supported=False`` is an
  older runner without it (usage error, exit 2); `StubWorker.end_watches()` kills it and
  the ``watch_silent`` fault stops its lines;
- ``busctl --json=short call ... ListInhibitors`` JSON and ``systemd-inhibit --list`` text;
- ``ethtool IFACE`` text with the configured Wake-on-LAN support and mode;
- the telemetry command (``/proc/loadavg`` + nvidia-smi lines when GPUs are configured);
- ``cat /proc/uptime``: seconds since boot (since `start()`, or its ``booted_at``) and
  idle seconds, as Linux prints them (``12345.67 22222.21``);
- ``systemctl poweroff`` / ``poweroff``: answers, then drops off the network
  (`power_off()`: the ``on_poweroff`` callback is told; `lose_power()` is the same power
  loss caused from outside, without the callback).

Faults (`StubFaults`, changeable on a live worker): hang on connect, freeze (open
connections stop being read, as in a partition), hung commands, slow commands, refused
auth, wrong host key, broken ready, runner crash rate, runner start failures, ethtool
without permission. Rates use a seeded ``random.Random``.

Usage::

    worker = StubWorker(StubWorkerConfig(authorized_keys=(client_key.public_key,)))
    port = await worker.start()       # 127.0.0.1:port
    ...
    await worker.stop()
"""

from __future__ import annotations

from nodewarden_doubles.stubworker.config import StubFaults, StubWorkerConfig
from nodewarden_doubles.stubworker.runner import FakeContainer, FakeRunner, RunnerRefused
from nodewarden_doubles.stubworker.server import StubWorker

__all__ = [
    "FakeContainer",
    "FakeRunner",
    "RunnerRefused",
    "StubFaults",
    "StubWorker",
    "StubWorkerConfig",
]
