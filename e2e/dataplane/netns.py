"""The two network namespaces of the e2e data plane, their links, addresses and NAT.

    node namespace  nwe2e-<id>     lo; `nwnode` 192.0.2.2/24 = the node IP (kubelet,
                                   API server, kube-proxy); `cni0` bridge of the Pods
                                   198.51.100.0/24 (created by the bridge CNI plugin);
                                   Services 10.0.0.0/24 (kube-proxy, iptables mode)
    cloud namespace nwe2e-<id>-c   lo; `nwcloud` 192.0.2.3/24, the stub cloud's address

The two are joined by one veth pair (`nwnode` <-> `nwcloud`); neither has any other
link, so no packet can leave them. The kernel here has no `dummy` link type ("Unknown
device type"), so the node IP sits on the node's end of that veth pair instead.

The stub cloud (a test double) listens on its namespace's loopback only; a DNAT rule
there maps 192.0.2.3:<port> to 127.0.0.1:<port> (with `route_localnet`), so the
operator Pods reach the cloud API and the SSH servers of its VMs by routing, the way
they would reach a real cloud, while its loopback holds nothing else.

Addresses are from the documentation ranges (RFC 5737) on purpose: they exist only
inside these namespaces.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")
CLONE_NEWNET = 0x40000000

NODE_IP = "192.0.2.2"
CLOUD_IP = "192.0.2.3"
LINK_PREFIX = 24
POD_CIDR = "198.51.100.0/24"
SERVICE_CIDR = "10.0.0.0/24"
NODE_LINK = "nwnode"
CLOUD_LINK = "nwcloud"


class NetnsError(RuntimeError):
    """A namespace command failed; the message has the command and its stderr."""


def _ip(*args: str) -> None:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {proc.stderr.strip()}")


def in_netns(name: str, *argv: str) -> list[str]:
    """argv run inside namespace `name` (network namespace only; same mounts and pids)."""
    return ["nsenter", f"--net=/run/netns/{name}", "--", *argv]


def _sh(name: str, *argv: str) -> None:
    proc = subprocess.run(in_netns(name, *argv), capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise NetnsError(f"[{name}] {' '.join(argv)}: {proc.stderr.strip()}")


def call_in(netns: Path, fn: Callable[[], T]) -> T:
    """Run `fn` on a thread that joined the network namespace at path `netns`; its result.

    setns(CLONE_NEWNET) moves the calling thread alone, so the rest of this process stays
    where it is; sockets `fn` opens live in `netns` (used for the stub cloud's admin API,
    which listens on the cloud namespace's loopback).
    """
    outcome: dict[str, object] = {}

    def target() -> None:
        try:
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            fd = os.open(netns, os.O_RDONLY)
            try:
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns into {netns} failed")
            finally:
                os.close(fd)
            outcome["value"] = fn()
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=target, name=f"netns-{netns.name}")
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["value"]  # type: ignore[return-value]


@dataclass(frozen=True)
class Namespaces:
    """The node and cloud namespaces of one e2e run (names unique per run)."""

    node: str
    cloud: str

    @classmethod
    def fresh(cls) -> Namespaces:
        run_id = uuid.uuid4().hex[:8]
        return cls(node=f"nwe2e-{run_id}", cloud=f"nwe2e-{run_id}-c")

    def create(self) -> Namespaces:
        try:
            for name in (self.node, self.cloud):
                _ip("netns", "add", name)
                _ip("-n", name, "link", "set", "lo", "up")
            _ip(
                "-n", self.node, "link", "add", NODE_LINK, "type", "veth",
                "peer", "name", CLOUD_LINK, "netns", self.cloud,
            )  # fmt: skip
            _ip("-n", self.node, "addr", "add", f"{NODE_IP}/{LINK_PREFIX}", "dev", NODE_LINK)
            _ip("-n", self.cloud, "addr", "add", f"{CLOUD_IP}/{LINK_PREFIX}", "dev", CLOUD_LINK)
            _ip("-n", self.node, "link", "set", NODE_LINK, "up")
            _ip("-n", self.cloud, "link", "set", CLOUD_LINK, "up")
            # Services: locally started connections need a route before kube-proxy's DNAT.
            _ip("-n", self.node, "route", "add", SERVICE_CIDR, "dev", NODE_LINK)
            # Replies from the cloud to the Pods go back through the node.
            _ip("-n", self.cloud, "route", "add", POD_CIDR, "via", NODE_IP)
            _sh(
                self.node, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1",
                "net.bridge.bridge-nf-call-iptables=1",
            )  # fmt: skip
            _sh(self.cloud, "sysctl", "-q", "-w", "net.ipv4.conf.all.route_localnet=1")
            _sh(
                self.cloud, "iptables", "-t", "nat", "-A", "PREROUTING", "-i", CLOUD_LINK,
                "-d", CLOUD_IP, "-p", "tcp", "-j", "DNAT", "--to-destination", "127.0.0.1",
            )  # fmt: skip
        except BaseException:
            self.delete()
            raise
        return self

    def delete(self) -> None:
        """Remove both namespaces (their links go with them); missing ones are fine."""
        for name in (self.node, self.cloud):
            subprocess.run(["ip", "netns", "delete", name], capture_output=True, check=False)

    def exists(self) -> bool:
        out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
        names = {line.split()[0] for line in out.stdout.splitlines() if line.strip()}
        return self.node in names
