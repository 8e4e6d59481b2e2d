"""Every avatar plugin published for livekit-agents 1.8.9, unchanged, through AvatarLifecycle.

Each plugin (bey, tavus, simli, anam, lemonslice, liveavatar) is the package as published:
its own constructor, ``start()`` (the access token it mints, its retries, its parsing of
the provider's answer), the audio sink it installs and that sink's own interruption
handling. Only the provider's network is faked, at the narrowest point every one of them
goes through: ``aiohttp.ClientSession.post`` (the HTTP calls that ask the provider for an
avatar; answered per URL like the provider would, or with a 401 for "provider error") and
``aiohttp.ClientSession.ws_connect`` (liveavatar's audio websocket; a fake socket that says
``connected`` and records what the plugin sends). The room is the in-memory ``rtc.Room``
(no SFU here); the avatar "joins" when the test adds its participant and video.

``EXPECTED`` is what each case asserts, per plugin; the README's plugin table is rendered
from it (``test_readme_table_matches_what_is_asserted`` keeps the two equal).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from livekit import api
from livekit.agents import Agent, utils
from livekit.agents.testing import fake_job_context
from livekit.agents.voice.avatar import AvatarSession, DataStreamAudioOutput, QueueAudioOutput
from livekit.plugins import anam, bey, hedra, lemonslice, liveavatar, simli, tavus

from agent_runtime.agent_job import AgentJob
from agent_runtime.avatar import AvatarLifecycle, AvatarPluginError
from agent_runtime.clock import settle
from agent_runtime.trace import Tracer
from tests.support.avatar_rig import Rig, frames, playback_finished

KEY, SECRET = "test-key", "test-secret-" + "x" * 32
URL = "wss://env.invalid"

PLUGINS: dict[str, Callable[[], AvatarSession]] = {  # type: ignore[type-arg]
    "bey": lambda: bey.AvatarSession(api_key="k"),
    "tavus": lambda: tavus.AvatarSession(api_key="k"),
    "simli": lambda: simli.AvatarSession(
        simli_config=simli.SimliConfig(api_key="k", face_id="face")
    ),
    "anam": lambda: anam.AvatarSession(
        persona_config=anam.PersonaConfig(name="n", avatarId="a"), api_key="k"
    ),
    "lemonslice": lambda: lemonslice.AvatarSession(agent_id="a", api_key="k"),
    "liveavatar": lambda: liveavatar.AvatarSession(avatar_id="a", api_key="k"),
}

# the provider's answer to each call the plugins make (by the end of the URL)
ANSWERS: dict[str, Any] = {
    "/v1/sessions": {},  # bey
    "/conversations": {"conversation_id": "c-1"},  # tavus
    "/compose/token": {"session_token": "st-1"},  # simli
    "/integrations/livekit/agents": {},  # simli
    "/v1/engine/session": {"sessionId": "s-1"},  # anam
    "/liveai/sessions": {"session_id": "ls-1"},  # lemonslice
    "/token": {"code": 100, "data": {"session_id": "la-1", "session_token": "lt-1"}},
    "/start": {"code": 100, "data": {"ws_url": "wss://liveavatar.invalid/ws"}},
    "/stop": {"code": 100},
}

CASES = (
    "never joins, avatar first",
    "never joins, session first",
    "provider error",
    "join then leave",
    "join then close",
    "interrupt while joined",
    "interrupt while not joined",
    "start options",
)
_ROOM = "restored, room audio"
_DS_JOINED = "lk.clear_buffer RPC by the plugin's sink; it holds the next reply until settled"
EXPECTED: dict[str, dict[str, str]] = {
    name: {
        "sink": "DataStreamAudioOutput",
        "never joins, avatar first": f"{_ROOM} at join_timeout",
        "never joins, session first": f"{_ROOM} at join_timeout",
        "provider error": f"{_ROOM} at once (start_error)",
        "join then leave": f"{_ROOM} at once",
        "join then close": "closed, room audio, avatar removed",
        "interrupt while joined": _DS_JOINED,
        "interrupt while not joined": "no RPC; speech released at once",
        "start options": "credentials passed to its start()",
    }
    for name in PLUGINS
}
# simli catches its provider's error, logs it and installs no route
EXPECTED["simli"]["provider error"] = f"{_ROOM} at once (no_route)"
# lemonslice routes before its HTTP call, and sets its sink not to hold after a clear
EXPECTED["lemonslice"]["provider error"] = f"{_ROOM} at once (start_error after its route)"
EXPECTED["lemonslice"]["interrupt while joined"] = (
    "lk.clear_buffer RPC by the plugin's sink; nothing held (its no-hold setting)"
)
EXPECTED["liveavatar"].update(
    {
        "sink": "QueueAudioOutput",
        "interrupt while joined": (
            "its own clear: queue dropped, clear_buffer event, agent.interrupt on its websocket"
        ),
        "interrupt while not joined": (
            "its own clear (queue dropped, no RPC); speech released at once"
        ),
    }
)


# -- the fake provider ---------------------------------------------------------------------


class _Response:
    def __init__(self, status: int, body: Any) -> None:
        self.status, self.ok = status, 200 <= status < 300
        self._text = json.dumps(body)

    async def text(self) -> str:
        return self._text

    async def json(self) -> Any:
        return json.loads(self._text)

    async def read(self) -> bytes:
        return self._text.encode()

    async def __aenter__(self) -> _Response:
        return self

    async def __aexit__(self, *_: Any) -> None:
        return None


class FakeSocket:
    """liveavatar's websocket: says ``connected``, records what the plugin sends."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.inbox: utils.aio.Chan[aiohttp.WSMessage] = utils.aio.Chan()
        self.server_says({"type": "session.state_updated", "state": "connected"})

    def server_says(self, event: dict[str, Any]) -> None:
        self.inbox.send_nowait(aiohttp.WSMessage(aiohttp.WSMsgType.TEXT, json.dumps(event), None))

    async def send_json(self, data: dict[str, Any], **_: Any) -> None:
        self.sent.append(data)

    async def receive(self, *_: Any) -> aiohttp.WSMessage:
        try:
            return await self.inbox.recv()
        except utils.aio.ChanClosed:
            return aiohttp.WSMessage(aiohttp.WSMsgType.CLOSED, None, None)

    async def close(self, **_: Any) -> bool:
        self.inbox.close()
        return True

    def types(self) -> list[str]:
        return [m.get("type", "") for m in self.sent]


