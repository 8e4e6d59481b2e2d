"""What the kit takes for the agent's own failure, and what it leaves to whoever handled it.

A published avatar plugin that cannot reach its provider catches the error and logs it at
ERROR, then gives up; the runtime puts the agent back on room audio. Under the kit, the
test's own fake of the provider's network (a frame in the test's file) made that log line
"the agent's code raised ClientConnectionError" and failed the test at teardown, and the
runtime's ``start_plugin`` task, whose failure the runtime takes itself, was reported as
"Task exception was never retrieved" (the same job without the kit logs neither).

Real: the published plugins, livekit's fake ``JobContext``, ``AgentSession``,
``AgentServer``, the runtime. Faked: the provider's network (``aiohttp``'s request, as a
test of the user's would fake it), the room.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sysconfig
import threading
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp
import pytest
from livekit import rtc
from livekit.agents import Agent, AgentServer, AgentSession, APIConnectOptions, JobContext
from livekit.agents.utils import http_context, log_exceptions
from livekit.agents.voice.avatar import AvatarSession
from livekit.plugins import avatario, keyframe, lemonslice, runway

from agent_runtime import AgentJob, on_session_end
from agent_runtime.testing.clock import VirtualClock
from agent_runtime.testing.entrypoint import EntrypointRunner
from agent_runtime.testing.inmemory import InMemoryRoom
from agent_runtime.testing.scripted_avatar import ScriptedAvatar, ScriptedAvatarError
from agent_runtime.testing.user_code import UserCodeError, user_frames

pytestmark = pytest.mark.virtual_time

RETRY = APIConnectOptions(max_retry=1, retry_interval=0.0, timeout=5.0)
# plugins that catch their provider's connection error and log it at ERROR before giving up
PLUGINS: dict[str, Any] = {
    "avatario": lambda: avatario.AvatarSession(avatar_id="a", api_key="k", conn_options=RETRY),
    "keyframe": lambda: keyframe.AvatarSession(persona_id="p", api_key="k", conn_options=RETRY),
    "lemonslice": lambda: lemonslice.AvatarSession(agent_id="a", api_key="k", conn_options=RETRY),
    "runway": lambda: runway.AvatarSession(avatar_id="a", api_key="k", conn_options=RETRY),
}
NEVER_RETRIEVED = "Task exception was never retrieved"
ANNOUNCE = "the agent's announcement failed"


@pytest.fixture
def provider_down(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every HTTP call refused, by a fake in this file (the test's own code)."""

    async def refuse(*_: Any, **__: Any) -> Any:
        raise aiohttp.ClientConnectionError("provider unreachable (test fake)")

    monkeypatch.setattr(aiohttp.ClientSession, "_request", refuse)
    monkeypatch.setenv("LIVEKIT_URL", "wss://server.invalid")
    monkeypatch.setenv("LIVEKIT_API_KEY", "key")
    monkeypatch.setenv("LIVEKIT_API_SECRET", "s" * 40)


def _runner() -> tuple[EntrypointRunner, VirtualClock]:
    clock = VirtualClock()
    room = InMemoryRoom(name="r", clock=clock)
    room.connect_locally()
    room.add_participant("user")
    return EntrypointRunner(room=room, clock=clock), clock


def _server(build: Any, agent: Agent | None = None) -> AgentServer:
    server = AgentServer(session_end_timeout=315)

    @server.rtc_session(on_session_end=on_session_end)
    async def entrypoint(ctx: JobContext) -> None:
        job = AgentJob.from_job_context(ctx, session=AgentSession(), avatar=build())
        await job.start(agent or Agent(instructions="test"))

    return server


@pytest.mark.parametrize("name", sorted(PLUGINS))
async def test_a_plugin_that_logs_its_providers_error_from_the_tests_fake_passes(
    name: str, provider_down: None, caplog: pytest.LogCaptureFixture
) -> None:
    runner, clock = _runner()
    job = await runner(_server(PLUGINS[name]))
    await clock.advance(1)
    assert job.states["avatar"] == "restored" and job.audio_route() == "room"
    assert any(r.levelno == logging.ERROR and "livekit.plugins" in r.name for r in caplog.records)
    await runner.aclose()  # raised UserCodeError: the agent's code raised ClientConnectionError
    assert runner.user_failures == []
    assert not [r for r in caplog.records if NEVER_RETRIEVED in r.getMessage()]


async def test_the_agents_own_call_to_the_failing_provider_is_still_the_agents_failure(
    provider_down: None,
) -> None:
    """The same fake, reached from the agent's own ``on_enter`` (livekit logs it): the
    agent's code did not handle its provider's error, and that fails the test."""

    class Fetching(Agent):
        async def on_enter(self) -> None:
            async with http_context.http_session().get("https://provider.invalid/prompt"):
                pass

    server = AgentServer(session_end_timeout=315)

    @server.rtc_session()
    async def entrypoint(ctx: JobContext) -> None:
        job = AgentJob.from_job_context(ctx, session=AgentSession())
        await job.start(Fetching(instructions="test"))

    runner, clock = _runner()
    await runner(server)
    await clock.advance(1)
    runner.room.remove_participant("user", rtc.DisconnectReason.CLIENT_INITIATED)
    with pytest.raises(UserCodeError, match="raised ClientConnectionError") as caught:
        await runner.wait_ended()
    assert isinstance(caught.value.__cause__, aiohttp.ClientConnectionError)
    await runner.aclose()


@log_exceptions(logger=logging.getLogger("livekit.agents"))
async def _announce() -> None:
    raise ValueError(ANNOUNCE)


