"""A livekit-agents agent that runs its lifecycles through the state-machine runtime.

What it wires, per job (see ``run_job``):

- ``JobRuntime.from_job_context(ctx)``: the ``job`` machine and the job-owned session host.
  ``on_session_end`` (given to ``rtc_session``) holds a simulated job for the simulator's
  ``finalize_simulation`` and defers room deletion until it is answered.
- the ``AgentSession`` started with ``session_host=False`` (the job hosts it) and
  ``RoomOptions(close_on_disconnect=False)`` (the ``participant`` machine decides);
- a ``ParticipantLink``: a user leaving for a closing reason closes the session at once,
  a dropped user gets ``grace_period`` seconds to come back;
- an ``AvatarLifecycle`` around an avatar plugin when ``AGENT_AVATAR`` names one: an avatar
  that never joins, or leaves, puts the agent's audio back on the room;
- ``on_simulation_end``: the agent's own check of a simulated run, logged and, when it
  fails, given to the simulator as a veto.

Run it against a LiveKit server with livekit-agents' own CLI::

    export LIVEKIT_URL=wss://... LIVEKIT_API_KEY=... LIVEKIT_API_SECRET=...
    python examples/agent.py dev        # or: python -m livekit.agents start examples/agent.py

Settings (environment, all optional):

- ``AGENT_STT``, ``AGENT_LLM``, ``AGENT_TTS``: model descriptors passed to ``AgentSession``
  as they are (LiveKit Inference strings such as ``deepgram/nova-3``, ``openai/gpt-4.1-mini``,
  ``cartesia/sonic-3``). Unset, the agent has no models: it joins, links the user and follows
  every lifecycle, but it does not listen or speak. Nothing here needs a model key to import.
- ``AGENT_AVATAR``: ``bey`` (needs ``livekit-plugins-bey`` and ``BEY_API_KEY``) or
  ``package.module:factory``, any callable returning a livekit-agents ``AvatarSession``
  (plugins read their own keys from the environment). Unset: no avatar.
- ``AGENT_TRACE``: a JSONL path for the production trace of every machine; ``{job_id}`` and
  ``{room}`` in it are filled in (use one, a file is written per job). Replay it offline with
  ``agent-runtime replay FILE``.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from livekit.agents import (
    NOT_GIVEN,
    Agent,
    AgentServer,
    AgentSession,
    CloseEvent,
    JobContext,
    cli,
)
from livekit.agents.simulation import SimulationContext
from livekit.agents.voice.avatar import AvatarSession
from livekit.agents.voice.remote_session import SessionTransport
from livekit.agents.voice.room_io import RoomOptions

from agent_runtime.avatar import AvatarLifecycle
from agent_runtime.clock import Clock
from agent_runtime.job import JobRuntime, on_session_end
from agent_runtime.participant import ParticipantLink
from agent_runtime.room_events import RoomEventAdapter
from agent_runtime.trace import JsonlSink, Tracer

logger = logging.getLogger("agent_runtime.example")

# the runtime's hold for the simulator ends first; upstream's bound on on_session_end must
# leave room for the close after it (close_timeout), or it would cut the close short
SESSION_END_TIMEOUT = 300.0
CLOSE_TIMEOUT = 10.0
AVATARS = {"bey": "livekit.plugins.bey:AvatarSession"}
INSTRUCTIONS = "You are a helpful voice assistant. Keep your answers short."


@dataclass(frozen=True, kw_only=True)
class Settings:
    stt: str | None = None
    llm: str | None = None
    tts: str | None = None
    avatar: str | None = None  # "module:factory" (a shorthand is resolved already)
    trace: str | None = None  # path template

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read the ``AGENT_*`` variables; a malformed one raises ``ValueError`` naming it."""
        env = os.environ if env is None else env

        def get(name: str) -> str | None:
            value = env.get(name, "").strip()
            return value or None

        avatar = get("AGENT_AVATAR")
        if avatar is not None:
            avatar = AVATARS.get(avatar, avatar)
            module, _, attr = avatar.partition(":")
            if not module or not attr:
                raise ValueError(
                    f"AGENT_AVATAR={avatar!r}: give one of {sorted(AVATARS)} or "
                    "package.module:factory"
                )
        trace = get("AGENT_TRACE")
        if trace is not None:
            try:
                trace.format(job_id="j", room="r")
            except (KeyError, IndexError, ValueError) as e:
                raise ValueError(
                    f"AGENT_TRACE={trace!r}: only {{job_id}} and {{room}} can be filled in ({e})"
                ) from None
        return cls(
            stt=get("AGENT_STT"),
            llm=get("AGENT_LLM"),
            tts=get("AGENT_TTS"),
            avatar=avatar,
            trace=trace,
        )


def load_avatar(spec: str) -> AvatarSession:  # type: ignore[type-arg]
    """``package.module:factory`` -> the ``AvatarSession`` the factory returns."""
    module_name, _, attr = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"AGENT_AVATAR={spec!r}: cannot load it ({e})") from None
    avatar = factory()
    if not isinstance(avatar, AvatarSession):
        raise TypeError(
            f"AGENT_AVATAR={spec!r} made a {type(avatar).__name__}, not an AvatarSession"
        )
    return avatar


