"""Clients of the sandboxes' agents, one per sandbox, reused across calls (the control
plane's, `control.py`: in-process and in the orchestrator alike).

The agent's address and token come from the backend (never from the orchestrator's shared
store, which holds no tokens): any replica can reach any sandbox its backend can see.
"""

from __future__ import annotations

import asyncio

from .agent_client import AgentClient
from .models import AgentEndpoint
from .retry import RetryPolicy


class AgentPool:
    def __init__(self, backend, retry: RetryPolicy):
        self.backend = backend
        self.retry = retry
        self._clients: dict[str, AgentClient] = {}

    def remember(self, sandbox_id: str, endpoint: AgentEndpoint | None) -> None:
        if endpoint is not None and sandbox_id not in self._clients:
            self._clients[sandbox_id] = AgentClient(endpoint, self.retry)

    def cached(self, sandbox_id: str) -> AgentClient | None:
        return self._clients.get(sandbox_id)

    async def get(self, sandbox_id: str) -> AgentClient | None:
        """The sandbox's client; None while the backend knows no address for it."""
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