class _AnnouncingAvatar(ScriptedAvatar):
    """The agent's own avatar plugin: its start runs the agent's announcement (a bug,
    which livekit's ``log_exceptions`` logs), then gives up with a provider's error, which
    the runtime takes (the avatar's start failed: back to room audio)."""

    async def start(self, agent_session: Any, room: rtc.Room) -> None:
        try:
            await _announce()
        except ValueError:
            raise ScriptedAvatarError("the provider refused the avatar") from None


async def test_the_runtimes_own_task_that_failed_after_the_agents_bug_is_not_reported_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The agent's bug in the avatar's start is its failure, once. The start's own error is
    the runtime's, which took it: it was reported as the agent's task's failure too (or,
    raised in a library, logged as "Task exception was never retrieved")."""
    avatar: AvatarSession = _AnnouncingAvatar()  # type: ignore[type-arg]
    runner, clock = _runner()
    job = await runner(_server(lambda: avatar))
    await clock.advance(1)
    assert job.states["avatar"] == "restored" and job.audio_route() == "room"
    with pytest.raises(UserCodeError) as caught:
        await runner.aclose()
    assert str(caught.value).startswith("the agent's code in _announce (")
    assert str(caught.value).endswith(") raised ValueError: the agent's announcement failed")
    assert not getattr(caught.value, "__notes__", [])
    assert not [r for r in caplog.records if NEVER_RETRIEVED in r.getMessage()]


_SITE = Path(sysconfig.get_paths()["purelib"])
_WHERE = {
    "livekit": _SITE / "livekit" / "agents" / "_called.py",
    "opentelemetry": _SITE / "opentelemetry" / "_called.py",
    "aiohttp": _SITE / "aiohttp" / "_called.py",
    "stdlib": Path(sysconfig.get_paths()["stdlib"]) / "asyncio" / "_called.py",
    "runtime": Path(__file__).parents[1] / "agent_runtime" / "_called.py",
    "user": Path(__file__).parent / "my_agent.py",
}
_CALL = "def call(rest):\n    if rest:\n        return rest[0](rest[1:])\n    raise ValueError\n"


def _traceback(*chain: str) -> TracebackType | None:
    """The traceback of an error raised at the end of ``chain``, each frame in a file of
    the place named, each calling the next, caught above the first."""
    calls = []
    for where in chain:
        scope: dict[str, Any] = {}
        exec(compile(_CALL, str(_WHERE[where]), "exec"), scope)
        calls.append(scope["call"])
    try:
        calls[0](calls[1:])
    except ValueError as e:
        assert e.__traceback__ is not None
        return e.__traceback__.tb_next  # from the first of the chain: this frame caught it
    raise AssertionError("nothing raised")


@pytest.mark.parametrize(
    ("chain", "agents"),
    [
        # livekit's emitter calls the agent's handler, which raises
        (("livekit", "user"), True),
        # a node of livekit's, traced by opentelemetry's decorator, calls the agent's override
        (("livekit", "opentelemetry", "livekit", "user"), True),
        # a loop callback, a task's coroutine, of the agent's
        (("stdlib", "user"), True),
        (("runtime", "user"), True),
        # the agent's handler calls the provider, whose error it does not handle
        (("livekit", "user", "aiohttp", "user"), True),
        # a plugin's request reaches the test's fake through aiohttp
        (("livekit", "aiohttp", "user"), False),
        (("runtime", "livekit", "stdlib", "aiohttp", "user"), False),
        # no frame of the user's
        (("livekit", "aiohttp"), False),
    ],
    ids=lambda v: "-".join(v) if isinstance(v, tuple) else str(v),
)
def test_an_error_is_the_agents_when_the_library_that_caught_it_called_the_agents_code(
    chain: tuple[str, ...], agents: bool
) -> None:
    assert user_frames(_traceback(*chain)) is agents
    assert user_frames(_traceback(*chain), "livekit") is agents


async def test_an_earlier_tests_task_collected_during_the_job_is_not_the_agents() -> None:
    """A task of an earlier test's loop that failed in that test's code and was never
    retrieved is reported by asyncio ("never retrieved", through its logger) whenever the
    garbage collector takes it: here while this job runs. That is another loop's failure,
    not the agent's; the kit failed this test with it ("the agent's code raised
    RuntimeError: the TTS stream broke", found when CI ran the suite in another order)."""

    async def broke() -> None:
        raise RuntimeError("an earlier test's stream broke")

    earlier: list[asyncio.Task[None]] = []

    def earlier_test() -> None:  # its own loop, on a thread: this test's loop is running
        other = asyncio.new_event_loop()
        try:
            earlier.append(other.create_task(broke()))
            other.run_until_complete(asyncio.sleep(0))
        finally:
            other.close()

    thread = threading.Thread(target=earlier_test)
    thread.start()
    thread.join()
    assert earlier[0].done()

    server = AgentServer(session_end_timeout=315)

    @server.rtc_session()
    async def entrypoint(ctx: JobContext) -> None:
        job = AgentJob.from_job_context(ctx, session=AgentSession())
        await job.start(Agent(instructions="test"))

    runner, clock = _runner()
    await runner(server)
    await clock.advance(1)
    earlier.clear()  # the earlier test's task is collected now, in the middle of this job
    gc.collect()
    runner.room.remove_participant("user", rtc.DisconnectReason.CLIENT_INITIATED)
    await runner.wait_ended()
    await runner.aclose()
    assert runner.user_failures == []