@dataclass
class JobParts:
    """What ``run_job`` built for one job; kept until the job closes."""

    runtime: JobRuntime
    session: AgentSession[Any]
    link: ParticipantLink
    avatar: AvatarLifecycle | None
    events: RoomEventAdapter
    close_reason: str | None = None
    avatar_closing: asyncio.Future[None] | None = None


# the parts of each live job, for on_simulation_end; released when the job closes
JOBS: dict[JobContext, JobParts] = {}


async def run_job(
    ctx: JobContext,
    *,
    settings: Settings,
    clock: Clock | None = None,
    transport: SessionTransport | None = None,
) -> JobParts:
    """Build and start one job's runtime. ``clock`` and ``transport`` are for tests (virtual
    time; an in-memory simulator end); a real job leaves both ``None``."""
    # everything that can refuse the settings comes first, so a refusal changes nothing
    plugin = load_avatar(settings.avatar) if settings.avatar is not None else None
    sink: JsonlSink | None = None
    if settings.trace is not None:
        path = settings.trace.format(job_id=ctx.job.id, room=ctx.room.name)
        try:
            sink = JsonlSink(path)
        except OSError as e:
            raise RuntimeError(f"AGENT_TRACE: cannot write the trace to {path!r}: {e}") from e
    tracer = Tracer(sink) if sink is not None else None
    await ctx.connect()
    events = RoomEventAdapter(ctx.room)
    events.start()
    runtime = JobRuntime.from_job_context(
        ctx,
        clock=clock,
        tracer=tracer,
        transport=transport,
        room_events=events,
        session_end_timeout=SESSION_END_TIMEOUT,
        close_timeout=CLOSE_TIMEOUT,
    )
    if sink is not None:
        # after the job's own last transition is written
        runtime.on("closed", lambda _t: sink.close())
    session: AgentSession[Any] = AgentSession(
        stt=settings.stt or NOT_GIVEN,
        llm=settings.llm or NOT_GIVEN,
        tts=settings.tts or NOT_GIVEN,
    )
    runtime.attach(session)  # before start: its events reach a remote client from the first
    await runtime.start()
    avatar: AvatarLifecycle | None = None
    if plugin is not None:
        avatar = AvatarLifecycle(plugin, clock=clock, tracer=tracer, room_events=events)
        # the usual ordering: the avatar's route is in before the session starts
        await avatar.start(session, ctx.room)
    await session.start(
        Agent(instructions=INSTRUCTIONS),
        room=ctx.room,
        room_options=RoomOptions(close_on_disconnect=False),  # the participant machine decides
        session_host=False,  # the job hosts the session
    )
    link = ParticipantLink(session, room_events=events, clock=clock, tracer=tracer)
    link.start()
    parts = JobParts(runtime, session, link, avatar, events)

    def on_close(ev: CloseEvent) -> None:
        parts.close_reason = getattr(ev.reason, "value", str(ev.reason))
        if avatar is not None and parts.avatar_closing is None:
            # the avatar goes with the session, while the room is still connected
            parts.avatar_closing = asyncio.ensure_future(avatar.aclose())

    session.on("close", on_close)
    JOBS[ctx] = parts

    async def release() -> None:
        # the end of the job's closing: stop following, unhook
        await link.aclose()
        if avatar is not None:
            await (parts.avatar_closing or avatar.aclose())
        session.off("close", on_close)
        events.aclose()
        JOBS.pop(ctx, None)

    runtime.add_shutdown_callback(release)
    logger.info(
        "job %s: runtime started (avatar: %s, trace: %s)",
        ctx.job.id,
        settings.avatar or "none",
        "on" if sink is not None else "off",
    )
    return parts


server = AgentServer(session_end_timeout=SESSION_END_TIMEOUT + CLOSE_TIMEOUT + 5.0)


async def record_verdict(sim: SimulationContext) -> None:
    """The agent's own check of a simulated run: the session must not have ended in an
    error and the agent must have stayed audible. A failed check vetoes the run (the
    simulator's verdict stands otherwise); either way the verdict is logged."""
    parts = JOBS.get(sim.job_context)
    problems: list[str] = []
    if parts is None:
        problems.append("the job's runtime is gone")
    else:
        if parts.close_reason == "error":
            problems.append("the session ended in an error")
        if parts.avatar is not None and parts.avatar.audio_route() == "none":
            problems.append("the agent's audio went nowhere")
    if problems:
        sim.fail("; ".join(problems))
    logger.info(
        "simulation %s: agent verdict %s",
        sim.simulation_run_id,
        "fail: " + "; ".join(problems) if problems else "pass",
    )


@server.rtc_session(on_session_end=on_session_end, on_simulation_end=record_verdict)
async def entrypoint(
    ctx: JobContext, *, clock: Clock | None = None, transport: SessionTransport | None = None
) -> None:
    """The job's entrypoint: settings from the environment. The worker calls it with the
    job alone; ``clock`` and ``transport`` are for tests (see ``run_job``)."""
    await run_job(ctx, settings=Settings.from_env(), clock=clock, transport=transport)


if __name__ == "__main__":
    cli.run_app(server)
