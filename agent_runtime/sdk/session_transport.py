"""A session transport that says who sent each message.

livekit's ``RoomSessionTransport`` reads each ``AgentSessionMessage`` from a byte stream on
topic ``lk.agent.session``; the room hands it the identity of the participant who opened
the stream, and it drops that identity after filtering on it. The session host needs it:
only the simulator participant may ask for the verdict. ``RoomRequestTransport`` reads the
same byte streams and keeps the sender with each message (``receive()``); it sends through
livekit's own ``RoomSessionTransport``, unchanged.

What the identity is worth: it is the one the LiveKit server stamps on the stream (it
replaces whatever identity a client puts in a byte stream's header with the identity of
the participant that sent it, i.e. the identity in that participant's access token). It
says who sent the message; whether that participant is the simulator is decided by the job
from the ``lk.simulator`` attribute, which is only as trustworthy as the tokens that may
set attributes (``canUpdateOwnMetadata`` lets a participant set its own).

``SessionPipe`` is the transport each attached session's own livekit ``SessionHost`` sees:
the job's host feeds it the requests, and its replies go out on the job's transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol, cast, runtime_checkable

from google.protobuf import message as pb_message
from google.protobuf.unknown_fields import UnknownFieldSet
from livekit import rtc
from livekit.agents.voice.remote_session import (
    TOPIC_SESSION_MESSAGES,
    RoomSessionTransport,
    SessionHost,
    SessionTransport,
)
from livekit.protocol.agent_pb import agent_session as agent_pb

from agent_runtime.sdk.inbox import Inbox

logger = logging.getLogger("agent_runtime.session_transport")

# the labels of the host's job, for each line logged about its transport (its actor's
# ``log_fields``: the log policy's); none outside a job
Fields = Callable[[], Mapping[str, Any]]


def _no_fields() -> Mapping[str, Any]:
    return {}


@dataclass(frozen=True, slots=True)
class Received:
    """A message and the identity of the participant who sent it (``None``: unknown)."""

    message: agent_pb.AgentSessionMessage
    sender: str | None


@runtime_checkable
class SenderAware(Protocol):
    """A transport that can say who sent each message it reads."""

    async def receive(self) -> Received:
        """The next message and its sender; ``StopAsyncIteration`` once closed."""
        ...


def sender_aware(transport: object) -> bool:
    """``isinstance(transport, SenderAware)``, cheaply: it has a ``receive`` method."""
    return callable(getattr(transport, "receive", None))


class RoomRequestTransport(SessionTransport):
    """``RoomSessionTransport``'s messages, each with the identity of its sender.

    ``remote_identity`` keeps only that participant's messages, as livekit's does. Streams
    are read one at a time, in the order they opened, by a task that runs only while some
    wait; nothing is held while none does. ``listen()`` hands each request to a callback as
    it is read instead (a host that reads this way needs no reader task of its own).
    """

    def __init__(self, room: rtc.Room, remote_identity: str | None = None) -> None:
        self._room = room
        self._remote_identity = remote_identity
        # sending is livekit's own (its reading side is never started), made on first send
        self._out: RoomSessionTransport | None = None
        self._streams: deque[tuple[rtc.ByteStreamReader, str]] | None = None
        self._received: Inbox[Received | None] = Inbox()
        self._read_task: asyncio.Task[None] | None = None
        self._on_request: OnRequest | None = None  # listen()'s: requests go there, not to receive()
        self._fields: Fields = _no_fields  # listen()'s: what its lines carry
        # its lifecycle, one value: "open" holds the room's handler for the topic (a start
        # the room refused leaves it "new": its close must not take another's handler)
        self._phase: Literal["new", "open", "closed"] = "new"

    async def start(self) -> None:
        self._open()

    def listen(self, on_request: OnRequest, *, fields: Fields = _no_fields) -> None:
        """Start now, and hand each request read to ``on_request(request, sender)`` (other
        messages are ignored, as ``read_requests`` does); ``receive()`` then gets nothing.
        Raises what ``start()`` would, at once. ``fields``: what its log lines carry."""
        self._open()
        self._on_request, self._fields = on_request, fields
        # what was read before (a transport already started and read from): handed on
        # first, in order
        while not self._received.empty():
            item = self._received.get_nowait()
            if item is None:  # closed: every later read ends too
                self._received.put_nowait(None)
                return
            self._hand_on_safely(item.message, item.sender)

    def _open(self) -> None:
        if self._phase != "new":
            return
        # raises ValueError when the topic already has a handler (a session's own host)
        self._room.register_byte_stream_handler(TOPIC_SESSION_MESSAGES, self._on_stream)
        self._phase = "open"

    def _on_stream(self, reader: rtc.ByteStreamReader, participant_identity: str) -> None:
        if self._phase != "open" or (
            self._remote_identity and participant_identity != self._remote_identity
        ):
            reader.close()  # never read: release it
            return
        if self._streams is None:
            self._streams = deque()
        self._streams.append((reader, participant_identity))
        if self._read_task is None:
            self._read_task = asyncio.get_running_loop().create_task(
                self._read_streams(), name="RoomRequestTransport._read_streams"
            )

    async def _read_streams(self) -> None:
        # one at a time, so messages come out in the order their streams opened
        try:
            while self._streams:
                reader, sender = self._streams.popleft()
                try:
                    data = b"".join([chunk async for chunk in reader])
                    msg = agent_pb.AgentSessionMessage()
                    msg.ParseFromString(data)
                except Exception as e:
                    logger.warning(
                        "unreadable session message from %r: %s", sender, e, extra=self._fields()
                    )
                    continue
                finally:
                    reader.close()  # a no-op once read to its end; releases one cut short
                if self._on_request is not None:
                    self._hand_on_safely(msg, sender)
                else:
                    self._received.put_nowait(Received(msg, sender))
        finally:
            self._read_task = None
            if not self._streams:
                self._streams = None

    def _hand_on_safely(self, msg: agent_pb.AgentSessionMessage, sender: str | None) -> None:
        assert self._on_request is not None
        try:
            _hand_on(msg, sender, self._on_request, self._fields)
        except Exception:  # the listener's: the next message is read all the same
            logger.exception(
                "handing on a session message from %r failed", sender, extra=self._fields()
            )

    async def receive(self) -> Received:
        item = await self._received.get()
        if item is None:
            self._received.put_nowait(None)  # every later read ends too
            raise StopAsyncIteration
        return item

    async def send_message(self, msg: agent_pb.AgentSessionMessage) -> None:
        if self._phase == "closed":
            raise RuntimeError("room session transport is closed")
        if self._out is None:
            self._out = RoomSessionTransport(self._room, self._remote_identity)
        await self._out.send_message(msg)

    async def close(self) -> None:
        if (left := self.shut()) is not None:
            await left

    def shut(self) -> asyncio.Future[Any] | None:
        """``close()``, returning what is still ending (a stream being read), or None when
        nothing is: a closer with nothing to wait for needs no task."""
        phase, self._phase = self._phase, "closed"
        if phase == "closed":
            return None
        if phase == "open":
            with contextlib.suppress(ValueError, AttributeError):
                self._room.unregister_byte_stream_handler(TOPIC_SESSION_MESSAGES)
        task, self._read_task = self._read_task, None
        if task is not None:
            task.cancel()
        streams, self._streams = self._streams or (), None
        for reader, _ in streams:
            reader.close()
        self._received.put_nowait(None)
        # livekit's sending side holds nothing to release: its reading side never started
        # (its close only closes two channels of its own)
        self._out = None
        return None if task is None else asyncio.gather(task, return_exceptions=True)

    def __aiter__(self) -> AsyncIterator[agent_pb.AgentSessionMessage]:
        return self

    async def __anext__(self) -> agent_pb.AgentSessionMessage:
        return (await self.receive()).message


class SessionPipe(SessionTransport):
    """The transport one per-session livekit ``SessionHost`` sees: requests the job host
    feeds it in; its replies and events go out on the job's transport."""

    def __init__(self, out: SessionTransport) -> None:
        self._out = out
        # the pipe's open end; None once closed (requests fed after that go nowhere)
        self._inbox: Inbox[agent_pb.AgentSessionMessage | None] | None = Inbox()

    def feed(self, request: agent_pb.SessionRequest) -> None:
        if self._inbox is not None:
            self._inbox.put_nowait(agent_pb.AgentSessionMessage(request=request))

    async def start(self) -> None:
        return None

    async def send_message(self, msg: agent_pb.AgentSessionMessage) -> None:
        await self._out.send_message(msg)

    async def close(self) -> None:
        # closes only this pipe: the job's transport belongs to the job host
        inbox, self._inbox = self._inbox, None
        if inbox is not None:
            inbox.put_nowait(None)  # ends a read waiting on it

    def __aiter__(self) -> AsyncIterator[agent_pb.AgentSessionMessage]:
        return self

    async def __anext__(self) -> agent_pb.AgentSessionMessage:
        inbox = self._inbox
        msg = None if inbox is None else await inbox.get()
        if msg is None:
            raise StopAsyncIteration
        return msg


