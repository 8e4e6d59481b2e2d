"""``RoomRequestTransport``: livekit's session byte streams, each message with its sender.

An unconnected ``InMemoryRoom`` (a real ``rtc.Room``) takes the byte stream handler as the
SDK registers it; the streams handed to it stand in for ``ByteStreamReader`` (whose chunks
come from the FFI, which needs a server), with the identity the server stamps on each
stream. Sending goes through livekit's own ``RoomSessionTransport`` onto the in-memory
local participant.
"""

from __future__ import annotations

import asyncio
import logging

import pytest
from livekit.agents.voice.remote_session import TOPIC_SESSION_MESSAGES, SessionHost
from livekit.protocol.agent_pb import agent_session as agent_pb

from agent_runtime.sdk.session_transport import (
    Received,
    RequestReader,
    RoomRequestTransport,
    SenderAware,
    SessionPipe,
    start_on_pipe,
)
from agent_runtime.testing.clock import settle
from agent_runtime.testing.inmemory import InMemoryRoom, InMemorySessionTransport
from agent_runtime.testing.wire import build_request
from tests.support.host_rig import started_session


class Stream:
    """One incoming byte stream: its chunks, and whether the transport closed it."""

    def __init__(self, data: bytes, *, hold: asyncio.Event | None = None) -> None:
        self._chunks = [data[:3], data[3:]]
        self._hold = hold
        self.closed = False

    def __aiter__(self) -> Stream:
        return self

    async def __anext__(self) -> bytes:
        if self._hold is not None:
            await self._hold.wait()  # a slow sender: its chunks come later
        if not self._chunks:
            self.closed = True
            raise StopAsyncIteration
        return self._chunks.pop(0)

    def close(self) -> None:
        self.closed = True


def message(request_id: str) -> bytes:
    req = build_request("ping", request_id=request_id)
    return agent_pb.AgentSessionMessage(request=req).SerializeToString()


async def started(remote_identity: str | None = None) -> tuple[InMemoryRoom, RoomRequestTransport]:
    room = InMemoryRoom()
    room.connect_locally()
    transport = RoomRequestTransport(room, remote_identity)
    await transport.start()
    return room, transport


def deliver(room: InMemoryRoom, stream: Stream, identity: str) -> None:
    # what rtc.Room does with a stream header on our topic
    room._byte_stream_handlers[TOPIC_SESSION_MESSAGES](stream, identity)  # type: ignore[arg-type]


async def test_each_message_comes_with_its_sender_in_the_order_the_streams_opened() -> None:
    room, transport = await started()
    assert isinstance(transport, SenderAware)
    slow = asyncio.Event()
    deliver(room, Stream(message("a"), hold=slow), "simulator")
    deliver(room, Stream(message("b")), "user")
    await settle()
    slow.set()  # the first stream finishes after the second one was already whole
    got = [await transport.receive(), await transport.receive()]
    assert [(r.message.request.request_id, r.sender) for r in got] == [
        ("a", "simulator"),
        ("b", "user"),
    ]
    await transport.close()


async def test_only_the_remote_identity_is_read_when_one_is_set() -> None:
    room, transport = await started(remote_identity="simulator")
    other = Stream(message("x"))
    deliver(room, other, "user")
    deliver(room, Stream(message("y")), "simulator")
    received = await transport.receive()
    assert (received.message.request.request_id, received.sender) == ("y", "simulator")
    assert other.closed  # released unread
    await transport.close()


async def test_an_unreadable_stream_is_logged_and_skipped(caplog: pytest.LogCaptureFixture) -> None:
    room, transport = await started()
    with caplog.at_level(logging.WARNING, logger="agent_runtime.session_transport"):
        deliver(room, Stream(b"\xff\xff\xff"), "user")
        deliver(room, Stream(message("ok")), "simulator")
        received = await transport.receive()
    assert received.message.request.request_id == "ok"
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [
        "unreadable session message from 'user'"
    ]
    await transport.close()


async def test_replies_go_out_on_the_topic_and_close_releases_the_room() -> None:
    room, transport = await started()
    resp = agent_pb.SessionResponse(request_id="r", error="nope")
    await transport.send_message(agent_pb.AgentSessionMessage(response=resp))
    ((topic, data, _),) = room.local_participant.sent_bytes
    assert topic == TOPIC_SESSION_MESSAGES
    assert agent_pb.AgentSessionMessage.FromString(data).response.error == "nope"
    pending = Stream(message("late"), hold=asyncio.Event())
    deliver(room, pending, "user")
    queued = Stream(message("later"))
    deliver(room, queued, "user")
    await settle()
    await transport.close()
    assert TOPIC_SESSION_MESSAGES not in room._byte_stream_handlers
    assert pending.closed and queued.closed  # cut short or never read: released
    with pytest.raises(StopAsyncIteration):
        await transport.receive()
    with pytest.raises(RuntimeError, match="closed"):
        await transport.send_message(agent_pb.AgentSessionMessage(response=resp))
    await transport.close()  # twice is fine


async def test_a_listener_is_handed_each_request_with_its_sender_and_no_reader_waits() -> None:
    room = InMemoryRoom()
    room.connect_locally()
    transport = RoomRequestTransport(room)
    got: list[tuple[str, str | None]] = []
    transport.listen(lambda req, sender: got.append((req.request_id, sender)))
    event = agent_pb.AgentSessionMessage(event=agent_pb.AgentSessionEvent())
    deliver(room, Stream(event.SerializeToString()), "simulator")  # not a request: ignored
    deliver(room, Stream(message("a")), "simulator")
    deliver(room, Stream(message("b")), "user")
    await settle()
    assert got == [("a", "simulator"), ("b", "user")]
    # nothing was read and nothing was sent: the close has nothing left to wait for
    assert transport.shut() is None
    assert TOPIC_SESSION_MESSAGES not in room._byte_stream_handlers
    with pytest.raises(StopAsyncIteration):
        await transport.receive()


