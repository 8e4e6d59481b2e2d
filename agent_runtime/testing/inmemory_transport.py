"""The in-memory session transport: a pair of ends carrying ``AgentSessionMessage`` bytes,
the agent's on one end, the test's simulator on the other."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from livekit.agents.voice.remote_session import SessionTransport
from livekit.protocol.agent_pb import agent_session as agent_pb

from agent_runtime.sdk.session_transport import Received


class InMemorySessionTransport(SessionTransport):
    """One end of a paired transport carrying serialized ``AgentSessionMessage`` bytes.

    Like the room's byte streams, each message arrives with the identity of its sender:
    this end's ``identity``, or the ``sender`` given to ``send_message`` (a test playing
    several participants over one end). ``receive()`` returns both.
    """

    def __init__(self, identity: str | None = None) -> None:
        # bytes put here directly (a test's garbage on the wire) have no known sender
        self._inbox: asyncio.Queue[tuple[bytes, str | None] | bytes | None] = asyncio.Queue()
        self._peer: InMemorySessionTransport | None = None
        self.identity = identity
        self.closed = False

    @classmethod
    def pair(
        cls, *, identities: tuple[str | None, str | None] = (None, None)
    ) -> tuple[InMemorySessionTransport, InMemorySessionTransport]:
        a, b = cls(), cls()
        a.identity, b.identity = identities
        a._peer, b._peer = b, a
        return a, b

    async def start(self) -> None:
        return None

    async def send_message(
        self, msg: agent_pb.AgentSessionMessage, *, sender: str | None = None
    ) -> None:
        if self.closed or self._peer is None or self._peer.closed:
            raise RuntimeError("session transport is closed")
        self._peer._inbox.put_nowait((msg.SerializeToString(), sender or self.identity))

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._inbox.put_nowait(None)

    async def receive(self) -> Received:
        item = await self._inbox.get()
        if item is None:
            self._inbox.put_nowait(None)  # every later read ends too
            raise StopAsyncIteration
        data, sender = item if isinstance(item, tuple) else (item, None)
        msg = agent_pb.AgentSessionMessage()
        msg.ParseFromString(data)
        return Received(msg, sender)

    def __aiter__(self) -> AsyncIterator[agent_pb.AgentSessionMessage]:
        return self

    async def __anext__(self) -> agent_pb.AgentSessionMessage:
        return (await self.receive()).message

    def receive_nowait(self) -> list[agent_pb.AgentSessionMessage]:
        """Every message waiting at this end (for a test's simulator side)."""
        out: list[agent_pb.AgentSessionMessage] = []
        while not self._inbox.empty():
            item = self._inbox.get_nowait()
            if item is None:
                self._inbox.put_nowait(None)
                break
            msg = agent_pb.AgentSessionMessage()
            msg.ParseFromString(item[0] if isinstance(item, tuple) else item)
            out.append(msg)
        return out
