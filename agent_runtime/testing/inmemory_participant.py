"""The in-memory room's local participant: the agent's own side of the room, which in a
real room is the SDK's network side (RPCs, byte and text streams, track publication), here
recorded instead of sent. Outgoing RPCs end as scripted (``ok``, ``timeout``, ``error``) on
the room's clock.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from livekit import rtc

from agent_runtime.sdk.livekit_compat import participant_pb2

if TYPE_CHECKING:
    from agent_runtime.testing.inmemory import InMemoryRoom

RpcResult = Literal["ok", "timeout", "error", "disconnected", "not_found"]


# how long an RPC the SDK sends waits for an answer by default (its round-trip budget), then
# fails with CONNECTION_TIMEOUT
RPC_ROUND_TRIP_BUDGET = 7.0


@dataclass(frozen=True, slots=True)
class RpcCall:
    """An outgoing RPC the agent made, and how it ended."""

    t: float
    method: str
    destination: str
    payload: str
    outcome: str  # ok | timeout | error | disconnected | not_found


class InMemoryLocalParticipant:
    """Stands in for ``rtc.LocalParticipant``'s network side; everything else is real."""

    def __init__(self, room: InMemoryRoom, identity: str) -> None:
        self._room = room
        self.identity = identity
        self.sid = "PA_local"
        self.attributes: dict[str, str] = {}
        self.rpc_handlers: dict[str, Callable[[rtc.RpcInvocationData], Awaitable[str] | str]] = {}
        # the SDK's LocalParticipant keeps them under this name, and DataStreamAudioOutput
        # reads it there
        self._rpc_handlers = self.rpc_handlers
        self.kind = participant_pb2.ParticipantKind.PARTICIPANT_KIND_AGENT
        self.streams: list[InMemoryStream] = []
        # per method: how the next outgoing calls end, consumed in order
        self.rpc_script: dict[str, deque[RpcResult]] = defaultdict(deque)
        self.rpc_calls: list[RpcCall] = []
        self.sent_bytes: list[tuple[str, bytes, list[str] | None]] = []
        self.track_publications: dict[str, Any] = {}
        # called with each track as it is published, before publish_track returns (the
        # entrypoint runner puts its stand-in behind a room audio output there)
        self.on_publish: list[Callable[[Any], None]] = []

    # -- RPC -------------------------------------------------------------------------------
    def register_rpc_method(
        self, method_name: str, handler: Callable[[rtc.RpcInvocationData], Any] | None = None
    ) -> Any:
        def register(fn: Callable[[rtc.RpcInvocationData], Any]) -> Any:
            self.rpc_handlers[method_name] = fn
            return fn

        return register(handler) if handler is not None else register

    def unregister_rpc_method(self, method: str) -> None:
        self.rpc_handlers.pop(method, None)

    async def perform_rpc(
        self,
        *,
        destination_identity: str,
        method: str,
        payload: str,
        response_timeout: float | None = None,
        max_round_trip_latency: float | None = None,
    ) -> str:
        clock = self._room.clock
        start = clock.now()
        script = self.rpc_script.get(method)
        result: RpcResult = script.popleft() if script else "ok"
        if result == "ok" and destination_identity not in self._room.remote_participants:
            # nobody there to answer: the SDK gives up after its round-trip budget (7 s)
            result = "timeout"
        outcome = result
        try:
            if result == "ok":
                return ""
            if result == "timeout":
                wait = (
                    max_round_trip_latency
                    if max_round_trip_latency is not None
                    else RPC_ROUND_TRIP_BUDGET
                )
                if response_timeout is not None:
                    wait = min(wait, response_timeout)
                await clock.sleep(wait)
                raise rtc.RpcError(rtc.RpcError.ErrorCode.CONNECTION_TIMEOUT, "Connection timeout")
            if result == "disconnected":
                raise rtc.RpcError(
                    rtc.RpcError.ErrorCode.RECIPIENT_DISCONNECTED, "Recipient disconnected"
                )
            if result == "not_found":
                raise rtc.RpcError(
                    rtc.RpcError.ErrorCode.RECIPIENT_NOT_FOUND, "Recipient not found"
                )
            raise rtc.RpcError(rtc.RpcError.ErrorCode.APPLICATION_ERROR, "Application error")
        except asyncio.CancelledError:
            outcome = "cancelled"  # type: ignore[assignment]
            raise
        finally:
            self.rpc_calls.append(RpcCall(start, method, destination_identity, payload, outcome))

    # -- data and tracks -------------------------------------------------------------------
    async def send_bytes(
        self,
        data: bytes,
        *,
        topic: str = "",
        destination_identities: list[str] | None = None,
        **_: Any,
    ) -> None:
        if not self._room.isconnected():
            raise RuntimeError("room is not connected")
        self.sent_bytes.append((topic, data, destination_identities))

    async def send_text(self, text: str, *, topic: str = "", **_: Any) -> None:
        if not self._room.isconnected():
            raise RuntimeError("room is not connected")

    async def stream_bytes(
        self,
        name: str = "",
        *,
        destination_identities: list[str] | None = None,
        attributes: dict[str, str] | None = None,
        topic: str = "",
        **_: Any,
    ) -> InMemoryStream:
        """A byte stream (the audio sent to an avatar): records what is written to it."""
        stream = InMemoryStream(topic, list(destination_identities or []), dict(attributes or {}))
        self.streams.append(stream)
        return stream

    async def stream_text(
        self,
        *,
        destination_identities: list[str] | None = None,
        attributes: dict[str, str] | None = None,
        topic: str = "",
        **_: Any,
    ) -> InMemoryStream:
        """A text stream (the agent's transcription)."""
        return InMemoryStream(topic, list(destination_identities or []), dict(attributes or {}))

    async def set_attributes(self, attributes: dict[str, str]) -> None:
        self.attributes.update(attributes)

    async def publish_track(self, track: Any, options: Any = None) -> Any:
        sid = f"TR_local_{len(self.track_publications) + 1}"
        source = options.source if options is not None else rtc.TrackSource.SOURCE_UNKNOWN
        # publications, as the SDK keeps them: a second session's room I/O reads them
        self.track_publications[sid] = publication = _LocalPublication(sid, track, source)
        for hook in list(self.on_publish):
            hook(track)
        return publication

    async def unpublish_track(self, track_sid: str) -> None:
        self.track_publications.pop(track_sid, None)


@dataclass
class InMemoryStream:
    """What ``stream_bytes``/``stream_text`` hand back: records the chunks written."""

    topic: str
    destination: list[str]
    attributes: dict[str, str]
    chunks: list[bytes] = field(default_factory=list)
    closed: bool = False

    async def write(self, data: bytes | str) -> None:
        self.chunks.append(data.encode() if isinstance(data, str) else data)

    async def aclose(self, **_: Any) -> None:
        self.closed = True


@dataclass
class _LocalPublication:
    sid: str
    track: Any
    source: int  # rtc.TrackSource

    async def wait_for_subscription(self) -> None:
        return None
