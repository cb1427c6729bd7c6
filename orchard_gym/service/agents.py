"""Clients of the sandboxes' agents, one per sandbox, reused across requests.

The agent's address and token come from the backend (never from the shared store, which
holds no tokens): any replica can reach any sandbox its backend can see.
"""

from __future__ import annotations

import asyncio

from orchard_gym.agent_client import AgentClient
from orchard_gym.models import AgentEndpoint
from orchard_gym.retry import RetryPolicy


class AgentPool:
    def __init__(self, backend, retry: RetryPolicy):
        self.backend = backend
        self.retry = retry
        self._clients: dict[str, AgentClient] = {}

    def remember(self, sandbox_id: str, endpoint: AgentEndpoint | None) -> None:
        if endpoint is not None and sandbox_id not in self._clients:
            self._clients[sandbox_id] = AgentClient(endpoint, self.retry)

    async def get(self, sandbox_id: str) -> AgentClient | None:
        client = self._clients.get(sandbox_id)
        if client is None:
            record = await self.backend.get(sandbox_id)
            if record is None or record.endpoint is None:
                return None
            client = self._clients.setdefault(sandbox_id, AgentClient(record.endpoint, self.retry))
        return client

    async def forget(self, sandbox_id: str) -> None:
        client = self._clients.pop(sandbox_id, None)
        if client is not None:
            await client.aclose()

    def __len__(self) -> int:
        return len(self._clients)

    async def aclose(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        await asyncio.gather(*(c.aclose() for c in clients), return_exceptions=True)