@dataclass
class Provider:
    fail: bool = False  # the call that creates the avatar's session answers 401
    calls: list[tuple[str, Any]] = field(default_factory=list)
    sockets: list[FakeSocket] = field(default_factory=list)

    def post(self, url: Any, **kw: Any) -> _Response:
        if "/twirp/" in str(url):
            return _Response(200, {})  # the LiveKit server API (the plugin's own removal)
        payload = kw.get("json")
        if payload is None and kw.get("data") is not None:
            payload = str(kw["data"])
        self.calls.append((str(url), payload))
        if self.fail:
            return _Response(401, {"error": "invalid api key"})
        for tail, body in ANSWERS.items():
            if str(url).rstrip("/").endswith(tail):
                return _Response(200, body)
        raise AssertionError(f"the fake provider does not know {url}")

    async def ws_connect(self, url: Any = None, **_: Any) -> FakeSocket:
        sock = FakeSocket()
        self.sockets.append(sock)
        return sock


@contextlib.asynccontextmanager
async def plugin_rig(
    name: str, monkeypatch: pytest.MonkeyPatch, *, fail: bool = False, env: bool = True, **kw: Any
) -> AsyncIterator[tuple[Rig, Provider]]:
    """The plugin and its lifecycle on an in-memory room and a virtual clock, inside
    upstream's fake job (the plugins read the agent's identity from its token) and its
    http context."""
    provider = Provider(fail=fail)
    # class attributes: called with the session first, as the real methods are
    monkeypatch.setattr(
        aiohttp.ClientSession, "post", lambda _s, url=None, **kw: provider.post(url, **kw)
    )
    monkeypatch.setattr(
        aiohttp.ClientSession, "ws_connect", lambda _s, url=None, **kw: provider.ws_connect(url)
    )
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
            rig.avatar = PLUGINS[name]()
            options = {k: v for k, v in kw.items() if k != "connected"}
            options.setdefault("remove_participant", rig._remove)
            rig.lifecycle = AvatarLifecycle(
                rig.avatar, clock=rig.clock, tracer=Tracer(rig.trace), **options
            )
            try:
                yield rig, provider
            finally:
                await rig.aclose()