async def test_a_listener_that_raises_is_logged_and_the_next_request_is_handed_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    room = InMemoryRoom()
    room.connect_locally()
    transport = RoomRequestTransport(room)
    got: list[str] = []

    def on_request(req: agent_pb.SessionRequest, _sender: str | None) -> None:
        if req.request_id == "bad":
            raise RuntimeError("listener broke")
        got.append(req.request_id)

    transport.listen(on_request)
    with caplog.at_level(logging.ERROR, logger="agent_runtime.session_transport"):
        deliver(room, Stream(message("bad")), "user")
        deliver(room, Stream(message("ok")), "simulator")
        await settle()
    assert got == ["ok"]
    assert [r.getMessage() for r in caplog.records] == [
        "handing on a session message from 'user' failed"
    ]
    await transport.close()


async def test_a_listener_given_a_transport_read_from_before_gets_what_was_read_first() -> None:
    room, transport = await started()  # a user's transport, started and read from already
    deliver(room, Stream(message("early")), "simulator")
    await settle()
    got: list[str] = []
    reader = RequestReader(transport, lambda req, _sender: got.append(req.request_id))
    deliver(room, Stream(message("late")), "simulator")
    await settle()
    assert got == ["early", "late"]
    assert reader.opened.done() and reader.stop() is None


async def test_a_host_s_reader_task_logs_a_request_it_could_not_hand_on_and_reads_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # any transport other than the room's is read by a task (read_requests)
    sim_end, agent_end = InMemorySessionTransport.pair(identities=("simulator", "agent"))
    got: list[str] = []

    def on_request(req: agent_pb.SessionRequest, _sender: str | None) -> None:
        if req.request_id == "bad":
            raise RuntimeError("host broke")
        got.append(req.request_id)

    reader = RequestReader(agent_end, on_request)
    with caplog.at_level(logging.ERROR, logger="agent_runtime.session_transport"):
        for rid in ("bad", "ok"):
            req = build_request("ping", request_id=rid)
            await sim_end.send_message(agent_pb.AgentSessionMessage(request=req))
        await settle()
    assert got == ["ok"]
    assert [r.getMessage() for r in caplog.records] == [
        "handing on a session message from 'simulator' failed"
    ]
    stopping = reader.stop()
    assert stopping is not None
    await stopping
    assert agent_end.closed


async def test_a_second_handler_on_the_topic_is_refused() -> None:
    room, _transport = await started()
    with pytest.raises(ValueError):
        await RoomRequestTransport(room).start()
    await _transport.close()


async def test_the_in_memory_pair_names_the_sender_too() -> None:
    sim_end, agent_end = InMemorySessionTransport.pair(identities=("simulator", "agent"))
    req = agent_pb.AgentSessionMessage(request=build_request("ping", request_id="1"))
    await sim_end.send_message(req)
    await sim_end.send_message(req, sender="user")  # a test playing another participant
    agent_end._inbox.put_nowait(req.SerializeToString())  # raw bytes: no known sender
    got = [await agent_end.receive() for _ in range(3)]
    assert [r.sender for r in got] == ["simulator", "user", None]
    assert isinstance(got[0], Received) and isinstance(agent_end, SenderAware)
    await agent_end.close()
    with pytest.raises(StopAsyncIteration):
        await agent_end.receive()


async def test_a_host_over_a_pipe_starts_at_once_and_answers_what_the_pipe_is_fed() -> None:
    sim_end, agent_end = InMemorySessionTransport.pair()
    await sim_end.start()
    await agent_end.start()
    session = await started_session("I am piped")
    pipe = SessionPipe(agent_end)
    host = SessionHost(pipe)
    host.register_session(session)
    start_on_pipe(host)  # returns started: its read and write loops are running
    pipe.feed(build_request("get_agent_info", request_id="r1"))
    await settle()
    (reply,) = [m.response for m in sim_end.receive_nowait() if m.HasField("response")]
    assert reply.request_id == "r1"
    assert reply.get_agent_info.instructions == "I am piped"
    await host.aclose()
    await session.aclose()


async def test_start_on_pipe_refuses_a_host_over_another_transport() -> None:
    _, agent_end = InMemorySessionTransport.pair()
    with pytest.raises(TypeError, match="over a SessionPipe"):
        start_on_pipe(SessionHost(agent_end))


async def test_a_refused_start_or_a_close_before_start_leaves_the_topic_to_its_owner() -> None:
    """A transport the room refused (a session's own host has the topic) closes without
    taking that handler away; one closed before it started never takes the topic."""
    room, owner = await started()
    held = room._byte_stream_handlers[TOPIC_SESSION_MESSAGES]
    refused = RoomRequestTransport(room)
    with pytest.raises(ValueError):
        await refused.start()
    await refused.close()
    assert room._byte_stream_handlers[TOPIC_SESSION_MESSAGES] == held
    await owner.close()
    early = RoomRequestTransport(room)
    await early.close()
    await early.start()  # closed: nothing registered
    assert TOPIC_SESSION_MESSAGES not in room._byte_stream_handlers
