"""Every avatar plugin published for livekit-agents 1.8.x, unchanged, through AvatarLifecycle.

Each plugin is the package as published: its own constructor, ``start()`` (the token it
mints, its retries, its parsing of the provider's answer), the sink it installs and that
sink's own interruption handling. Only the provider's network is faked, at the narrowest
point they all go through: ``aiohttp.ClientSession._request`` (every HTTP verb of every
aiohttp session: answered per URL as the provider would, with a 401, or with a connection
error) and ``ClientSession._ws_connect`` (liveavatar's websocket: a socket that says
``connected`` and records what it is sent). The room is the in-memory ``rtc.Room`` (no SFU
here); the avatar "joins" when the test adds its participant and video. The job's removal
of the avatar participant is faked at the API call (``Rig._remove``, what the server does).

Each case runs wrapped and, where it applies, unwrapped (the plugin started on its own, as
upstream runs it): the control. ``PLUGINS`` says what each plugin is and what each case
asserts; the plugin table of ``docs/guide/avatar-plugins.md`` is rendered from it
(``test_docs_table_matches_what_is_asserted`` keeps the two equal).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import json
import logging
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import websockets
from livekit import api
from livekit.agents import Agent, APIConnectOptions, utils
from livekit.agents.testing import fake_job_context
from livekit.agents.voice.avatar import AvatarSession, DataStreamAudioOutput, QueueAudioOutput
from livekit.plugins import (
    anam,
    avatario,
    avatartalk,
    bey,
    bithuman,
    did,
    hedra,
    keyframe,
    lemonslice,
    liveavatar,
    protoface,
    runway,
    simli,
    spatialreal,
    spatius,
    synthesia,
    tavus,
    trugen,
)
from spatius.telemetry import configure_telemetry

from agent_runtime.observe.trace import Tracer
from agent_runtime.runtimes.avatar import (
    AvatarLifecycle,
    AvatarPluginError,
    audio_tail,
    plugin_name,
    route_of,
)
from agent_runtime.runtimes.playout import PlayoutTracker
from agent_runtime.settings import PlayoutOptions
from agent_runtime.system.agent_job import AgentJob
from agent_runtime.testing.clock import settle
from tests.support.avatar_rig import Rig, frames, playback_finished, session_listeners

# spatius's SDK exports its own telemetry to its provider unless told not to (its off switch)
configure_telemetry("")

KEY, SECRET = "test-key", "test-secret-" + "x" * 32
URL = "wss://env.invalid"
# the plugins' own retries, without their real-time waits between attempts
FAST = APIConnectOptions(max_retry=2, retry_interval=0.0, timeout=5.0)

_DS = "DataStreamAudioOutput"
_CLEAR_HELD = "lk.clear_buffer by its sink; it holds the next reply until the report (2 s bound)"
_CLEAR_UNBOUND = "lk.clear_buffer by its sink; no hold and no bound of its own"
_ADDS_DS = (
    "restores room audio on a failed start, no join or a leave; bounds playout and its "
    "clear; removes the avatar after close"
)


@dataclass(frozen=True)
class Plugin:
    """What one plugin is, and what the cases assert about it."""

    build: Callable[[], AvatarSession]  # type: ignore[type-arg]
    delivery: str  # where its audio goes (the docs table)
    clear: str  # what its sink does on an interruption (the docs table)
    adds: str = _ADDS_DS  # what the wrapper adds (the docs table)
    sink: str = _DS
    join_signal: str = "video"
    # identities the provider's side brings into the room with the avatar
    companions: tuple[str, ...] = ()
    # a start that fails: how the machine learns it, for an HTTP status / a connection error
    fails_as: tuple[str, str] = ("start_error", "start_error")
    # a start that never joins: how it ends (synthesia waits for the join inside start())
    never_joins_as: str = "join_timeout"
    # the sink's own bound on a clear the avatar never answers (None: none)
    clear_bound: float | None = 2.0
    # RPC methods the plugin registers itself (they stay its own)
    own_rpcs: tuple[str, ...] = ()
    # provider calls made for one start that fails, with a 401 / a connection error (its own
    # retries, here with FAST's 2 attempts where the plugin takes connect options)
    calls_on_401: int = 1
    calls_on_error: int = 3
    # its aclose() removes the avatar through the server API itself
    removes_itself: bool = True
    # the avatar reports playback with lk.playback_finished (a data stream's sink, or the
    # plugin's own handler); a clear goes as lk.clear_buffer (a data stream's sink only)
    reports_by_rpc: bool = True
    clear_by_rpc: bool = True
    # the protobuf its SDK's websocket speaks (spatius, spatialreal), if any
    proto: str = ""
    # what its own close tells its provider (checked after a wrapped close), if anything
    close_call: str = ""


def _simli() -> AvatarSession:  # type: ignore[type-arg]
    return simli.AvatarSession(
        simli_config=simli.SimliConfig(api_key="k", face_id="face"), conn_options=FAST
    )


PLUGINS: dict[str, Plugin] = {
    "anam": Plugin(
        lambda: anam.AvatarSession(
            persona_config=anam.PersonaConfig(name="n", avatarId="a"),
            api_key="k",
            conn_options=FAST,
        ),
        "data stream to its avatar participant",
        _CLEAR_HELD,
    ),
    "avatario": Plugin(
        lambda: avatario.AvatarSession(avatar_id="a", api_key="k", conn_options=FAST),
        "data stream to its avatar participant",
        _CLEAR_HELD,
        calls_on_error=2,
    ),
    "avatartalk": Plugin(
        lambda: avatartalk.AvatarSession(api_secret="k"),
        "data stream to `listener`, not to its avatar participant `avatartalk-agent`",
        _CLEAR_HELD + "; the clear and the report go to and come from `listener`",
        adds=_ADDS_DS + "; takes `lk.playback_finished` from `listener`, as its sink does",
        companions=("listener",),
        fails_as=("no_route", "start_error"),  # it logs its provider's 401 and returns
        calls_on_error=1,
    ),
    "bey": Plugin(
        lambda: bey.AvatarSession(api_key="k", conn_options=FAST),
        "data stream to its avatar participant",
        _CLEAR_HELD,
        calls_on_401=1,
    ),
    "bithuman": Plugin(
        lambda: bithuman.AvatarSession(avatar_id="a", api_secret="s", conn_options=FAST),
        "cloud mode: data stream to its avatar participant, no wait for its video",
        _CLEAR_HELD,
        calls_on_401=2,  # it retries even a 401
        calls_on_error=2,
    ),
    "did": Plugin(
        lambda: did.AvatarSession(agent_id="a", api_key="k", conn_options=FAST),
        "data stream to its avatar participant",
        _CLEAR_HELD,
    ),
    "keyframe": Plugin(
        lambda: keyframe.AvatarSession(persona_id="p", api_key="k", conn_options=FAST),
        "data stream to its avatar participant; waits for its `lk.playback_started`",
        _CLEAR_UNBOUND,
        clear_bound=None,
        own_rpcs=("lk.playback_started",),
    ),
    "lemonslice": Plugin(
        lambda: lemonslice.AvatarSession(agent_id="a", api_key="k", conn_options=FAST),
        "data stream to its avatar participant (route in before its HTTP call)",
        _CLEAR_UNBOUND,
        clear_bound=None,
    ),
    "liveavatar": Plugin(
        lambda: liveavatar.AvatarSession(avatar_id="a", api_key="k", conn_options=FAST),
        "queue, forwarded over its provider's websocket",
        "its own: queue dropped, `agent.interrupt` on its websocket",
        adds="restores room audio on a failed start, no join or a leave; bounds playout; "
        "removes the avatar after close",
        sink="QueueAudioOutput",
        calls_on_error=2,
        reports_by_rpc=False,
        clear_by_rpc=False,
    ),
    "protoface": Plugin(
        lambda: protoface.AvatarSession(api_key="k", conn_options=FAST),
        "data stream to its avatar participant",
        _CLEAR_HELD,
    ),
    "runway": Plugin(
        lambda: runway.AvatarSession(avatar_id="a", api_key="k", conn_options=FAST),
        "data stream to its avatar participant; END_CALL to its provider on close (by data "
        "packet, else by cancelling the session over HTTP)",
        _CLEAR_HELD,
        close_call="DELETE /v1/realtime_sessions/s-1",
        calls_on_error=2,
    ),
    "simli": Plugin(
        _simli,
        "data stream to its avatar participant",
        _CLEAR_HELD,
        fails_as=("no_route", "no_route"),  # it logs its provider's errors and returns
    ),
    "spatius": Plugin(
        lambda: spatius.AvatarSession(
            api_key="k",
            app_id="app",
            avatar_id="a",
            region="us-west",
            console_endpoint_url="https://console.invalid",
            ingress_endpoint_url="https://ingress.invalid",
        ),
        "queue, forwarded over its SDK's websocket (protobuf); it takes the avatar's "
        "`lk.playback_started` / `lk.playback_finished` with handlers of its own",
        "its own: an interrupt on its websocket, its own 2 s fallback for the report",
        adds="restores room audio on a failed start, no join or a leave; bounds playout; "
        "removes the avatar after close",
        sink="QueueAudioOutput",
        own_rpcs=("lk.playback_started", "lk.playback_finished"),
        clear_by_rpc=False,
        calls_on_error=1,
        proto="spatius",
    ),
    "spatialreal": Plugin(
        lambda: spatialreal.AvatarSession(
            api_key="k",
            app_id="app",
            avatar_id="a",
            console_endpoint_url="https://console.invalid",
            ingress_endpoint_url="https://ingress.invalid",
        ),
        "resumable queue, forwarded over its SDK's websocket (protobuf); playback is "
        "reported on that websocket",
        "its own: an interrupt on its websocket",
        adds="restores room audio on a failed start, no join or a leave; bounds playout; "
        "removes the avatar after close, which its own aclose() never does (it drops its "
        "room first)",
        sink="QueueAudioOutput",
        reports_by_rpc=False,
        clear_by_rpc=False,
        removes_itself=False,
        calls_on_401=3,  # it retries its whole provider start, 0.5 s and 1 s apart
        calls_on_error=3,
        proto="spatialreal",
    ),
    "synthesia": Plugin(
        lambda: synthesia.AvatarSession(synthesia.AvatarConfig(avatar_ids=["a"]), api_key="k"),
        "data stream to its avatar participant; its start() waits for the join and it "
        "tears itself down when the avatar leaves",
        _CLEAR_HELD,
        never_joins_as="start_timeout",
        calls_on_error=1,  # max_retry=0 for its launch call
    ),
    "tavus": Plugin(
        lambda: tavus.AvatarSession(api_key="k", conn_options=FAST),
        "data stream to its avatar participant",
        _CLEAR_HELD,
    ),
    "trugen": Plugin(
        lambda: trugen.AvatarSession(api_key="k", conn_options=FAST),
        "data stream to its avatar participant",
        _CLEAR_HELD,
    ),
}
NAMES = list(PLUGINS)
DATA_STREAM = [n for n in NAMES if PLUGINS[n].sink == _DS]
REPORTED = [n for n in NAMES if PLUGINS[n].reports_by_rpc]

# the provider's answer to every call (each plugin reads its own fields of it)
ANSWER: dict[str, Any] = {
    "id": "s-1",
    "session_id": "s-1",
    "sessionId": "s-1",
    "conversation_id": "c-1",
    "session_token": "st-1",
    "task_id": "t-1",
    "sessionToken": "st-1",
    "model_id": "m-1",
    "code": 100,
    "data": {"session_id": "la-1", "session_token": "lt-1", "ws_url": "wss://ws.invalid/ws"},
}


# -- the fake provider ---------------------------------------------------------------------


class _Response:
    def __init__(self, status: int, body: Any) -> None:
        self.status, self.ok = status, 200 <= status < 300
        self.reason = "OK" if self.ok else "Unauthorized"
        self.headers: dict[str, str] = {"Content-Type": "application/json"}
        self.content_type = "application/json"
        # bytes: a protobuf answer (the server API's); else a JSON one
        self._text = body.decode() if isinstance(body, bytes) else json.dumps(body)

    async def text(self, *_: Any, **__: Any) -> str:
        return self._text

    async def json(self, *_: Any, **__: Any) -> Any:
        return json.loads(self._text)

    async def read(self) -> bytes:
        return self._text.encode()

    def raise_for_status(self) -> None:
        if not self.ok:
            raise aiohttp.ClientResponseError(
                None,  # type: ignore[arg-type]
                (),
                status=self.status,
                message=self.reason,
            )

    def release(self) -> None:
        return None

    def close(self) -> None:
        return None

    async def __aenter__(self) -> _Response:
        return self

    async def __aexit__(self, *_: Any) -> None:
        return None


class FakeSocket:
    """liveavatar's websocket: says ``connected``, records what the plugin sends."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.inbox: utils.aio.Chan[aiohttp.WSMessage] = utils.aio.Chan()
        self.closed = False
        self.server_says({"type": "session.state_updated", "state": "connected"})

    def server_says(self, event: dict[str, Any]) -> None:
        self.inbox.send_nowait(aiohttp.WSMessage(aiohttp.WSMsgType.TEXT, json.dumps(event), None))

    async def send_json(self, data: dict[str, Any], **_: Any) -> None:
        self.sent.append(data)

    async def send_str(self, data: str, **_: Any) -> None:
        self.sent.append(json.loads(data))

    async def receive(self, *_: Any) -> aiohttp.WSMessage:
        try:
            return await self.inbox.recv()
        except utils.aio.ChanClosed:
            return aiohttp.WSMessage(aiohttp.WSMsgType.CLOSED, None, None)

    async def close(self, **_: Any) -> bool:
        self.closed = True
        self.inbox.close()
        return True

    def types(self) -> list[str]:
        return [m.get("type", "") for m in self.sent]


