"""Slow clients cannot exhaust the operator's listeners (issue: hostile users).

300 half-open connections to each of the three ports (status API, metrics, probes), each
sending one header line and then nothing, re-opened as fast as the operator drops them,
while a prober asks /healthz and /readyz (probe port) and /metrics (metrics port) every
half second with the chart's probe timeout (5 s). Every probe must answer 200 within it,
and the operator's file descriptors stay bounded by its connection caps. The header
deadline is set short (1 s; the chart's is 5 s) so the flood turns over several times in
a few seconds; NODEWARDEN_FLOOD_SECONDS runs it longer (the issue's 60 s). The stalled
clients run in a process of their own, so they never delay the prober's requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import time
from multiprocessing.sharedctypes import Synchronized
from pathlib import Path

import pytest
import yaml

from clusterkit import ClusterHandle, start_operator, wait_for
from nodewarden_doubles.ports import unused_loopback_port

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

PROBE_TIMEOUT = 5.0  # the chart's livenessProbe/readinessProbe timeoutSeconds
HALF_OPEN = 300
CAP = 400  # above the flood: a stalled connection holds a slot for the header deadline only
FLOOD_SECONDS = float(os.environ.get("NODEWARDEN_FLOOD_SECONDS", "6"))


async def _half_open(port: int, stop: asyncio.Event, opened: list[int]) -> None:
    """One stalled client: connect, one header line, wait to be dropped, again."""
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(0.01)
            continue
        opened[0] += 1
        try:
            writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            await writer.drain()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(reader.read(), timeout=30)
        except OSError:
            pass
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


async def _stalled_clients(ports: list[int], seconds: float) -> int:
    stop = asyncio.Event()
    opened = [0]
    flood = [
        asyncio.create_task(_half_open(port, stop, opened))
        for port in ports
        for _ in range(HALF_OPEN)
    ]
    await asyncio.sleep(seconds)
    stop.set()
    for task in flood:
        task.cancel()
    await asyncio.gather(*flood, return_exceptions=True)
    return opened[0]


def _flood_process(ports: list[int], seconds: float, opened: Synchronized[int]) -> None:
    opened.value = asyncio.run(_stalled_clients(ports, seconds))


async def _get(port: int, path: str) -> tuple[int, float, str]:
    """One prompt request: (status, seconds, error); status 0 = no answer."""
    started = time.monotonic()
    line = b""
    try:
        async with asyncio.timeout(PROBE_TIMEOUT):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(f"GET {path} HTTP/1.1\r\nHost: probe\r\n\r\n".encode())
            await writer.drain()
            line = await reader.readline()
            await reader.read()
            writer.close()
            return int(line.split()[1]), time.monotonic() - started, ""
    except (TimeoutError, OSError, IndexError, ValueError) as exc:
        return 0, time.monotonic() - started, f"{type(exc).__name__}: {exc} {line!r}"


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def _probe_under_flood(ports: dict[str, int], pid: int) -> dict[str, object]:
    opened: Synchronized[int] = multiprocessing.Value("i", 0)  # type: ignore[assignment]
    flood = multiprocessing.get_context("fork").Process(
        target=_flood_process, args=(list(ports.values()), FLOOD_SECONDS + 1.0, opened)
    )
    flood.start()
    answers: list[tuple[str, int, float, str]] = []
    fds: list[int] = []
    try:
        await asyncio.sleep(1.0)  # the flood fills every listener first
        deadline = time.monotonic() + FLOOD_SECONDS
        while time.monotonic() < deadline:
            paths = (
                (ports["probes"], "/healthz"),
                (ports["probes"], "/readyz"),
                (ports["metrics"], "/metrics"),
            )
            results = await asyncio.gather(*(_get(port, path) for port, path in paths))
            for (_, path), (code, took, error) in zip(paths, results, strict=True):
                answers.append((path, code, took, error))
            fds.append(_fds(pid))
            await asyncio.sleep(0.5)
    finally:
        await asyncio.to_thread(flood.join, 30)
        if flood.is_alive():
            flood.kill()
    return {"answers": answers, "fds": fds, "opened": opened.value}


def test_300_half_open_connections_per_port_fail_no_probe(
    cluster: ClusterHandle, namespace: str, tmp_path: Path
) -> None:
    ports = {
        "api": unused_loopback_port(),
        "metrics": unused_loopback_port(),
        "probes": unused_loopback_port(),
    }
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "namespace": namespace,
                "dispatch": {"enabled": False},
                "http": {
                    "host": "127.0.0.1",
                    "metrics_port": ports["metrics"],
                    "probe_port": ports["probes"],
                    "header_timeout": 1.0,
                    "request_timeout": 5,
                    "max_connections": CAP,
                },
            }
        )
    )
    op = start_operator(
        cluster,
        namespace,
        tmp_path,
        f"--config={config}",
        f"--http-port={ports['api']}",
        probe_port=ports["probes"],
    )
    try:
        wait_for(lambda: op.get("/readyz")[0] == 200, timeout=30, what="operator ready")
        baseline = _fds(op.proc.pid)
        result = asyncio.run(_probe_under_flood(ports, op.proc.pid))
        answers = result["answers"]
        fds = result["fds"]
        assert isinstance(answers, list) and answers and isinstance(fds, list)
        failed = [a for a in answers if a[1] != 200]
        slowest = max(a[2] for a in answers)
        print(
            f"flood {FLOOD_SECONDS:g}s: {result['opened']} stalled connections opened, "
            f"{len(answers)} probes, slowest {slowest:.2f}s, fds {baseline} -> max {max(fds)}"
        )
        assert failed == [], failed[:6]
        assert slowest < PROBE_TIMEOUT
        assert max(fds) <= baseline + 3 * CAP, (baseline, max(fds))  # bounded by the caps
        assert int(str(result["opened"])) > 3 * HALF_OPEN  # the flood really turned over
        assert op.proc.poll() is None
    finally:
        op.stop()
