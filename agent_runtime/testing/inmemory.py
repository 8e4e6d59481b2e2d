"""The embedded in-memory room: a real ``rtc.Room`` with no connection, plus a stand-in for
the one thing that needs a network, the local participant's signalling (RPCs, byte streams,
track publication).

Room events are the SDK's own: ``rtc.Room.emit`` with real ``RemoteParticipant`` and
``RemoteTrackPublication`` objects built from their protobuf infos, in the argument orders
the Python SDK uses (``track_muted`` is ``(participant, publication)``). Outgoing RPCs end
as scripted (``ok``, ``timeout``, ``error``) on the injected clock; incoming ones call the
handlers registered with ``register_rpc_method``.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import logging
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from livekit import rtc
from livekit.agents.voice.remote_session import SessionTransport
from livekit.protocol.agent_pb import agent_session as agent_pb

from agent_runtime import settings
from agent_runtime.clock import AsyncioClock, Clock
from agent_runtime.parts import check_part
from agent_runtime.sdk import livekit_compat as lk
from agent_runtime.sdk.livekit_compat import participant_pb2, room_pb2, track_pb2
from agent_runtime.sdk.session_transport import Received

logger = logging.getLogger("agent_runtime.testing.inmemory")

RpcResult = Literal["ok", "timeout", "error", "disconnected", "not_found"]

# every rtc.ParticipantKind the SDK knows, by the names settings derives from the enum
PARTICIPANT_KINDS: dict[str, int] = {
    name: participant_pb2.ParticipantKind.Value(f"PARTICIPANT_KIND_{name.upper()}")
    for name in settings.PARTICIPANT_KINDS
}
TRACK_KINDS: dict[str, int] = {
    "audio": track_pb2.TrackKind.KIND_AUDIO,
    "video": track_pb2.TrackKind.KIND_VIDEO,
}


# how long an RPC the SDK sends waits for an answer by default (its round-trip budget), then
# fails with CONNECTION_TIMEOUT
RPC_ROUND_TRIP_BUDGET = 7.0


class NotInRoom(KeyError):
    """Who a test named is not in the room (a ``KeyError``, with a message saying who is)."""

    __str__ = BaseException.__str__  # not KeyError's, which quotes the message


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


class InMemoryRoom(rtc.Room):
    """An unconnected ``rtc.Room`` that a test or the scenario runner drives like the SFU."""

    def __init__(
        self, *, name: str = "room", agent_identity: str = "agent", clock: Clock | None = None
    ) -> None:
        super().__init__()  # first: a room refused below is still one rtc.Room can delete
        for what, value in (("name", name), ("agent_identity", agent_identity)):
            if not isinstance(value, str):
                raise TypeError(f"InMemoryRoom: {what} must be a str, not {type(value).__name__}")
        check_part("clock", clock)
        self.clock: Clock = clock or AsyncioClock()
        self._local = InMemoryLocalParticipant(self, agent_identity)
        lk.set_room_info(self, room_pb2.RoomInfo(name=name))
        self._sids = itertools.count(1)
        self.deleted_at: float | None = None
        self._delivery: contextvars.Context | None = None

    def deliver_in(self, context: contextvars.Context | None) -> None:
        """Emit the room's events in (a copy of) ``context``, or, given None, in the
        caller's. A real room's events come from its own task, one of the job's; this
        room's come from the test's call, so the kit delivers them in the job's context
        (what its handlers start is the job's)."""
        self._delivery = context

    def emit(self, event: Any, *args: Any) -> None:
        if self._delivery is None:
            super().emit(event, *args)
        else:
            self._delivery.copy().run(super().emit, event, *args)

    # the network side the SDK would give us after connect()
    @property
    def local_participant(self) -> Any:  # an InMemoryLocalParticipant standing in
        return self._local

    def isconnected(self) -> bool:
        return self.connection_state != rtc.ConnectionState.CONN_DISCONNECTED

    # -- what the SFU would do -------------------------------------------------------------
    def connect(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("InMemoryRoom has no server; use connect_locally()")

    def connect_locally(self) -> None:
        if self.isconnected():
            return
        self._set_state(rtc.ConnectionState.CONN_CONNECTED)
        self.emit("connected")

    def reconnect_locally(self) -> None:
        """A network blip, as the SDK reports one: reconnecting, then connected again."""
        if not self.isconnected():
            return
        self._set_state(rtc.ConnectionState.CONN_RECONNECTING)
        self.emit("reconnecting")
        self._set_state(rtc.ConnectionState.CONN_CONNECTED)
        self.emit("reconnected")

    def disconnect_locally(self, reason: int = rtc.DisconnectReason.CLIENT_INITIATED) -> None:
        if not self.isconnected():
            return
        self._set_state(rtc.ConnectionState.CONN_DISCONNECTED)
        self.emit("disconnected", reason)

    def _set_state(self, state: rtc.ConnectionState.ValueType) -> None:
        lk.set_connection_state(self, state)
        self.emit("connection_state_changed", state)

    async def disconnect(self, *, reason: Any = rtc.DisconnectReason.CLIENT_INITIATED) -> None:
        self.disconnect_locally(reason)

    def add_participant(
        self,
        identity: str,
        *,
        kind: str = "standard",
        attributes: Mapping[str, str] | None = None,
    ) -> rtc.RemoteParticipant:
        if not isinstance(identity, str) or not identity:
            error = ValueError if isinstance(identity, str) else TypeError
            raise error(f"identity must be a non-empty string, not {identity!r}")
        if identity in self.remote_participants:  # the SFU never lists an identity twice
            raise ValueError(f"{identity!r} is already in the room (a rejoin: remove, then add)")
        if kind not in PARTICIPANT_KINDS:
            raise ValueError(f"unknown participant kind {kind!r}: one of {list(PARTICIPANT_KINDS)}")
        attrs = dict(attributes or {}) if isinstance(attributes, Mapping | None) else None
        if attrs is None or not all(isinstance(x, str) for kv in attrs.items() for x in kv):
            raise TypeError(f"attributes must map strings to strings, not {attributes!r}")
        info = participant_pb2.ParticipantInfo(
            identity=identity,
            sid=f"PA_{next(self._sids)}",
            kind=PARTICIPANT_KINDS[kind],  # type: ignore[arg-type]
            attributes=attrs,
        )
        p = rtc.RemoteParticipant(participant_pb2.OwnedParticipant(info=info))
        lk.room_participants(self)[identity] = p
        self.emit("participant_connected", p)
        # the SFU then reports it active (the SDK's wait_for_participant waits for that)
        lk.participant_info(p).state = participant_pb2.ParticipantState.PARTICIPANT_STATE_ACTIVE
        self.emit("participant_active", p)
        return p

    def remove_participant(
        self, identity: str, reason: int = rtc.DisconnectReason.CLIENT_INITIATED
    ) -> rtc.RemoteParticipant:
        p = self.participant(identity, "remove_participant")
        if isinstance(reason, bool) or reason not in rtc.DisconnectReason.values():
            raise ValueError(f"remove_participant: {reason!r} is no rtc.DisconnectReason value")
        del lk.room_participants(self)[identity]
        lk.participant_info(p).disconnect_reason = reason  # type: ignore[assignment]
        self.emit("participant_disconnected", p)
        return p

    def participant(self, identity: str, doing: str = "participant") -> rtc.RemoteParticipant:
        """The participant ``identity`` in the room, or ``NotInRoom`` saying who is."""
        if (p := self.remote_participants.get(identity)) is None:
            here = ", ".join(map(repr, self.remote_participants)) or "nobody"
            raise NotInRoom(f"{doing}: {identity!r} is not in the room (in the room: {here})")
        return p

    def publish_track(self, identity: str, kind: str = "audio") -> rtc.RemoteTrackPublication:
        p = self.participant(identity, "publish_track")
        if kind not in TRACK_KINDS:
            raise ValueError(f"unknown track kind {kind!r}: audio or video")
        sid = f"TR_{next(self._sids)}"
        pub = rtc.RemoteTrackPublication(
            track_pb2.OwnedTrackPublication(
                info=track_pb2.TrackPublicationInfo(sid=sid, kind=TRACK_KINDS[kind], name=kind)  # type: ignore[arg-type]
            )
        )
        lk.participant_publications(p)[sid] = pub
        self.emit("track_published", pub, p)
        return pub

    def mute_track(self, identity: str, *, muted: bool = True) -> None:
        p = self.participant(identity, "mute_track")
        for pub in p.track_publications.values():
            lk.publication_info(pub).muted = muted
            # the Python SDK's order: (participant, publication)
            self.emit("track_muted" if muted else "track_unmuted", p, pub)

    def set_participant_attributes(self, identity: str, attributes: Mapping[str, str]) -> None:
        p = self.participant(identity, "set_participant_attributes")
        changed = dict(attributes)
        lk.participant_info(p).attributes.update(changed)
        self.emit("participant_attributes_changed", changed, p)

    async def invoke_rpc(self, method: str, caller: str, payload: str) -> str:
        """An incoming RPC from ``caller``; returns the handler's reply or raises ``RpcError``."""
        handler = self._local.rpc_handlers.get(method)
        if handler is None:
            raise rtc.RpcError(rtc.RpcError.ErrorCode.UNSUPPORTED_METHOD, "Method not supported")
        data = rtc.RpcInvocationData(
            request_id=f"RQ_{next(self._sids)}",
            caller_identity=caller,
            payload=payload,
            response_timeout=10.0,
            method=method,
        )
        try:
            res = handler(data)
            if asyncio.iscoroutine(res) or isinstance(res, Awaitable):
                res = await res
        except rtc.RpcError:
            raise
        except Exception as e:
            raise rtc.RpcError(rtc.RpcError.ErrorCode.APPLICATION_ERROR, str(e)) from e
        return str(res or "")

    def listener_count(self) -> int:
        """Callbacks registered on the room (tests check nothing is left after close)."""
        return sum(len(v) for v in lk.listeners(self).values())


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


@contextlib.contextmanager
def quiet_sdk_logs(level: int = logging.ERROR) -> Any:
    """Silence the SDK's own chatter about an unconnected room (scenario output stays clean)."""
    names = ("livekit", "livekit.agents")
    old = [logging.getLogger(n).level for n in names]
    for n in names:
        logging.getLogger(n).setLevel(level)
    try:
        yield
    finally:
        for n, lvl in zip(names, old, strict=True):
            logging.getLogger(n).setLevel(lvl)


def sdk_task_failures_at_debug(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The SDK's own background tasks (an avatar join watcher, a data stream waiting for its
    participant) fail once a scenario disconnects the room; in a scenario that is expected,
    so those go to debug. Anything else is reported as usual."""
    task = context.get("future") or context.get("task")
    get_coro = getattr(task, "get_coro", None)
    code = getattr(get_coro(), "cr_code", None) if get_coro is not None else None
    filename = getattr(code, "co_filename", "")
    if "/livekit/" in filename.replace("\\", "/"):
        logging.getLogger("agent_runtime.testing.runner").debug(
            "SDK background task ended: %s", context.get("exception")
        )
        return
    loop.default_exception_handler(context)
