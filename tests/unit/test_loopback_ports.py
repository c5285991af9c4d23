"""Ports handed to child processes come from outside the ephemeral range, never twice, and a
control-plane process that loses its port to another process is started again on a fresh
one (CI once saw etcd die with "bind: address already in use" on an ephemeral port)."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

import localcluster
from localcluster import LocalCluster, PortLostError
from nodewarden_doubles import ports
from nodewarden_doubles.ports import bind_failed, unused_loopback_port

ETCD_LOST = (
    '{"level":"fatal","msg":"discovery failed","error":"listen tcp 127.0.0.1:59405: '
    'bind: address already in use"}'
)


def test_ports_are_below_the_ephemeral_range_bindable_and_never_repeated() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    picked = [unused_loopback_port() for _ in range(300)]
    assert len(set(picked)) == len(picked)
    assert all(ports._range()[0] <= p < low for p in picked)
    for port in picked[:20]:  # handed out free: a child may bind both TCP and UDP on it
        with socket.socket() as tcp, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            tcp.bind(("127.0.0.1", port))
            udp.bind(("127.0.0.1", port))


def test_a_port_someone_listens_on_is_never_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = int(busy.getsockname()[1])
        monkeypatch.setattr(ports, "_range", lambda: (taken, taken + 1))
        ports._handed_out.discard(taken + 1)
        assert unused_loopback_port() == taken + 1


def test_the_range_moves_above_an_ephemeral_range_that_starts_low(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "ip_local_port_range"
    fake.write_text("1024\t50000\n")
    monkeypatch.setattr(ports, "_EPHEMERAL_RANGE", fake)
    assert ports._range() == (50_001, 65_535)
    fake.write_text("32768\t60999\n")
    assert ports._range() == (10_000, 32_767)


def test_bind_failures_are_told_apart_from_other_exits() -> None:
    assert bind_failed(ETCD_LOST)
    assert bind_failed("OSError: [Errno 98] error while attempting to bind on address")
    assert not bind_failed('{"level":"fatal","msg":"member has already been bootstrapped"}')


def _cluster(tmp_path: Path) -> LocalCluster:
    cluster = LocalCluster(state_dir=tmp_path)
    (tmp_path / "logs").mkdir()
    return cluster


def test_a_process_that_lost_its_port_is_started_again_on_a_fresh_one(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path)
    starts: list[float] = []

    def start(timeout: float) -> None:
        starts.append(timeout)
        (tmp_path / "logs" / "etcd.log").write_text(ETCD_LOST if len(starts) == 1 else "ok")
        if len(starts) == 1:
            raise PortLostError("etcd exited with 1")

    cluster._on_fresh_ports("etcd", start, 5.0)
    assert starts == [5.0, 5.0]
    assert (tmp_path / "logs" / "etcd.port-lost-1.log").read_text() == ETCD_LOST


def test_ports_lost_every_time_or_other_failures_are_not_retried_for_ever(
    tmp_path: Path,
) -> None:
    cluster = _cluster(tmp_path)
    calls = 0

    def always_lost(timeout: float) -> None:
        nonlocal calls
        calls += 1
        (tmp_path / "logs" / "kube-apiserver.log").write_text(ETCD_LOST)
        raise PortLostError("lost")

    with pytest.raises(PortLostError):
        cluster._on_fresh_ports("kube-apiserver", always_lost, 1.0)
    assert calls == localcluster.PORT_ATTEMPTS

    calls = 0

    def broken(timeout: float) -> None:
        nonlocal calls
        calls += 1
        raise localcluster.ClusterError("etcd exited with 2")

    with pytest.raises(localcluster.ClusterError):
        cluster._on_fresh_ports("etcd", broken, 1.0)
    assert calls == 1


def test_a_child_that_exits_on_a_taken_port_is_reported_as_a_lost_port(tmp_path: Path) -> None:
    """The real path: a child process prints the bind failure and exits; `_wait` says so."""
    cluster = LocalCluster(state_dir=tmp_path)
    for text, error in (
        (ETCD_LOST, PortLostError),
        ("some other fault", localcluster.ClusterError),
    ):
        proc = cluster._spawn(
            "etcd", [sys.executable, "-c", f"print({text!r}); raise SystemExit(1)"]
        )
        with pytest.raises(error) as caught:
            cluster._wait("etcd", lambda: False, proc, timeout=60)
        assert (error is PortLostError) == isinstance(caught.value, PortLostError)
        (tmp_path / "logs" / "etcd.log").unlink()