def start_on_pipe(host: SessionHost) -> None:
    """Start livekit's ``SessionHost`` over a ``SessionPipe`` now, without a task.

    Its ``start()`` awaits only the pipe's ``start()``, which returns at once, then makes
    its read and write tasks: the coroutine ends on its first step. One that waits (a
    livekit that changed it) is refused plainly rather than left half-run."""
    if not isinstance(host._transport, SessionPipe):
        raise TypeError("start_on_pipe() is for a SessionHost over a SessionPipe")
    start = host.start()
    try:
        start.send(None)
    except StopIteration:
        return
    start.close()
    raise RuntimeError("SessionHost.start() waited over a SessionPipe; start it as a task")


def request_problem(req: agent_pb.SessionRequest) -> str | None:
    """What makes ``req`` unanswerable, or ``None``: an unknown kind, or a field of a known
    kind that arrived with the wrong wire type (so protobuf set it aside and would read a
    default in its place, e.g. ``provisional_success`` silently false)."""
    bad = _mistyped_fields(req)
    if bad:
        return f"malformed request: {', '.join(bad)} has the wrong type"
    kind = req.WhichOneof("request")
    if kind is None:
        return "unknown request kind"
    bad = _mistyped_fields(getattr(req, kind))
    if bad:
        return f"malformed {kind}: {', '.join(bad)} has the wrong type"
    return None