def sink_of(rig: Rig) -> Any:
    return rig.lifecycle.installed_sink


def rpcs_to(rig: Rig) -> list[str]:
    return [c.destination for c in rig.rpcs()]


async def speak(rig: Rig) -> Any:
    handle = rig.session.say("hello", audio=frames(50), add_to_chat_ctx=False)
    await settle()
    return handle


# -- the cases -----------------------------------------------------------------------------

NAMES = list(PLUGINS)


def test_every_plugin_is_the_published_one() -> None:
    for name in NAMES:
        version = metadata.version(f"livekit-plugins-{name}")
        assert version.startswith("1.8."), (name, version)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("session_first", [False, True], ids=["avatar first", "session first"])
async def test_never_joins(name: str, session_first: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    async with plugin_rig(name, monkeypatch, join_timeout=10.0) as (rig, provider):
        if session_first:
            await rig.start_session()
        await rig.start_avatar()
        if not session_first:
            await rig.start_session()
        assert provider.calls  # the plugin asked its provider for an avatar
        sink = sink_of(rig)
        assert type(sink).__name__ == EXPECTED[name]["sink"]
        assert rig.lifecycle.state == "routing"
        assert rig.lifecycle.audio_route() == "avatar"  # its sink, whatever its class
        await rig.clock.advance(9.9)
        assert rig.lifecycle.state == "routing"
        await rig.clock.advance(0.1)
        assert rig.lifecycle.state == "restored"
        assert rig.lifecycle.audio_route() == "room"


@pytest.mark.parametrize("name", NAMES)
async def test_provider_error(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    async with plugin_rig(name, monkeypatch, fail=True) as (rig, provider):
        await rig.start_session()
        await rig.start_avatar()
        assert provider.calls
        assert rig.lifecycle.state == "restored"  # at once: no join_timeout waited out
        assert rig.clock.now() == 0.0
        assert rig.lifecycle.audio_route() == "room"
        cause = {r.event for r in rig.trace.records if r.dest == "failed"}
        want = "no_route" if "no_route" in EXPECTED[name]["provider error"] else "start_error"
        assert cause == {want}


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("how", ["leave", "close"])
async def test_join_then_leave_or_close(
    name: str, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with plugin_rig(name, monkeypatch) as (rig, _):
        await rig.start_session()
        await rig.start_avatar()
        rig.join()
        await settle()
        assert rig.lifecycle.state == "joined"
        assert rig.lifecycle.audio_route() == "avatar"
        if how == "leave":
            rig.room.remove_participant(rig.avatar.avatar_identity)
            await settle()
            assert rig.lifecycle.state == "restored"
        else:
            await rig.lifecycle.aclose()
            assert rig.lifecycle.state == "closed"
            assert rig.removed == [rig.avatar.avatar_identity]
            assert rig.avatar.avatar_identity not in rig.room.remote_participants
        assert rig.lifecycle.audio_route() == "room"


@pytest.mark.parametrize("name", NAMES)
async def test_interrupt_while_joined_is_delivered_the_plugins_way(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with plugin_rig(name, monkeypatch) as (rig, provider):
        await rig.start_session()
        await rig.start_avatar()
        rig.join()
        await settle()
        identity = rig.avatar.avatar_identity
        sink = sink_of(rig)
        cleared: list[str] = []
        if isinstance(sink, QueueAudioOutput):
            sink.on("clear_buffer", lambda: cleared.append("clear_buffer"))
        handle = await speak(rig)
        if isinstance(sink, QueueAudioOutput):
            # the provider starts speaking what it was sent
            provider.sockets[0].server_says({"type": "agent.speak_started"})
            await settle()
        rig.session.interrupt()
        await settle()
        if isinstance(sink, DataStreamAudioOutput):
            assert rpcs_to(rig) == [identity]  # the plugin's own RPC, once
            held = sink._clear_buffer_atask is not None and not sink._clear_buffer_atask.done()
            assert held is ("holds the next reply" in EXPECTED[name]["interrupt while joined"])
            assert rig.lifecycle.state == ("clearing" if held else "joined")
            # the avatar says where it stopped, as real ones do
            await rig.room.invoke_rpc(
                "lk.playback_finished", identity, playback_finished(0.1, interrupted=True)
            )
            await settle()
        else:
            assert rig.rpcs() == []  # nothing in a protocol this avatar does not speak
            assert cleared == ["clear_buffer"]  # the sink's own clear and its event
            assert "agent.interrupt" in provider.sockets[0].types()  # told over its websocket
        assert handle.done()
        assert rig.lifecycle.state == "joined"
        assert rig.lifecycle.audio_route() == "avatar"


@pytest.mark.parametrize("name", NAMES)
async def test_interrupt_while_not_joined_sends_nothing(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with plugin_rig(name, monkeypatch) as (rig, provider):
        await rig.start_session()
        await rig.start_avatar()
        assert rig.lifecycle.state == "routing"
        handle = await speak(rig)
        assert not handle.done()  # the audio waits for an avatar that is not there
        rig.session.interrupt()
        await settle()
        assert handle.done()  # at once: no 5 s "speech not done in time" fallback
        assert rig.rpcs() == []
        if provider.sockets:
            assert "agent.interrupt" not in provider.sockets[0].types()
        assert rig.lifecycle.state == "routing"


@pytest.mark.parametrize("name", NAMES)
async def test_start_options_reach_the_plugins_start(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with plugin_rig(name, monkeypatch, env=False) as (rig, provider):
        await rig.start_session()
        with pytest.raises(AvatarPluginError, match="does not take livekit_token"):
            await rig.lifecycle.start(rig.session, rig.room, livekit_token="t")
        assert rig.lifecycle.state == "idle" and provider.calls == []  # nothing changed
        await rig.lifecycle.start(
            rig.session,
            rig.room,
            livekit_url="wss://options.invalid",
            livekit_api_key=KEY,
            livekit_api_secret=SECRET,
        )
        await settle()
        assert rig.lifecycle.state == "routing"
        assert "wss://options.invalid" in json.dumps([p for _, p in provider.calls])


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


# -- the README table ----------------------------------------------------------------------


def render_table() -> str:
    head = ["plugin", "version", "sink", *CASES]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in NAMES:
        row = [name, metadata.version(f"livekit-plugins-{name}"), f"`{EXPECTED[name]['sink']}`"]
        row += [EXPECTED[name][c] for c in CASES]
        lines.append("| " + " | ".join(row) + " |")
    hedra_version = metadata.version("livekit-plugins-hedra")
    hedra_row = [
        "hedra",
        hedra_version,
        "none (a disabled stub)",
        "cannot be built: `AgentJob(avatar=hedra.AvatarSession)` logs why, naming it, "
        "and the job runs on room audio",
        *["—"] * (len(CASES) - 1),
    ]
    lines.append("| " + " | ".join(hedra_row) + " |")
    return "\n".join(lines)


def test_readme_table_matches_what_is_asserted() -> None:
    readme = (Path(__file__).parent.parent / "docs" / "guide" / "avatar-plugins.md").read_text()
    assert render_table() in readme, "README plugin table is stale:\n" + render_table()
