"""The node contract: every command nodewarden runs on a worker over SSH, and what it expects back.

This is the whole interface between the operator and a worker node. A real node meets it
with stock tools (systemd, busctl, ethtool, /proc) plus one small program, the *runner*;
the stub worker among the test doubles implements exactly this contract for tests and demos.

Ready probe (default ``systemctl is-system-running``)
    Exit status 0 means the node is ready for work; any other status means still booting
    (or degraded / broken: the node never becomes ready). The first line of stdout is
    kept as detail (``running``, ``starting``, ``degraded``...). Configurable, as in
    Arvados (BootProbeCommand).

Instance-secret proof (default ``cat /var/run/nodewarden-instance-secret``)
    Used only to trust a host key on first use: the cloud-init user-data writes the
    per-instance secret to this file; the operator compares stdout (stripped) with the
    secret it generated, in constant time. Nothing else is run on a connection until the
    proof passes, and the output is never logged.

Runner (default program ``nodewarden-runner``; Arvados calls its equivalent crunch-run)
    ``RUNNER run --detach [--dispatcher-id ID] [--uid UID] [--fence N]``
        stdin: one JSON object, the ContainerDispatch spec in wire form (camelCase; must
        carry ``uuid``). Starts the container in the background and prints its runner
        pid as one decimal line on stdout, exit 0. Idempotent: if a runner for that
        uuid is already running it prints the existing pid and exits 0. Any other exit
        status means the runner could not start (stderr says why).
        The runner records the options with the run: ``--dispatcher-id`` (the owner: the
        operator install that started it), ``--uid`` (the ContainerDispatch's
        ``metadata.uid``) and ``--fence`` (the owner's fencing token). A run without them
        (an older operator) has no owner.
    ``RUNNER --kill SIGNAL UUID [--dispatcher-id ID] [--fence N]``
        Sends SIGNAL (a name such as TERM/KILL/INT, or its number) to the runner of UUID.
        Exit 0 whether or not it was still running (idempotent); exit 2 on bad usage.
    Fencing (``run`` and ``--kill``)
        The runner keeps, per dispatcher id, the highest ``--fence`` it has seen (on
        disk: it outlives a reboot). A command whose token is lower than that is refused
        with exit status 3 (``RUNNER_FENCED``) and changes nothing: it comes from a
        replica that lost its leadership to one that has already acted on this node.
        Tokens of different dispatcher ids are never compared.
    ``RUNNER --list``
        One line per running container: ``<pid> <uuid>``, then the recorded owner as
        ``key=value`` fields: ``dispatcher=<id> uid=<uid> fence=<n>`` (each only when
        recorded; unknown keys are ignored, so the contract can grow). Empty output =
        none. Exit 0. A line ``<pid> <uuid>`` alone (an older runner, or a run started
        without ``--dispatcher-id``) has no owner: nodewarden never kills such a runner,
        it only reports it (the WorkerNode's ``RunnersOwned`` condition and
        ``nodewarden_unowned_runners``). A dispatcher kills only runners of its own id.
        A line consisting of the word ``broken`` means the runner has found the node
        unusable (e.g. its container engine is down): nodewarden drains the node (no new
        work) and shuts it down once its containers are gone.
    ``RUNNER --status UUID``
        One line of JSON, exit 0::

            {"uuid": "...", "state": "running|exited|killed|lost|unknown",
             "pid": 1234|null, "exitCode": 0|null, "signal": "TERM"|null,
             "dispatcherId": "..."|null, "uid": "..."|null, "fence": 7|null}

        ``exited`` = the container finished with exitCode; ``killed`` = ended by signal;
        ``lost`` = the runner died without recording an outcome (crash); ``unknown`` = no
        record of that uuid on this node (e.g. after a reboot). A runner that is not in
        ``--list`` and is ``lost``/``unknown`` exited without finishing its container.
        ``dispatcherId``/``uid``/``fence`` are what ``run`` recorded (absent or null:
        not recorded).

    ``RUNNER --watch --heartbeat N``
        Long-lived (the operator keeps it running on its kept connection): prints the
        node's runner list and ready state as one JSON line at once and again on every
        change, and a heartbeat line every N seconds (N from the operator, default 10)
        while nothing changes; never exits on its own. Versioned lines
        (`nodewarden.ssh.watchlines`)::

            {"v":1,"kind":"state","ready":true,"detail":"running","broken":false,
             "runners":["<pid> <uuid> dispatcher=<id> uid=<uid> fence=<n>", ...]}
            {"v":1,"kind":"heartbeat"}

        ``runners`` holds ``--list`` lines (same owner fields); ``ready``/``detail`` are
        what the ready probe would say; ``broken`` as the ``broken`` line of ``--list``.
        Lines of another version are errors; v1 lines of an unknown kind are skipped. A
        runner program without ``--watch`` (older) exits at once with a usage error (exit
        2; any exit before the first line counts the same): the operator then uses the
        ready probe and ``--list`` for a while.

Inhibitors
    Primary: ``busctl --json=short call org.freedesktop.login1 /org/freedesktop/login1
    org.freedesktop.login1.Manager ListInhibitors`` (systemd >= 240) printing
    ``{"type":"a(ssssuu)","data":[[[what, who, why, mode, uid, pid], ...]]}``.
    Fallback when that fails: ``systemd-inhibit --list --no-pager`` (table with a
    ``WHO UID USER PID COMM WHAT WHY MODE`` header, ``No inhibitors.`` when empty, or the
    old ``Who:/What:/Why:/Mode:`` block format). Empty output with exit 0 = no inhibitors.
    If both fail the inhibitors are *unknown*, never "none".

Wake-on-LAN capability: ``ethtool IFACE``
    ``Supports Wake-on: pumbg`` and ``Wake-on: g`` lines (``d`` = disabled). Lines absent
    = the driver reports no Wake-on-LAN; ``Cannot get wake-on-lan settings`` = unknown
    (needs CAP_NET_ADMIN).

Telemetry (default below)
    Line 1 is ``/proc/loadavg``; each further line is ``<gpu index>, <utilisation %>``
    from nvidia-smi (``[N/A]`` allowed). No further lines = no GPU tool on the node.

Uptime: ``cat /proc/uptime``
    First field = seconds since the node booted (``12345.67 45678.90``). The boot time
    (when the command ran minus that) is the evidence for the policy's minOn.

Machine identity: ``cat /sys/class/dmi/id/product_uuid``
    The DMI (SMBIOS) product UUID, one line (``4c4c4544-0042-4810-8052-b4c04f4d3332``),
    the same UUID the machine's BMC reports as ``ComputerSystem.UUID``: before a BMC may
    switch the node off, the two must match (compared case-insensitively), proving that
    the BMC manages the host whose work and inhibitors were read. The file is readable by
    root only: a login that is not root needs one sudo rule (docs/operations.md) and the
    command ``sudo -n cat /sys/class/dmi/id/product_uuid`` (setting
    ``ssh.product_uuid_command``). A failing command means "unreadable", never a match.

Power-off: ``systemctl poweroff``
    Only a *request*: the connection may drop before an exit status arrives. Observed
    power comes from elsewhere (Redfish, cloud), never from this command.
"""

