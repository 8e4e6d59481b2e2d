"""A livekit-agents agent whose lifecycles run as explicit state machines.

``AgentJob`` assembles the job: the job-owned session host and the simulation hold, the
linked participant (a user who leaves is noticed at once, one who drops gets a grace
period), the avatar when one is configured (an avatar that never joins or leaves puts the
agent's audio back on the room), and the production trace.

Run it with livekit-agents' own CLI::

    python examples/agent.py console --text     # no server: the console, text mode
    export LIVEKIT_URL=wss://... LIVEKIT_API_KEY=... LIVEKIT_API_SECRET=...
    python examples/agent.py dev                 # or: python -m livekit.agents start ...

Settings (environment, all optional):

- ``AGENT_STT``, ``AGENT_LLM``, ``AGENT_TTS``: model descriptors passed to ``AgentSession``
  as they are (e.g. ``deepgram/nova-3``, ``openai/gpt-4.1-mini``, ``cartesia/sonic-3``).
  Unset, the agent joins, links the user and follows every lifecycle, but does not listen
  or speak.
- ``AGENT_AVATAR``: ``bey`` (needs ``livekit-plugins-bey`` and ``BEY_API_KEY``) or
  ``package.module:factory``, any callable returning an ``AvatarSession``. Unset: no avatar.
- ``AGENT_TRACE``: a JSONL path for the trace of every machine; ``{job_id}`` and ``{room}``
  are filled in. Replay it with ``agent-runtime replay FILE``.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Mapping

from livekit.agents import NOT_GIVEN, Agent, AgentServer, AgentSession, JobContext, cli
from livekit.agents.simulation import SimulationContext
from livekit.agents.voice.avatar import AvatarSession

from agent_runtime import AgentJob, on_session_end

logger = logging.getLogger("agent_runtime.example")

SESSION_END_TIMEOUT = 300.0  # the job's hold for the simulator
CLOSE_TIMEOUT = 10.0
AVATARS = {"bey": "livekit.plugins.bey:AvatarSession"}
INSTRUCTIONS = "You are a helpful voice assistant. Keep your answers short."

# upstream bounds on_session_end by this: leave room for the job's hold and its close
server = AgentServer(session_end_timeout=SESSION_END_TIMEOUT + CLOSE_TIMEOUT + 5.0)


async def record_verdict(sim: SimulationContext) -> None:
    """The agent's own check of a simulated run: the session must not have ended in an
    error and the agent must have stayed audible. A failed check vetoes the run."""
    job = AgentJob.for_job(sim.job_context)
    problems: list[str] = []
    if job is None:
        problems.append("the job's runtime is gone")
    else:
        if job.close_reason == "error":
            problems.append("the session ended in an error")
        if job.avatar is not None and job.live_audio_route == "none":
            problems.append("the agent's audio went nowhere")
    if problems:
        sim.fail("; ".join(problems))
    verdict = "fail: " + "; ".join(problems) if problems else "pass"
    logger.info("simulation %s: agent verdict %s", sim.simulation_run_id, verdict)


@server.rtc_session(on_session_end=on_session_end, on_simulation_end=record_verdict)
async def entrypoint(ctx: JobContext) -> None:
    env = settings_from(os.environ)  # a malformed variable fails the job here, naming it
    session: AgentSession = AgentSession(
        stt=env["AGENT_STT"] or NOT_GIVEN,
        llm=env["AGENT_LLM"] or NOT_GIVEN,
        tts=env["AGENT_TTS"] or NOT_GIVEN,
    )
    job = AgentJob.from_job_context(
        ctx,
        session=session,
        avatar=load_avatar(env["AGENT_AVATAR"]) if env["AGENT_AVATAR"] else None,
        trace_path=env["AGENT_TRACE"],
        session_end_timeout=SESSION_END_TIMEOUT,
        close_timeout=CLOSE_TIMEOUT,
    )
    await job.start(Agent(instructions=INSTRUCTIONS))


def settings_from(env: Mapping[str, str]) -> dict[str, str | None]:
    """The ``AGENT_*`` variables (blank is unset); a malformed one raises ``ValueError``."""
    names = ("AGENT_STT", "AGENT_LLM", "AGENT_TTS", "AGENT_AVATAR", "AGENT_TRACE")
    out = {n: env.get(n, "").strip() or None for n in names}
    avatar = out["AGENT_AVATAR"]
    if avatar is not None:
        out["AGENT_AVATAR"] = avatar = AVATARS.get(avatar, avatar)
        module, _, attr = avatar.partition(":")
        if not module or not attr:
            raise ValueError(
                f"AGENT_AVATAR={avatar!r}: give one of {sorted(AVATARS)} or package.module:factory"
            )
    return out


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


if __name__ == "__main__":
    cli.run_app(server)
