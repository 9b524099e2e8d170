"""The agent message hub's RPC methods on a PostgreSQL store (StoreCoordinator's mixin):
coordd.hub.Hub, the SQLite Coordinator's very checks, over the store's hub operations
(coordd.store.api_hub), and the hub's share of the prune round (expired and old messages,
forgotten agents) every `prune_interval_s`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any

from coordd import errors
from coordd.clock import Clock
from coordd.config import Config
from coordd.hub import Hub
from coordd.protocol import (
    AckMessages, AckResult, AgentQuery, AgentsResult, AgentStatusUpdate, AgentView,
    BroadcastMessage, ReadMessages, ReadResult, SendMessage, SendResult,
)
from coordd.protocol_hub import HUB_PARAMS

logger = logging.getLogger(__name__)

HUB_METHODS = frozenset(HUB_PARAMS)
"""The hub's RPC methods (coordd.protocol_hub), all served on the store."""


class HubService:
    """The hub's RPC methods over `self.store` (see the module docstring)."""

    store: Any
    config: Config
    clock: Clock

    @functools.cached_property
    def hub(self) -> Hub:
        """The hub over this coordinator's store."""
        return Hub(self.store, self.config)

    async def send_message(self, p: SendMessage) -> SendResult:
        """Store a direct message. Raises: BadRequest, PayloadTooLarge."""
        return await self.hub.send_message(p)

    async def broadcast(self, p: BroadcastMessage) -> SendResult:
        """Store a message for every reader but its sender. Raises: as send_message."""
        return await self.hub.broadcast(p)

    async def read_messages(self, p: ReadMessages) -> ReadResult:
        """Ack, then deliver the reader's messages. Raises: BadRequest, PayloadTooLarge."""
        return await self.hub.read_messages(p)

    async def ack_messages(self, p: AckMessages) -> AckResult:
        """Mark the reader's deliveries processed. Raises: BadRequest."""
        return await self.hub.ack_messages(p)

    async def update_agent_status(self, p: AgentStatusUpdate) -> AgentView:
        """Record an agent's status and heartbeat. Raises: BadRequest, PayloadTooLarge."""
        return await self.hub.update_agent_status(p)

    async def get_agent_status(self, p: AgentQuery) -> AgentsResult:
        """One agent or a page of agents. Raises: NotFound, BadRequest."""
        return await self.hub.get_agent_status(p)

    async def prune_hub(self, stop: asyncio.Event) -> None:
        """Purge the hub now and every `prune_interval_s` until `stop` is set (as the
        SQLite prune round does); a failed round is logged and tried at the next."""
        while True:
            try:
                messages = await self.hub.purge()
                agents = await self.hub.purge_agents()
            except Exception as exc:  # never the daemon's end: the next round tries again
                code = exc.code if isinstance(exc, errors.CoordError) else type(exc).__name__
                logger.warning("hub purge failed: %s: %s", code, exc,
                               extra={"action": "maintenance_failed", "step": "hub"})
            else:
                if messages or agents:
                    logger.info("pruned %d message(s) and %d agent(s)", messages, agents,
                                extra={"action": "prune", "messages": messages,
                                       "agents": agents})
            if await self.clock.wait(stop, self.config.prune_interval_s):
                return