class ProtoSocket:
    """A provider SDK's websocket (``websockets.connect``): answers the session handshake
    with a confirmation and records the envelopes it is sent (spatius's protobuf)."""

    def __init__(self, pb: Any) -> None:
        self._pb = pb
        self.sent: list[int] = []  # envelope types
        self.raw: list[bytes] = []
        self.inbox: asyncio.Queue[bytes | None] = asyncio.Queue()

    async def send(self, data: bytes) -> None:
        msg = self._pb.Message()
        msg.ParseFromString(data)
        self.sent.append(msg.type)
        self.raw.append(data)
        if msg.type == self._pb.MESSAGE_CLIENT_CONFIGURE_SESSION:
            reply = self._pb.Message()
            reply.type = self._pb.MESSAGE_SERVER_CONFIRM_SESSION
            reply.server_confirm_session.connection_id = "conn-1"
            self.inbox.put_nowait(reply.SerializeToString())

    async def recv(self) -> bytes:
        data = await self.inbox.get()
        if data is None:
            raise websockets.exceptions.ConnectionClosedOK(None, None)
        return data

    def __aiter__(self) -> ProtoSocket:
        return self

    async def __anext__(self) -> bytes:
        data = await self.inbox.get()
        if data is None:
            raise StopAsyncIteration
        return data

    async def close(self, *_: Any, **__: Any) -> None:
        self.inbox.put_nowait(None)

    def interrupts(self) -> int:
        return self.sent.count(self._pb.MESSAGE_CLIENT_INTERRUPT)