def _mistyped_fields(msg: pb_message.Message) -> list[str]:
    by_number = msg.DESCRIPTOR.fields_by_number
    unknown = UnknownFieldSet(msg)
    numbers = {unknown[i].field_number for i in range(len(unknown))}
    return sorted(by_number[n].name for n in numbers if n in by_number)


_UNREADABLE_IN_A_ROW = 1000
OnRequest = Callable[[agent_pb.SessionRequest, str | None], None]


class RequestReader:
    """A host's reading of ``transport``, begun at once: each request goes to
    ``on_request(request, sender)``. ``opened`` says how the transport's start went (its
    failure, logged, is set there). ``RoomRequestTransport`` hands requests on itself, with
    no task; any other transport is read by a task (``read_requests``). ``fields``: what
    its log lines carry (the host's job's labels)."""

    __slots__ = ("_fields", "_task", "_transport", "opened")

    def __init__(
        self, transport: SessionTransport, on_request: OnRequest, fields: Fields = _no_fields
    ) -> None:
        loop = asyncio.get_running_loop()
        self.opened: asyncio.Future[None] = loop.create_future()
        self._transport, self._fields = transport, fields
        self._task: asyncio.Task[None] | None = None
        if isinstance(transport, RoomRequestTransport):
            try:
                transport.listen(on_request, fields=fields)
            except Exception as e:
                self.opened.set_exception(start_refused(e, fields))
            else:
                self.opened.set_result(None)
        else:
            self._task = loop.create_task(
                read_requests(transport, self.opened, on_request, fields),
                name="JobSessionHost._read",
            )

    def stop(self) -> asyncio.Future[Any] | None:
        """End the reading and close the transport, once; returns what is still ending, or
        None when nothing is."""
        task, self._task = self._task, None
        if task is None:
            transport = self._transport
            return transport.shut() if isinstance(transport, RoomRequestTransport) else None
        if task is asyncio.current_task():
            return None  # the reader itself asked: it closes the transport as it ends
        task.cancel()
        out: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def done(_: object) -> None:
            if not out.done():
                out.set_result(None)

        def ended(_: object) -> None:
            if not task.cancelled() and (error := task.exception()) is not None:
                logger.warning(
                    "the session transport's reader failed: %s", error, extra=self._fields()
                )
            closing = self._closed_after(task)
            if closing is None:
                done(None)
            else:
                closing.add_done_callback(done)

        task.add_done_callback(ended)
        return out

    def _closed_after(self, reader: asyncio.Task[None]) -> asyncio.Future[None] | None:
        opened = self.opened
        if not opened.done():
            opened.set_result(None)  # cancelled before it ran: the start's waiter returns
        elif reader.cancelled() and opened.exception() is None:
            return None  # its start went, so its cancellation closed the transport
        # failed, ended, never ran
        return asyncio.ensure_future(close_quietly(self._transport, self._fields))