from __future__ import annotations

import re

DEFAULT_READY_COMMAND = "systemctl is-system-running"
INSTANCE_SECRET_PATH = "/var/run/nodewarden-instance-secret"
DEFAULT_INSTANCE_SECRET_COMMAND = f"cat {INSTANCE_SECRET_PATH}"
DEFAULT_RUNNER = "nodewarden-runner"
BUSCTL_LIST_INHIBITORS = (
    "busctl --json=short call org.freedesktop.login1 /org/freedesktop/login1 "
    "org.freedesktop.login1.Manager ListInhibitors"
)
SYSTEMD_INHIBIT_LIST = "systemd-inhibit --list --no-pager"
DEFAULT_ETHTOOL_COMMAND = "ethtool {iface}"
DEFAULT_TELEMETRY_COMMAND = (
    "cat /proc/loadavg && "
    "(nvidia-smi --query-gpu=index,utilization.gpu --format=csv,noheader,nounits "
    "2>/dev/null || true)"
)
DEFAULT_POWEROFF_COMMAND = "systemctl poweroff"
UPTIME_COMMAND = "cat /proc/uptime"
DEFAULT_PRODUCT_UUID_COMMAND = "cat /sys/class/dmi/id/product_uuid"

RUNNER_STATES = ("running", "exited", "killed", "lost", "unknown")

RUNNER_FENCED = 3
"""Exit status of ``run``/``--kill`` refused for a fencing token below the highest seen."""

DISPATCHER_ID = re.compile(r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$")
"""A dispatcher id on the runner's command line (the operator config's DNS label)."""

OBJECT_UID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,63}$")
"""A Kubernetes ``metadata.uid`` (a UUID in practice) on the runner's command line."""

SIGNALS: dict[str, int] = {
    "HUP": 1,
    "INT": 2,
    "QUIT": 3,
    "KILL": 9,
    "USR1": 10,
    "USR2": 12,
    "TERM": 15,
}
"""Signals the runner contract accepts by name (numbers are accepted too)."""

CONTAINER_UUID = re.compile(
    r"^(?:[a-z0-9]{5}-[a-z0-9]{5}-[a-z0-9]{15}|"
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})$"
)
"""Same forms as ContainerDispatchSpec.uuid; anything else never reaches a shell."""

INTERFACE_NAME = re.compile(r"^[A-Za-z0-9_.:@-]{1,15}$")
"""A Linux network interface name (IFNAMSIZ-1 characters, no shell metacharacters)."""


def owner_options(
    dispatcher_id: str | None, uid: str | None = None, fence: int | None = None
) -> list[str]:
    """The ``--dispatcher-id``/``--uid``/``--fence`` options of ``run`` and ``--kill``
    (ValueError for a value that may not reach a shell)."""
    out: list[str] = []
    if dispatcher_id is not None:
        if not DISPATCHER_ID.match(dispatcher_id):
            raise ValueError(f"dispatcher id {dispatcher_id!r} is not a DNS label")
        out += ["--dispatcher-id", dispatcher_id]
    if uid is not None:
        if not OBJECT_UID.match(uid):
            raise ValueError(f"object uid {uid!r} is not a Kubernetes uid")
        out += ["--uid", uid]
    if fence is not None:
        if isinstance(fence, bool) or not isinstance(fence, int) or fence < 0:
            raise ValueError(f"fencing token {fence!r} is not a non-negative integer")
        out += ["--fence", str(fence)]
    return out


def signal_name(signal: str | int) -> str:
    """Normalise a signal ("SIGTERM", "term", 15, "15") to its contract name ("TERM")."""
    if isinstance(signal, int) or (isinstance(signal, str) and signal.isdigit()):
        number = int(signal)
        for name, value in SIGNALS.items():
            if value == number:
                return name
        raise ValueError(f"unsupported signal number {number}; use one of {sorted(SIGNALS)}")
    name = signal.upper().removeprefix("SIG")
    if name not in SIGNALS:
        raise ValueError(f"unsupported signal {signal!r}; use one of {sorted(SIGNALS)}")
    return name