@dataclass
class Provider:
    fail: str = ""  # "status": every provider call answers 401; "connection": cannot connect
    calls: list[tuple[str, str, Any]] = field(default_factory=list)
    server_api: list[str] = field(default_factory=list)  # the LiveKit server API's methods
    sockets: list[FakeSocket] = field(default_factory=list)
    proto_sockets: list[ProtoSocket] = field(default_factory=list)
    pb: Any = None  # the protobuf module its SDK's websocket speaks

    async def request(self, method: str, url: Any, **kw: Any) -> _Response:
        if "/twirp/" in str(url):
            # the LiveKit server API: what a plugin's own aclose() asks of it
            self.server_api.append(str(url).rsplit("/", 1)[-1])
            return _Response(200, b"")  # an empty protobuf answer
        payload = kw.get("json")
        if payload is None and kw.get("data") is not None:
            payload = str(kw["data"])
        self.calls.append((method, str(url), payload))
        if self.fail == "connection":
            raise aiohttp.ClientConnectionError("connection refused (the fake provider)")
        if self.fail == "status":
            return _Response(401, {"error": "invalid api key", "message": "invalid api key"})
        return _Response(200, ANSWER)

    async def ws_connect(self, url: Any = None, **_: Any) -> FakeSocket:
        if self.fail == "connection":
            raise aiohttp.ClientConnectionError("connection refused (the fake provider)")
        sock = FakeSocket()
        self.sockets.append(sock)
        return sock

    async def connect(self, url: Any = None, **_: Any) -> ProtoSocket:
        if self.fail == "connection":
            raise OSError("connection refused (the fake provider)")
        sock = ProtoSocket(self.pb)
        self.proto_sockets.append(sock)
        return sock

    def creates(self) -> int:
        """The calls that ask the provider for an avatar (not its stop/close calls)."""
        return len([c for c in self.calls if c[0] == "POST"])