async def read_requests(
    transport: SessionTransport,
    opened: asyncio.Future[None],
    on_request: OnRequest,
    fields: Fields = _no_fields,
) -> None:
    """Start ``transport`` (``opened`` says how that went), then hand each request it
    reads to ``on_request(request, sender)`` (the sender when the transport can say:
    ``RoomRequestTransport`` can) until cancelled. Cancelled, it closes the transport
    before it ends: whoever stops the reading waits for it, with no task of its own."""
    try:
        await transport.start()
    except asyncio.CancelledError:
        if not opened.done():
            opened.set_result(None)  # closed while it started: its waiter just returns
        await close_quietly(transport, fields)
        raise
    except Exception as e:
        # logged there; `opened` raises it to whoever waits on the start
        error = start_refused(e, fields)
        if not opened.done():
            opened.set_exception(error)
            opened.add_done_callback(_retrieved)
        return
    if not opened.done():
        opened.set_result(None)
    del opened  # a live job holds this frame: nothing more than it needs
    try:
        await _read(transport, on_request, fields)
    except asyncio.CancelledError:
        await close_quietly(transport, fields)
        raise


def start_refused(e: Exception, fields: Fields = _no_fields) -> Exception:
    """What a transport's failed start means to its host, logged: a topic whose handler is
    taken (livekit's ``ValueError``) was taken by a session's own host."""
    error: Exception = e
    if isinstance(e, ValueError):
        error = RuntimeError(
            f"the session transport cannot start ({e}); start the AgentSession with "
            "session_host=False so the job's host is the only one"
        )
        error.__cause__ = e
    logger.warning("the session transport did not start: %s", error, extra=fields())
    return error


async def _read(transport: SessionTransport, on_request: OnRequest, fields: Fields) -> None:
    """Each request read, handed on, until the transport ends or fails every read."""
    named = cast(SenderAware, transport) if sender_aware(transport) else None
    it = transport.__aiter__()
    unreadable = 0
    while True:
        sender: str | None = None
        try:
            if named is not None:
                received = await named.receive()
                msg, sender = received.message, received.sender
            else:
                msg = await it.__anext__()
        except StopAsyncIteration:
            return
        except Exception:  # (a CancelledError is no Exception: it goes on up)
            # one unreadable message must not stop the host; a transport that fails every
            # read, without ever waiting, would hold the loop: it is given up on
            unreadable += 1
            logger.warning("unreadable session message", exc_info=True, extra=fields())
            if unreadable >= _UNREADABLE_IN_A_ROW:
                logger.error(
                    "the session transport failed %d reads in a row", unreadable, extra=fields()
                )
                return
            continue
        unreadable = 0
        try:
            _hand_on(msg, sender, on_request, fields)
        except Exception:  # the host's: the next message is read all the same
            logger.exception("handing on a session message from %r failed", sender, extra=fields())


def _hand_on(
    msg: agent_pb.AgentSessionMessage, sender: str | None, on_request: OnRequest, fields: Fields
) -> None:
    if msg.HasField("request"):
        on_request(msg.request, sender)
    else:
        logger.debug("ignored session message %r", msg.WhichOneof("message"), extra=fields())


async def close_quietly(transport: SessionTransport, fields: Fields = _no_fields) -> None:
    """Close ``transport``; a close that fails is logged (the reading is over either way)."""
    try:
        await transport.close()
    except Exception:
        logger.warning("the session transport did not close cleanly", exc_info=True, extra=fields())


def _retrieved(fut: asyncio.Future[None]) -> None:
    """Mark a refused start as seen (it was logged): no "never retrieved" report."""
    if not fut.cancelled():
        fut.exception()
