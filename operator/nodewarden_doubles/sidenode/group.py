"""`SideNodeGroup`: many side nodes ticked by one task, and the Wake-on-LAN listener that wakes them.

One task steps every node each ``tick_interval`` (a thousand nodes cost one wake-up per
tick, not a thousand); nodes with a MAC are registered with one `WakeOnLanListener`.

    group = SideNodeGroup([node_a, node_b])
    await group.start()          # nodes' ports reserved, listener bound
    group.wol.port               # where to send magic packets
    await group.stop()
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from nodewarden_doubles.sidenode.node import PoweredSideNode
from nodewarden_doubles.sidenode.ticker import cancel, every
from nodewarden_doubles.sidenode.wakeonlan import WakeOnLanListener

logger = logging.getLogger(__name__)


class SideNodeGroup:
    """Side nodes sharing one tick task and one WoL listener."""

    def __init__(
        self,
        nodes: Iterable[PoweredSideNode],
        *,
        wol_port: int = 0,
        tick_interval: float = 0.05,
    ) -> None:
        if tick_interval <= 0:
            raise ValueError("tick_interval must be > 0")
        self.nodes: dict[str, PoweredSideNode] = {}
        for node in nodes:
            if node.name in self.nodes:
                raise ValueError(f"two side nodes are named {node.name!r}")
            self.nodes[node.name] = node
        self.wol = WakeOnLanListener(
            (n for n in self.nodes.values() if n.mac is not None), port=wol_port
        )
        self.tick_interval = tick_interval
        self._ticker: asyncio.Task[None] | None = None

    def node(self, name: str) -> PoweredSideNode:
        try:
            return self.nodes[name]
        except KeyError:
            raise KeyError(f"no side node named {name!r}") from None

    async def start(self) -> None:
        started: list[PoweredSideNode] = []
        try:
            await self.wol.start()
            for node in self.nodes.values():
                await node.start(tick=False)
                started.append(node)
        except BaseException:
            for node in started:
                await node.stop()
            await self.wol.stop()
            raise
        self._ticker = every(self.tick_interval, self.step, "side node group tick")

    async def stop(self) -> None:
        ticker, self._ticker = self._ticker, None
        await cancel(ticker)
        await self.wol.stop()
        await asyncio.gather(*(node.stop() for node in self.nodes.values()))

    def step(self) -> None:
        """Step every node once (one failing node does not stop the others)."""
        for node in self.nodes.values():
            try:
                node.step()
            except Exception:
                logger.exception("side node tick failed", extra={"side_node": node.name})