@contextlib.asynccontextmanager
async def plugin_rig(
    name: str,
    monkeypatch: pytest.MonkeyPatch,
    *,
    fail: str = "",
    env: bool = True,
    wrapped: bool = True,
    **kw: Any,
) -> AsyncIterator[tuple[Rig, Provider]]:
    """The plugin (and its lifecycle, when ``wrapped``) on an in-memory room and a virtual
    clock, inside upstream's fake job (the plugins read the agent's identity from its token)
    and its http context."""
    provider = Provider(fail=fail)
    if PLUGINS[name].proto:
        provider.pb = importlib.import_module(f"{PLUGINS[name].proto}.proto.generated.message_pb2")

    async def request(_s: Any, method: str, url: Any, **kw: Any) -> _Response:
        return await provider.request(method, url, **kw)

    async def ws_connect(_s: Any, url: Any = None, **kw: Any) -> FakeSocket:
        return await provider.ws_connect(url)

    monkeypatch.setattr(aiohttp.ClientSession, "_request", request)
    monkeypatch.setattr(aiohttp.ClientSession, "_ws_connect", ws_connect)
    monkeypatch.setattr(websockets, "connect", provider.connect)

    def no_network(host: Any, *_: Any, **__: Any) -> Any:
        raise OSError(f"no network in these tests (a plugin looked up {host!r})")

    # whatever a provider's SDK tries beyond the fakes fails here, never on the wire
    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    for var, value in (
        ("LIVEKIT_URL", URL),
        ("LIVEKIT_API_KEY", KEY),
        ("LIVEKIT_API_SECRET", SECRET),
    ):
        if env:
            monkeypatch.setenv(var, value)
        else:
            monkeypatch.delenv(var, raising=False)
    rig = Rig(**kw)  # the room, clock and session; the lifecycle is the plugin's, below
    async with utils.http_context.open():
        with fake_job_context(room=rig.room) as job:
            job._info.token = api.AccessToken(KEY, SECRET).with_identity("agent").to_jwt()
            rig.avatar = PLUGINS[name].build()
            options = {k: v for k, v in kw.items() if k != "connected"}
            options.setdefault("remove_participant", rig._remove)
            rig.lifecycle = AvatarLifecycle(
                rig.avatar, clock=rig.clock, tracer=Tracer(rig.trace), **options
            )
            rig.wrapped = wrapped  # type: ignore[attr-defined]
            try:
                yield rig, provider
            finally:
                if wrapped:
                    await rig.aclose()
                else:
                    with contextlib.suppress(Exception):
                        await rig.avatar.aclose()
                    await rig.session.aclose()
                    await settle()


async def start(rig: Rig) -> None:
    """The session, then the avatar: through the lifecycle, or the plugin on its own. Not
    awaited: synthesia's start() returns only once its avatar has joined."""
    await rig.start_session()
    if getattr(rig, "wrapped", True):
        await rig.start_avatar_aside()
    else:
        task = asyncio.ensure_future(rig.avatar.start(rig.session, rig.room))
        # unwrapped, a failed start is the app's to handle
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        await settle()


def join(rig: Rig, name: str) -> None:
    rig.join()
    for identity in PLUGINS[name].companions:
        rig.room.add_participant(identity, kind="agent")


def reporter(rig: Rig) -> str:
    """Who reports playback: the identity the plugin's own sink streams to (else the
    avatar, to the plugin's own handler)."""
    sink = audio_tail(rig.session)
    if isinstance(sink, DataStreamAudioOutput):
        return sink._destination_identity
    return str(rig.avatar.avatar_identity)


def assert_cleared_its_way(rig: Rig, name: str, provider: Provider) -> None:
    """The plugin's own clear went out, once: its sink's RPC, or its SDK's interrupt."""
    if PLUGINS[name].clear_by_rpc:
        assert [c.destination for c in rig.rpcs()] == [reporter(rig)]
    else:
        assert rig.rpcs() == []
        assert [s.interrupts() for s in provider.proto_sockets] == [1]


async def speak(rig: Rig, n: int = 50) -> Any:
    handle = rig.session.say("hello", audio=frames(n), add_to_chat_ctx=False)
    await settle()
    return handle


async def joined_and_speaking(rig: Rig, name: str) -> Any:
    await start(rig)
    join(rig, name)
    await settle()
    if getattr(rig, "wrapped", True):
        assert rig.lifecycle.state == "joined"
    return await speak(rig)


# -- the cases -----------------------------------------------------------------------------


