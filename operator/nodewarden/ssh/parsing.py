"""Pure parsers for the output of node commands (see `nodewarden.ssh.protocol`).

No I/O: each function takes the text a command printed and returns plain values, or
raises `OutputError` saying what was wrong. The prober turns those into facts and errors.
"""

from __future__ import annotations

import json
import re
from typing import Any

from nodewarden.ssh.facts import GpuSample, Inhibitor, RunnerProcess, RunnerState
from nodewarden.ssh.protocol import CONTAINER_UUID, DISPATCHER_ID, OBJECT_UID, RUNNER_STATES


class OutputError(ValueError):
    """The text does not have the form the node contract requires."""


class WakeOnLanUnreadable(OutputError):
    """ethtool said it could not read the Wake-on-LAN settings (not the same as unsupported)."""


_ELLIPSIS = ("…", "...")


def _excerpt(text: str, limit: int = 80) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[:limit] + "…"


def parse_runner_list(text: str) -> tuple[RunnerProcess, ...]:
    """``<pid> <uuid> [dispatcher=ID] [uid=UID] [fence=N] ...`` per line (unknown keys are
    ignored); blank lines and the ``broken`` marker ignored here (see
    `runner_list_says_broken`); anything else is an error."""
    runners: list[RunnerProcess] = []
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.split()
        if not fields or fields == ["broken"]:
            continue
        if len(fields) < 2 or not fields[0].isdigit() or not CONTAINER_UUID.match(fields[1]):
            raise OutputError(f"runner list line {number} is not '<pid> <uuid>': {line[:80]!r}")
        extra: dict[str, str] = {}
        for item in fields[2:]:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise OutputError(f"runner list line {number}: {item[:40]!r} is not 'key=value'")
            extra[key] = value
        owner = extra.get("dispatcher")
        uid = extra.get("uid")
        fence = extra.get("fence")
        if owner is not None and not DISPATCHER_ID.match(owner):
            raise OutputError(f"runner list line {number}: bad dispatcher id {owner[:40]!r}")
        if uid is not None and not OBJECT_UID.match(uid):
            raise OutputError(f"runner list line {number}: bad uid {uid[:40]!r}")
        if fence is not None and not fence.isdigit():
            raise OutputError(f"runner list line {number}: bad fence {fence[:40]!r}")
        runners.append(
            RunnerProcess(
                pid=int(fields[0]),
                uuid=fields[1],
                dispatcher_id=owner,
                uid=uid,
                fence=int(fence) if fence is not None else None,
            )
        )
    return tuple(runners)


def runner_list_says_broken(text: str) -> bool:
    """Whether ``RUNNER --list`` reported the node broken (a line ``broken``)."""
    return any(line.strip() == "broken" for line in text.splitlines())


def parse_runner_pid(text: str) -> int:
    """The single decimal pid line printed by ``RUNNER run --detach``."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) != 1 or not lines[0].isdigit():
        raise OutputError(f"expected one pid line, got {_excerpt(text)!r}")
    return int(lines[0])


def parse_runner_status(
    text: str, uuid: str
) -> tuple[RunnerState, int | None, int | None, str | None]:
    """``RUNNER --status UUID`` JSON → (state, pid, exit code, signal); the recorded
    owner comes from `parse_runner_owner`."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise OutputError(f"runner status is not JSON: {exc.msg}") from None
    if not isinstance(data, dict):
        raise OutputError("runner status is not a JSON object")
    if data.get("uuid") != uuid:
        raise OutputError(f"runner status is about {data.get('uuid')!r}, not {uuid!r}")
    state = data.get("state")
    if state not in RUNNER_STATES:
        raise OutputError(f"runner status has unknown state {state!r}")
    pid = _optional_int(data, "pid")
    exit_code = _optional_int(data, "exitCode")
    signal = data.get("signal")
    if signal is not None and not isinstance(signal, str):
        raise OutputError("runner status 'signal' must be a string or null")
    if state == "exited" and exit_code is None:
        raise OutputError("runner status 'exited' without an exitCode")
    result: RunnerState = state
    return result, pid, exit_code, signal


def parse_runner_owner(text: str) -> tuple[str | None, str | None]:
    """The (dispatcherId, uid) a ``RUNNER --status`` JSON line recorded (None: absent);
    call after `parse_runner_status` accepted the text."""
    data = json.loads(text)
    owner = data.get("dispatcherId")
    uid = data.get("uid")
    if owner is not None and (not isinstance(owner, str) or not DISPATCHER_ID.match(owner)):
        raise OutputError("runner status 'dispatcherId' is not a dispatcher id")
    if uid is not None and (not isinstance(uid, str) or not OBJECT_UID.match(uid)):
        raise OutputError("runner status 'uid' is not a Kubernetes uid")
    return owner, uid


