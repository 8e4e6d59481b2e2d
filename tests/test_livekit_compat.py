"""Every livekit-agents private name the runtime reads, against the pinned SDK.

``agent_runtime.livekit_compat`` is the one module that touches them; each accessor is
checked here on real SDK objects (a real ``AgentSession`` started without a room, a real
``DataStreamAudioOutput`` over an unconnected ``rtc.Room``), so an SDK upgrade that renames
one fails here, by name, rather than somewhere in a job.
"""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

from livekit import rtc
from livekit.agents import Agent, AgentSession, CloseReason
from livekit.agents.voice.avatar import DataStreamAudioOutput

from agent_runtime import livekit_compat as lk

ROOT = Path(__file__).resolve().parents[1]


async def test_the_session_facts_follow_a_real_session_through_its_life() -> None:
    session: AgentSession[None] = AgentSession()
    assert not lk.session_started(session) and not lk.session_live(session)
    assert lk.session_closing_task(session) is None
    assert lk.session_span_context(session) is None
    assert not lk.session_runs_own_host(session)
    await session.start(Agent(instructions="compat"))
    assert lk.session_started(session) and lk.session_live(session)
    assert lk.session_span_context(session) is not None  # its agent_session span
    closed: list[CloseReason] = []
    session.on("close", lambda ev: closed.append(ev.reason))
    lk.ask_session_close(session, CloseReason.JOB_SHUTDOWN)
    task = lk.session_closing_task(session)
    assert isinstance(task, asyncio.Task) and not lk.session_live(session)
    await task
    assert closed == [CloseReason.JOB_SHUTDOWN]


async def test_the_data_stream_sink_internals_exist_on_the_pinned_sdk() -> None:
    room = rtc.Room()
    sink = DataStreamAudioOutput(room, destination_identity="avatar")
    assert lk.pending_playbacks(sink) == 0
    assert callable(lk.sink_connection_listener(sink))
    assert lk.sink_waits(sink) == [] or all(
        isinstance(t, asyncio.Task) for t in lk.sink_waits(sink)
    )
    calls: list[object] = []
    lk.keep_sink_off_the_playback_rpc(sink, lambda *a, **k: calls.append(a))
    assert lk.SINK_REGISTRATION in vars(sink)
    # the local participant exists once connected: the handlers' table on its class
    assert lk.rpc_handlers(object()) is None
    assert "_rpc_handlers" in rtc.LocalParticipant.__init__.__code__.co_names


def test_no_other_runtime_module_reads_a_livekit_private_session_name() -> None:
    """``session._started``, ``_closing_task``, ``_close_soon`` and the others are read in
    ``livekit_compat`` only (the avatar package's sink internals are listed there too)."""
    private = {
        "_started",
        "_closing_task",
        "_close_soon",
        "_root_span_context",
        "_session_host",
        "_simulation_end_fnc",
    }
    offenders = []
    for path in sorted((ROOT / "agent_runtime").glob("*.py")):
        if path.name == "livekit_compat.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            name = None
            if isinstance(node, ast.Attribute) and node.attr in private:
                owner = node.value
                if isinstance(owner, ast.Name) and owner.id == "self":
                    continue  # the runtime's own attribute of that name
                name = node.attr
            elif (
                isinstance(node, ast.Constant) and isinstance(node.value, str)
            ) and node.value in private:
                name = node.value
            if name is not None:
                offenders.append(f"{path.name}:{node.lineno} {name}")
    assert offenders == []