def test_every_plugin_is_the_published_one() -> None:
    for name in NAMES:
        version = metadata.version(f"livekit-plugins-{name}")
        assert version.startswith("1.8."), (name, version)
    assert metadata.version("livekit-agents") == "1.8.9"


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("session_first", [False, True], ids=["avatar first", "session first"])
async def test_never_joins(name: str, session_first: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = PLUGINS[name]
    async with plugin_rig(name, monkeypatch, join_timeout=10.0) as (rig, provider):
        if session_first:
            await rig.start_session()
        started = await rig.start_avatar_aside()
        if not session_first:
            await rig.start_session()
        assert provider.calls  # the plugin asked its provider for an avatar
        sink = rig.lifecycle.installed_sink or audio_tail(rig.session)
        assert spec.sink in [c.__name__ for c in type(sink).__mro__]
        assert rig.lifecycle.audio_route() == "avatar"  # its sink, whatever its class
        await rig.clock.advance(9.9)
        assert rig.lifecycle.state in ("starting", "routing")
        await rig.clock.advance(0.1)
        await started
        assert rig.lifecycle.state == "restored"
        assert rig.lifecycle.audio_route() == "room"
        cause = {r.event for r in rig.trace.records if r.dest == "failed"}
        assert cause == {spec.never_joins_as}


# synthesia's start() waits for the join itself (in real time) and undoes its own route
@pytest.mark.parametrize("name", [n for n in NAMES if PLUGINS[n].never_joins_as == "join_timeout"])
async def test_never_joins_unwrapped_stays_on_the_avatar_route(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: on its own, the plugin's route stays in and nobody hears the agent."""
    async with plugin_rig(name, monkeypatch, wrapped=False) as (rig, _):
        await start(rig)
        await rig.clock.advance(3600)
        assert route_of(rig.session, audio_tail(rig.session)) == "avatar"


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("fail", ["status", "connection"])
async def test_provider_failure(name: str, fail: str, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = PLUGINS[name]
    async with plugin_rig(name, monkeypatch, fail=fail) as (rig, provider):
        await rig.start_session()
        await rig.start_avatar()
        assert provider.calls
        assert rig.lifecycle.state == "restored"  # at once: no join_timeout waited out
        assert rig.clock.now() == 0.0
        assert rig.lifecycle.audio_route() == "room"
        cause = {r.event for r in rig.trace.records if r.dest == "failed"}
        assert cause == {spec.fails_as[0 if fail == "status" else 1]}
        # its own retries, unchanged
        assert provider.creates() == (
            spec.calls_on_401 if fail == "status" else spec.calls_on_error
        )


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("how", ["leave", "close"])
async def test_join_then_leave_or_close(
    name: str, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with plugin_rig(name, monkeypatch) as (rig, provider):
        await start(rig)
        join(rig, name)
        await settle()
        assert rig.lifecycle.state == "joined"
        assert rig.lifecycle.join_signal == "video"
        assert rig.lifecycle.audio_route() == "avatar"
        if how == "leave":
            rig.room.remove_participant(rig.avatar.avatar_identity)
            await settle()
            assert rig.lifecycle.state == "restored"
        else:
            await rig.lifecycle.aclose()
            assert rig.lifecycle.state == "closed"
            # the plugin's own removal (through the server API) when it makes one, and the
            # job's, faked at the API call, in every case
            assert ("RemoveParticipant" in provider.server_api) is PLUGINS[name].removes_itself
            assert rig.removed == [rig.avatar.avatar_identity]
            assert rig.avatar.avatar_identity not in rig.room.remote_participants
            if PLUGINS[name].close_call:  # its own close still tells its provider
                method, tail = PLUGINS[name].close_call.split(" ")
                assert any(m == method and u.endswith(tail) for m, u, _ in provider.calls)
        assert rig.lifecycle.audio_route() == "room"


@pytest.mark.parametrize("name", REPORTED)
@pytest.mark.parametrize("wrapped", [True, False], ids=["wrapped", "unwrapped"])
async def test_a_normal_replys_playback_report_ends_it(
    name: str, wrapped: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The avatar's ``lk.playback_finished``, from whoever the plugin's sink streams to,
    ends the reply: wrapped as unwrapped."""
    async with plugin_rig(name, monkeypatch, wrapped=wrapped) as (rig, _):
        handle = await joined_and_speaking(rig, name)
        assert not handle.done()  # pushed, not yet played there
        reply = await rig.room.invoke_rpc(
            "lk.playback_finished", reporter(rig), playback_finished(0.5)
        )
        await settle()
        assert reply == "ok"
        assert handle.done()


@pytest.mark.parametrize("name", DATA_STREAM)
async def test_a_report_from_anyone_else_is_refused(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with plugin_rig(name, monkeypatch) as (rig, _):
        handle = await joined_and_speaking(rig, name)
        with pytest.raises(Exception, match="accepted only from the avatar"):
            await rig.room.invoke_rpc("lk.playback_finished", "user", playback_finished(0.5))
        await settle()
        assert not handle.done()


@pytest.mark.parametrize("name", REPORTED)
@pytest.mark.parametrize("wrapped", [True, False], ids=["wrapped", "unwrapped"])
async def test_an_interruption_the_avatar_answers(
    name: str, wrapped: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with plugin_rig(name, monkeypatch, wrapped=wrapped) as (rig, provider):
        handle = await joined_and_speaking(rig, name)
        rig.session.interrupt()
        await settle()
        assert_cleared_its_way(rig, name, provider)
        await rig.room.invoke_rpc(
            "lk.playback_finished", reporter(rig), playback_finished(0.1, interrupted=True)
        )
        await settle()
        assert handle.done()
        if wrapped:
            assert rig.lifecycle.state == "joined"
            assert rig.lifecycle.audio_route() == "avatar"


# the control runs where the plugin sets no bound of its own (one of 2 s real time is not
# waited for here)
@pytest.mark.parametrize(
    ("name", "wrapped"),
    [pytest.param(n, True, id=f"wrapped-{n}") for n in REPORTED]
    + [
        pytest.param(n, False, id=f"unwrapped-{n}")
        for n in REPORTED
        if PLUGINS[n].clear_bound is None
    ],
)
async def test_an_interruption_the_avatar_never_answers(
    name: str, wrapped: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Wrapped with the playout machine a job composes by default with an avatar, the cut
    reply ends within ``margin`` of virtual time; unwrapped, a plugin whose sink has no
    bound of its own keeps its segment pending for good (a sink's own real-time 2 s bound,
    where it has one, is not waited for here: the control is run where it has none)."""
    async with plugin_rig(name, monkeypatch, wrapped=wrapped) as (rig, provider):
        if wrapped:
            tracker = PlayoutTracker(
                rig.session, options=PlayoutOptions(), avatar=rig.lifecycle, clock=rig.clock
            )
            tracker.start()
        handle = await joined_and_speaking(rig, name)
        rig.session.interrupt()
        await settle()
        assert_cleared_its_way(rig, name, provider)
        assert not handle.done()  # the avatar never says where it stopped
        await rig.clock.advance(PlayoutOptions().margin + 0.01)
        await settle()
        sink = audio_tail(rig.session)
        assert sink is not None
        if wrapped:
            assert handle.done()
            assert sink._pending_playback_count == 0  # the segment ended: nothing "speaking"
            assert [d.cause for d in tracker.done][-1:] == ["playout_timeout"]
            await tracker.aclose()
        else:
            await rig.clock.advance(3600)
            # upstream's hang: the sink's segment stays pending, so its wait_for_playout()
            # never returns (the speech handle is only cut by the SDK's 5 s real-time
            # fallback, which leaves the segment open)
            assert sink._pending_playback_count == 1
            # the avatar answers an hour late, so the control can close without that wait
            await rig.room.invoke_rpc(
                "lk.playback_finished", reporter(rig), playback_finished(0.1, interrupted=True)
            )
            await settle()


@pytest.mark.parametrize("name", NAMES)
async def test_interrupt_while_not_joined_sends_nothing(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with plugin_rig(name, monkeypatch) as (rig, provider):
        await rig.start_session()
        await rig.start_avatar_aside()
        assert rig.lifecycle.state in ("starting", "routing")
        handle = await speak(rig)
        assert not handle.done()  # the audio waits for an avatar that is not there
        rig.session.interrupt()
        await settle()
        assert handle.done()  # at once: no 5 s "speech not done in time" fallback
        assert rig.rpcs() == []
        if provider.sockets:
            assert "agent.interrupt" not in provider.sockets[0].types()


@pytest.mark.parametrize("name", [n for n in NAMES if not PLUGINS[n].clear_by_rpc])
async def test_a_queue_plugins_interrupt_while_joined_is_its_own(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A queue sink's clear, its event, and the plugin telling its provider its own way."""
    async with plugin_rig(name, monkeypatch) as (rig, provider):
        await start(rig)
        join(rig, name)
        await settle()
        sink = rig.lifecycle.installed_sink
        assert isinstance(sink, QueueAudioOutput)
        cleared: list[str] = []
        sink.on("clear_buffer", lambda: cleared.append("clear_buffer"))
        await speak(rig)
        if provider.sockets:  # liveavatar: its provider starts speaking what it was sent
            provider.sockets[0].server_says({"type": "agent.speak_started"})
            await settle()
        rig.session.interrupt()
        await settle()
        assert rig.rpcs() == []  # nothing in a protocol this avatar does not speak
        assert cleared == ["clear_buffer"]  # the sink's own clear and its event
        if provider.sockets:
            assert "agent.interrupt" in provider.sockets[0].types()  # over its websocket
        else:
            assert [s.interrupts() for s in provider.proto_sockets] == [1]  # its SDK's
        assert rig.lifecycle.state == "joined"


@pytest.mark.parametrize("name", NAMES)
async def test_the_plugins_own_rpc_handlers_stay_its_own(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the plugin registers itself is the same object wrapped as unwrapped; the only
    handler the wrapper takes is a data stream's ``lk.playback_finished`` (its sink's class
    handler, which it answers for the same identity)."""
    seen: dict[bool, dict[str, str]] = {}
    for wrapped in (False, True):
        async with plugin_rig(name, monkeypatch, wrapped=wrapped) as (rig, _):
            await start(rig)
            join(rig, name)
            await settle()
            handlers = rig.room.local_participant.rpc_handlers
            seen[wrapped] = {m: getattr(h, "__qualname__", "?") for m, h in handlers.items()}
            for method in PLUGINS[name].own_rpcs:
                owner = getattr(handlers[method], "__self__", None)
                assert not isinstance(owner, AvatarLifecycle), method
    taken = {"lk.playback_finished"} if name in DATA_STREAM else set()
    assert {m: h for m, h in seen[True].items() if m not in taken} == {
        m: h for m, h in seen[False].items() if m not in taken
    }
    assert set(PLUGINS[name].own_rpcs) <= set(seen[True])


@pytest.mark.parametrize("name", NAMES)
async def test_start_options_reach_the_plugins_start(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with plugin_rig(name, monkeypatch, env=False) as (rig, provider):
        await rig.start_session()
        with pytest.raises(AvatarPluginError, match="does not take livekit_token"):
            await rig.lifecycle.start(rig.session, rig.room, livekit_token="t")
        assert rig.lifecycle.state == "idle" and provider.calls == []  # nothing changed
        started = rig.lifecycle.start(
            rig.session,
            rig.room,
            livekit_url="wss://options.invalid",
            livekit_api_key=KEY,
            livekit_api_secret=SECRET,
        )
        task = asyncio.ensure_future(started)
        await settle()
        assert rig.lifecycle.state in ("starting", "routing")
        sent = json.dumps([p for *_, p in provider.calls])
        sent += "".join(r.decode(errors="replace") for s in provider.proto_sockets for r in s.raw)
        assert "wss://options.invalid" in sent
        await rig.lifecycle.aclose()
        await task


# -- the job's defaults ----------------------------------------------------------------------


async def test_a_job_with_an_avatar_bounds_playout_by_default() -> None:
    rig = Rig()
    job = AgentJob(room=rig.room, session=rig.session, avatar=rig.avatar, clock=rig.clock)
    assert job.playout is not None and job.playout.options == PlayoutOptions()
    assert job.playout.options.reprompt is False  # the re-prompt stays opt-in
    off = AgentJob(
        room=rig.room, session=Rig().session, avatar=rig.avatar, clock=rig.clock, playout=False
    )
    assert off.playout is None
    bare = AgentJob(room=rig.room, session=Rig().session, clock=rig.clock)
    assert bare.playout is None  # no avatar: the SDK's own playout report ends each turn


@pytest.mark.parametrize("plugin_removes", [True, False], ids=["plugin removed it", "it did not"])
async def test_the_job_removes_the_avatar_through_the_server_api(
    plugin_removes: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In production the job is given no remover: it asks the server API itself, after the
    plugin's own close. Faked at that API call (``RoomService.remove_participant``): the
    first call is the plugin's own; when it fails (a server error, not "not found") the
    plugin only logs it, and the job's call removes the avatar."""
    from livekit.api import TwirpError
    from livekit.api.room_service import RoomService

    async with plugin_rig("bey", monkeypatch) as (rig, _):
        calls: list[str] = []

        async def remove_participant(_svc: Any, req: api.RoomParticipantIdentity) -> Any:
            calls.append(req.identity)
            if len(calls) == 1 and not plugin_removes:
                raise TwirpError("unavailable", "the server could not answer", status=503)
            if rig.room.remove_participant(req.identity) is None:
                raise TwirpError("not_found", "participant not found", status=404)
            return api.RemoveParticipantResponse()

        monkeypatch.setattr(RoomService, "remove_participant", remove_participant)
        job = AgentJob(room=rig.room, session=rig.session, avatar=rig.avatar, clock=rig.clock)
        await job.start_runtime()
        started = asyncio.ensure_future(job.start(Agent(instructions="test")))
        await settle()
        rig.join()
        await settle()
        await started
        identity = rig.avatar.avatar_identity
        assert job.states["avatar"] == "joined"
        await job.aclose()
        assert calls == [identity, identity]  # the plugin's own, then the job's
        assert identity not in rig.room.remote_participants


async def test_a_job_with_no_server_api_warns_nothing_of_its_own_about_the_avatars_removal(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """livekit's console job has no server URL or keys: ``ctx.api`` raises "url must be
    set". The plugin's own ``aclose()`` warns of that (livekit's line); the job's removal,
    after the failed start and again at the close, added a WARNING each time."""
    caplog.set_level(logging.DEBUG, logger="agent_runtime")
    async with plugin_rig("bey", monkeypatch, env=False) as (rig, _):
        job = AgentJob(room=rig.room, session=rig.session, avatar=rig.avatar, clock=rig.clock)
        await job.start(Agent(instructions="test"))  # no LIVEKIT_URL: bey's start fails
        await settle()
        assert job.states["avatar"] == "restored"  # given up, the plugin closed
        await job.aclose()
    ours = [
        (r.levelname, r.getMessage())
        for r in caplog.records
        if r.name.startswith("agent_runtime") and "url must be set" in r.getMessage()
    ]
    assert ours and {level for level, _ in ours} == {"DEBUG"}, ours


@pytest.mark.parametrize("name", [n for n in REPORTED if PLUGINS[n].clear_bound is None])
async def test_a_default_job_is_never_left_speaking_after_an_unanswered_clear(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """keyframe and lemonslice set no bound on a clear: in a job built with the defaults, the
    cut reply still ends, ``margin`` after the cut, and the agent listens again."""
    async with plugin_rig(name, monkeypatch) as (rig, _):
        job = AgentJob(
            room=rig.room,
            session=rig.session,
            avatar=rig.avatar,
            clock=rig.clock,
            remove_avatar_participant=rig._remove,
        )
        started = asyncio.ensure_future(job.start(Agent(instructions="test")))
        await settle()
        join(rig, name)
        await settle()
        await started
        assert job.states["avatar"] == "joined"
        handle = await speak(rig)
        rig.session.interrupt()
        await settle()
        assert not handle.done()
        await rig.clock.advance(PlayoutOptions().margin + 0.01)
        await settle()
        assert handle.done()
        sink = audio_tail(rig.session)
        assert sink is not None and sink._pending_playback_count == 0
        assert job.playout is not None and job.playout.done[-1].cause == "playout_timeout"
        await job.aclose()


# -- plugins that cannot run -----------------------------------------------------------------


async def test_hedra_stub_is_named_and_the_agent_runs_on_room_audio(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """hedra 1.7 is a disabled stub: its AvatarSession is no AvatarSession and raises in its
    constructor. Given as a factory, AgentJob logs why and runs without it; given as an
    object, it is refused by name."""
    assert metadata.version("livekit-plugins-hedra").startswith("1.7.")
    assert not issubclass(hedra.AvatarSession, AvatarSession)
    rig = Rig()
    job = AgentJob(room=rig.room, session=rig.session, avatar=hedra.AvatarSession, clock=rig.clock)
    assert job.avatar is None
    assert job.avatar_error is not None
    assert "livekit.plugins.hedra.avatar.AvatarSession" in job.avatar_error
    assert "has been disabled" in job.avatar_error
    assert "livekit.plugins.hedra.avatar.AvatarSession" in caplog.text
    await job.start(Agent(instructions="test"))
    await settle()
    assert job.audio_route() == "room"
    assert "avatar" not in job.states
    await job.aclose(graceful=False)
    await rig.session.aclose()
    with pytest.raises(TypeError, match=r"livekit\.plugins\.hedra\.avatar\.AvatarSession"):
        AvatarLifecycle(object.__new__(hedra.AvatarSession))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("factory", "why"),
    [
        (
            functools.partial(bey.AvatarSession, avatr_id="a"),
            "unexpected keyword argument 'avatr_id'",
        ),
        (anam.AvatarSession, r"missing a required (keyword-only )?argument: 'persona_config'"),
        (simli.AvatarSession, r"missing a required (keyword-only )?argument: 'simli_config'"),
    ],
    ids=["misspelt-keyword", "anam-without-persona", "simli-without-config"],
)
async def test_a_factory_that_can_never_build_its_plugin_is_refused_before_anything_is_built(
    factory: Any, why: str
) -> None:
    """A factory's call that cannot bind is the code's mistake, like a wrong plugin: it
    used to be logged at run time and the job shipped green on room audio."""
    rig = Rig()
    before = (session_listeners(rig.session), sum(map(len, rig.room._events.values())))
    with pytest.raises(AvatarPluginError, match=why) as refused:
        AgentJob(room=rig.room, session=rig.session, avatar=factory, clock=rig.clock)
    assert "cannot be built from what was given" in str(refused.value)
    assert plugin_name(factory) in str(refused.value)
    after = (session_listeners(rig.session), sum(map(len, rig.room._events.values())))
    assert after == before  # nothing was touched


# -- the docs table ----------------------------------------------------------------------------

DOC = Path(__file__).parent.parent / "docs" / "guide" / "avatar-plugins.md"


def render_table() -> str:
    head = [
        "plugin",
        "version",
        "delivery",
        "join signal",
        "clear (its own)",
        "provider calls on a 401 / a connection error",
        "what the wrapper adds",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    rows = [(n, PLUGINS[n]) for n in NAMES]
    rows.insert(NAMES.index("bithuman") + 1, ("bithuman", BITHUMAN_LOCAL))
    for name, p in rows:
        row = [
            name,
            metadata.version(f"livekit-plugins-{name}"),
            f"`{p.sink}`: {p.delivery}",
            p.join_signal,
            p.clear,
            f"{p.calls_on_401} / {p.calls_on_error}" if p is not BITHUMAN_LOCAL else "none made",
            p.adds,
        ]
        lines.append("| " + " | ".join(row) + " |")
    lines.append(
        f"| hedra | {metadata.version('livekit-plugins-hedra')} | none (a disabled stub) | — | — "
        "| — | cannot be built: `AgentJob(avatar=hedra.AvatarSession)` logs why, naming it, "
        "and the job runs on room audio |"
    )
    return "\n".join(lines)


def test_docs_table_matches_what_is_asserted() -> None:
    assert render_table() in DOC.read_text(), "the plugin table is stale:\n" + render_table()


# -- in-process avatars: bithuman's local mode ----------------------------------------------


class StandInRuntime:
    """Stands in for bithuman's ``AsyncBithuman`` (the plugin takes one as ``runtime=``): the
    real one loads a model file (none can be fetched here) and asks bithuman's server for a
    token. It renders black frames and ends each segment it is given; the plugin, its
    ``QueueAudioOutput`` and livekit's ``AvatarRunner`` (which publishes from the agent's own
    participant) are the real ones."""

    class settings:  # the SDK's attribute name
        INPUT_SAMPLE_RATE = 16000
        FPS = 25

    transaction_id = "t-1"

    def __init__(self) -> None:
        self.pushed = 0
        self.interrupted = 0
        self._ends: asyncio.Queue[bool] = asyncio.Queue()

    def _regenerate_transaction_id(self) -> None:
        return None

    async def _initialize_token(self) -> None:
        return None

    def get_first_frame(self) -> Any:
        import numpy as np

        return np.zeros((4, 4, 3), dtype=np.uint8)

    async def push_audio(self, data: bytes, sample_rate: int, last_chunk: bool = False) -> None:
        self.pushed += len(data)

    async def flush(self) -> None:
        self._ends.put_nowait(True)

    def interrupt(self) -> None:
        self.interrupted += 1

    async def run(self) -> AsyncIterator[Any]:
        while await self._ends.get():

            class Frame:
                bgr_image = None
                audio_chunk = None
                end_of_speech = True

            yield Frame()

    async def stop(self) -> None:
        self._ends.put_nowait(False)

    def cleanup(self) -> None:
        self._ends.put_nowait(False)


BITHUMAN_LOCAL = Plugin(
    lambda: bithuman.AvatarSession(model_path="m.imx", api_secret="s", runtime=StandInRuntime()),
    "local mode: in process, a queue read by livekit's `AvatarRunner`, which publishes from "
    "the agent's own participant",
    "its own: the runner clears the queue and interrupts its runtime",
    adds="joined as its start returns: never failed by join_timeout; never removed from the "
    "room (it is the agent); bounds playout",
    sink="QueueAudioOutput",
    join_signal="none",
)


@pytest.mark.parametrize("wrapped", [True, False], ids=["wrapped", "unwrapped"])
async def test_bithuman_local_is_in_process_and_never_failed_by_join_timeout(
    wrapped: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(PLUGINS, "bithuman", BITHUMAN_LOCAL)
    async with plugin_rig("bithuman", monkeypatch, wrapped=wrapped, join_timeout=5.0) as (
        rig,
        provider,
    ):
        await start(rig)
        agent = rig.room.local_participant.identity
        assert rig.avatar.avatar_identity == agent  # the avatar is the agent itself
        assert isinstance(audio_tail(rig.session), QueueAudioOutput)
        if wrapped:
            assert rig.lifecycle.join_signal == BITHUMAN_LOCAL.join_signal == "none"
            assert rig.lifecycle.state == "joined"  # its start was its join
            await rig.clock.advance(3600)
            assert rig.lifecycle.state == "joined"  # no join_timeout fails it
            assert rig.lifecycle.audio_route() == "avatar"
        handle = await speak(rig, 20)
        await settle()
        assert handle.done()  # the runner ended the segment: played in process
        assert provider.calls == []  # nothing asked of a provider
        if wrapped:
            await rig.lifecycle.aclose()
            assert rig.removed == []  # never removes the agent itself