def _optional_int(data: dict[str, Any], key: str) -> int | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise OutputError(f"runner status {key!r} must be an integer or null")
    return value


def parse_busctl_inhibitors(text: str) -> tuple[Inhibitor, ...]:
    """``busctl --json=short call ... ListInhibitors`` → inhibitors.

    Shape: ``{"type": "a(ssssuu)", "data": [[[what, who, why, mode, uid, pid], ...]]}``.
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise OutputError(f"busctl output is not JSON: {exc.msg}") from None
    if not isinstance(data, dict) or data.get("type") != "a(ssssuu)":
        raise OutputError("busctl output is not an a(ssssuu) reply")
    payload = data.get("data")
    if not isinstance(payload, list) or len(payload) != 1 or not isinstance(payload[0], list):
        raise OutputError("busctl reply 'data' must hold exactly one array")
    inhibitors: list[Inhibitor] = []
    for entry in payload[0]:
        if (
            not isinstance(entry, list)
            or len(entry) != 6
            or not all(isinstance(v, str) for v in entry[:4])
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in entry[4:])
        ):
            raise OutputError(f"busctl inhibitor entry has the wrong shape: {str(entry)[:80]}")
        what, who, why, mode, uid, pid = entry
        inhibitors.append(
            Inhibitor(what=_split_what(what), who=who, why=why, mode=mode, uid=uid, pid=pid)
        )
    return tuple(inhibitors)


def _split_what(what: str) -> tuple[str, ...]:
    return tuple(part for part in what.strip().split(":") if part)


_TABLE_COLUMNS = ("WHO", "UID", "USER", "PID", "COMM", "WHAT", "WHY", "MODE")
_FOOTER = re.compile(r"^\s*(\d+ inhibitors listed\.|No inhibitors\.)\s*$")
_BLOCK_FIELD = re.compile(r"^\s*(Who|What|Why|Mode):\s?(.*)$")
_BLOCK_WHO = re.compile(r"^(?P<who>.*?)\s*\(UID (?P<uid>\d+)/[^,]*, PID (?P<pid>\d+)/.*\)\s*$")


def parse_systemd_inhibit_list(text: str) -> tuple[Inhibitor, ...]:
    """``systemd-inhibit --list`` text → inhibitors. Empty output or 'No inhibitors.' = none.

    Handles the table format (systemd ≥ 230: a ``WHO UID USER PID COMM WHAT WHY MODE``
    header, text columns left-aligned) and the older ``Who:/What:/Why:/Mode:`` blocks.
    """
    lines = [line.rstrip() for line in text.splitlines()]
    content = [line for line in lines if line.strip() and not _FOOTER.match(line)]
    if not content:
        return ()
    header_index = next(
        (i for i, line in enumerate(content) if line.split() == list(_TABLE_COLUMNS)), None
    )
    if header_index is not None:
        return _parse_inhibit_table(content[header_index], content[header_index + 1 :])
    if any(_BLOCK_FIELD.match(line) for line in content):
        return _parse_inhibit_blocks(content)
    raise OutputError(f"systemd-inhibit output has no recognisable header: {_excerpt(text)!r}")


def _parse_inhibit_table(header: str, rows: list[str]) -> tuple[Inhibitor, ...]:
    # Text columns are left-aligned under their header; numeric ones may be right-aligned,
    # so WHO/UID/USER/PID are split from the right of the span before COMM.
    start = {name: header.index(name) for name in ("COMM", "WHAT", "WHY", "MODE")}
    inhibitors: list[Inhibitor] = []
    for row in rows:
        ids = row[: start["COMM"]].split()
        what_text = row[start["WHAT"] : start["WHY"]].strip()
        why = row[start["WHY"] : start["MODE"]].strip()
        mode = row[start["MODE"] :].strip()
        if len(ids) < 4 or not ids[-3].isdigit() or not ids[-1].isdigit() or not mode:
            raise OutputError(f"systemd-inhibit row does not fit the header: {row[:100]!r}")
        who = " ".join(ids[:-3])
        truncated = any(mark in row for mark in _ELLIPSIS)
        inhibitors.append(
            Inhibitor(
                what=_split_what(what_text),
                who=who,
                why=why,
                mode=mode.split()[0],
                uid=int(ids[-3]),
                pid=int(ids[-1]),
                truncated=truncated,
            )
        )
    return tuple(inhibitors)


def _parse_inhibit_blocks(lines: list[str]) -> tuple[Inhibitor, ...]:
    blocks: list[dict[str, str]] = []
    current: dict[str, str] = {}
    for line in lines:
        match = _BLOCK_FIELD.match(line)
        if not match:
            raise OutputError(f"unexpected line in systemd-inhibit output: {line[:100]!r}")
        key, value = match.group(1), match.group(2).strip()
        if key == "Who" and current:
            blocks.append(current)
            current = {}
        current[key] = value
    if current:
        blocks.append(current)
    inhibitors: list[Inhibitor] = []
    for block in blocks:
        if set(block) != {"Who", "What", "Why", "Mode"}:
            raise OutputError(f"incomplete systemd-inhibit entry: fields {sorted(block)}")
        who_match = _BLOCK_WHO.match(block["Who"])
        inhibitors.append(
            Inhibitor(
                what=_split_what(block["What"]),
                who=who_match.group("who") if who_match else block["Who"],
                why=block["Why"],
                mode=block["Mode"],
                uid=int(who_match.group("uid")) if who_match else None,
                pid=int(who_match.group("pid")) if who_match else None,
            )
        )
    return tuple(inhibitors)


_SUPPORTS_WOL = re.compile(r"^\s*Supports Wake-on:\s*(\S*)\s*$", re.MULTILINE)
_WOL = re.compile(r"^\s*Wake-on:\s*(\S*)\s*$", re.MULTILINE)
_WOL_LETTERS = frozenset("pumbagsfd")


def parse_ethtool_wol(text: str) -> tuple[frozenset[str], frozenset[str]]:
    """``ethtool IFACE`` text → (supported letters, enabled letters); 'd' means disabled.

    No Wake-on lines = the driver offers none → two empty sets. A 'Cannot get
    wake-on-lan settings' message means unknown and raises `WakeOnLanUnreadable`.
    """
    if "Cannot get wake-on-lan settings" in text:
        raise WakeOnLanUnreadable("ethtool cannot read the Wake-on-LAN settings")
    supported_match = _SUPPORTS_WOL.search(text)
    enabled_match = _WOL.search(text)
    if supported_match is None and enabled_match is None:
        if "Settings for " not in text:
            raise OutputError(f"not ethtool output: {_excerpt(text)!r}")
        return frozenset(), frozenset()
    supported = frozenset(supported_match.group(1)) if supported_match else frozenset()
    enabled = frozenset(enabled_match.group(1)) if enabled_match else frozenset()
    unknown = (supported | enabled) - _WOL_LETTERS
    if unknown:
        raise OutputError(f"unknown Wake-on-LAN mode letters {sorted(unknown)}")
    return supported - {"d"}, enabled - {"d"}


def parse_telemetry(
    text: str,
) -> tuple[float, float, float, tuple[GpuSample, ...] | None]:
    """Line 1 = /proc/loadavg; further ``<index>, <util>`` lines = GPUs (none = no GPU tool)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        raise OutputError("telemetry output is empty")
    fields = lines[0].split()
    try:
        if len(fields) < 3:
            raise ValueError
        load1, load5, load15 = (float(v) for v in fields[:3])
    except ValueError:
        raise OutputError(f"first telemetry line is not /proc/loadavg: {lines[0][:80]!r}") from None
    if len(lines) == 1:
        return load1, load5, load15, None
    gpus: list[GpuSample] = []
    for line in lines[1:]:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 2 or not parts[0].isdigit():
            raise OutputError(f"GPU telemetry line is not '<index>, <util>': {line[:80]!r}")
        util_text = parts[1].removesuffix("%").strip()
        if util_text in {"[N/A]", "N/A", "[Not Supported]"}:
            utilisation: float | None = None
        else:
            try:
                utilisation = float(util_text)
            except ValueError:
                raise OutputError(f"GPU utilisation is not a number: {line[:80]!r}") from None
        gpus.append(GpuSample(index=int(parts[0]), utilisation=utilisation))
    return load1, load5, load15, tuple(gpus)


def parse_uptime(text: str) -> float:
    """Seconds since boot from ``/proc/uptime`` (its first field)."""
    fields = text.split()
    try:
        seconds = float(fields[0])
    except (IndexError, ValueError):
        raise OutputError(f"not /proc/uptime output: {text.strip()[:80]!r}") from None
    if seconds < 0:
        raise OutputError(f"negative uptime: {fields[0]!r}")
    return seconds


_PRODUCT_UUID = re.compile(r"^[0-9A-Fa-f]{8}-([0-9A-Fa-f]{4}-){3}[0-9A-Fa-f]{12}$")


def parse_product_uuid(text: str) -> str:
    """The DMI product UUID (lower case) from ``/sys/class/dmi/id/product_uuid``."""
    value = text.strip()
    if not _PRODUCT_UUID.match(value):
        raise OutputError(f"not a product UUID: {value[:80]!r}")
    return value.lower()
