"""Text the stub node prints, in the formats of the real tools (busctl, systemd-inhibit, ethtool, /proc)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from nodewarden.ssh.facts import Inhibitor


def busctl_inhibitors(inhibitors: Sequence[Inhibitor]) -> str:
    """As ``busctl --json=short call ... ListInhibitors`` prints it."""
    rows = [[":".join(i.what), i.who, i.why, i.mode, i.uid or 0, i.pid or 0] for i in inhibitors]
    return json.dumps({"type": "a(ssssuu)", "data": [rows]}, separators=(",", ":")) + "\n"


def _user(uid: int) -> str:
    return "root" if uid == 0 else f"user{uid}"


def systemd_inhibit_list(inhibitors: Sequence[Inhibitor]) -> str:
    """As ``systemd-inhibit --list`` (systemd's table format) prints it."""
    if not inhibitors:
        return "No inhibitors.\n"
    header = ["WHO", "UID", "USER", "PID", "COMM", "WHAT", "WHY", "MODE"]
    rows = [
        [
            i.who,
            str(i.uid or 0),
            _user(i.uid or 0),
            str(i.pid or 0),
            (i.who.split()[0].lower() if i.who.split() else "unknown")[:15],
            ":".join(i.what),
            i.why,
            i.mode,
        ]
        for i in inhibitors
    ]
    widths = [max(len(r[c]) for r in [header, *rows]) for c in range(len(header))]

    def line(cells: list[str]) -> str:
        return " ".join(cell.ljust(w) for cell, w in zip(cells, widths, strict=True)).rstrip()

    body = "\n".join(line(r) for r in [header, *rows])
    return f"{body}\n\n{len(rows)} inhibitors listed.\n"


def ethtool(interface: str, supported: str, enabled: str, permission_denied: bool) -> str:
    """As ``ethtool IFACE`` prints it (Wake-on lines only when the driver offers WoL)."""
    lines = [
        f"Settings for {interface}:",
        "\tSupported ports: [ TP ]",
        "\tSupported link modes:   10baseT/Half 10baseT/Full",
        "\t                        100baseT/Half 100baseT/Full",
        "\t                        1000baseT/Full",
        "\tSupported pause frame use: No",
        "\tSupports auto-negotiation: Yes",
        "\tSpeed: 1000Mb/s",
        "\tDuplex: Full",
        "\tAuto-negotiation: on",
        "\tPort: Twisted Pair",
        "\tPHYAD: 1",
        "\tTransceiver: internal",
        "\tMDI-X: on (auto)",
    ]
    if permission_denied:
        lines.append("Cannot get wake-on-lan settings: Operation not permitted")
    elif supported:
        lines.append(f"\tSupports Wake-on: {supported}")
        lines.append(f"\tWake-on: {enabled or 'd'}")
    lines += [
        "\tCurrent message level: 0x00000007 (7)",
        "\t\t\t       drv probe link",
        "\tLink detected: yes",
    ]
    return "\n".join(lines) + "\n"


def loadavg(load: tuple[float, float, float], running: int, last_pid: int) -> str:
    """A /proc/loadavg line."""
    return f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f} {running + 1}/{100 + running} {last_pid}\n"


def proc_uptime(seconds: float, cpus: int = 2, idle_share: float = 0.9) -> str:
    """A /proc/uptime line: seconds since boot, then idle seconds summed over all CPUs."""
    return f"{seconds:.2f} {seconds * cpus * idle_share:.2f}\n"


def gpu_lines(utilisation: Sequence[float | None]) -> str:
    """As ``nvidia-smi --query-gpu=index,utilization.gpu --format=csv,noheader,nounits``."""
    return "".join(
        f"{index}, {'[N/A]' if u is None else f'{u:g}'}\n" for index, u in enumerate(utilisation)
    )
