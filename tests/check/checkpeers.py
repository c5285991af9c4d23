"""Peers of the `nodewarden check` tests, served from a background event loop.

The fake BMC (over TLS, certificate from a trustme CA) and an asyncssh server run on
their own event loop in a thread, so that `nodewarden check` -- run in-process with
`asyncio.run`, or as a subprocess -- and the operator process can reach them while the
test itself blocks.
"""

from __future__ import annotations

import asyncio
import ssl
import threading
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

import asyncssh
import trustme

from nodewarden_doubles.fakebmc import FakeBmc, FakeBmcOptions

T = TypeVar("T")


@dataclass
class SshServer:
    """An SSH server on 127.0.0.1 that accepts no login; `public_key` is its host key."""

    port: int
    public_key: str
    server: Any = field(repr=False)

    def known_hosts(self) -> str:
        return f"[127.0.0.1]:{self.port} {self.public_key}\n"


@dataclass
class Listener:
    """A TCP listener on 127.0.0.1 that counts connections (any contact at all)."""

    port: int = 0
    connections: int = 0
    server: Any = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"


class Peers:
    """A background event loop hosting fake BMCs and SSH servers on loopback."""

    def __init__(self, ca: trustme.CA) -> None:
        self.ca = ca
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.bmcs: list[FakeBmc] = []
        self.ssh: list[SshServer] = []
        self.listeners: list[Listener] = []

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)

    def bmc(self, **options: Any) -> FakeBmc:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.ca.issue_cert("127.0.0.1").configure_cert(context)
        bmc = FakeBmc(FakeBmcOptions(**options), ssl_context=context)
        self.call(bmc.start())
        self.bmcs.append(bmc)
        return bmc

    def ssh_server(self) -> SshServer:
        key = asyncssh.generate_private_key("ssh-ed25519")

        async def start() -> Any:
            return await asyncssh.create_server(
                asyncssh.SSHServer, "127.0.0.1", 0, server_host_keys=[key]
            )

        server = self.call(start())
        port = int(server.sockets[0].getsockname()[1])
        public = key.export_public_key("openssh").decode().strip()
        found = SshServer(port, public, server)
        self.ssh.append(found)
        return found

    def listener(self) -> Listener:
        found = Listener()

        async def start() -> Any:
            async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                found.connections += 1
                writer.close()

            return await asyncio.start_server(accept, "127.0.0.1", 0)

        found.server = self.call(start())
        found.port = int(found.server.sockets[0].getsockname()[1])
        self.listeners.append(found)
        return found

    def close(self) -> None:
        async def stop() -> None:
            for bmc in self.bmcs:
                await bmc.stop()
            for server in [*self.ssh, *self.listeners]:
                server.server.close()

        self.call(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()
