"""What each action of a path (or input of the real explorer) does to the harness's real
job: the room's facts, the simulator's requests, the user's calls, the agent's speech and
the user's, and the word each stand-in waits for."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from livekit import rtc
from livekit.agents import Agent, AgentSession, CloseReason
from livekit.agents.voice.avatar import DataStreamAudioOutput
from livekit.protocol.agent_pb import agent_session as agent_pb

from agent_runtime.sdk import livekit_compat as lk
from agent_runtime.testing.clock import settle
from agent_runtime.testing.invariants.checks import LIVE_JOB
from agent_runtime.testing.invariants.observe import Sent
from agent_runtime.testing.wire import build_request
from verification.explore.config import PEOPLE

if TYPE_CHECKING:
    from agent_runtime.testing.held import Gate
    from verification.explore.harness import Harness

SPEECH = 1.0  # seconds of audio in each of the agent's replies
SHUTDOWN_REASON = "the explorer ends it"


# -- what each action does to the real job -----------------------------------------------------


def _joins(h: Harness, who: str) -> None:
    p = PEOPLE[who]
    h.room.add_participant(p.identity, kind=p.kind, attributes=dict(p.attributes))


async def _finalize(h: Harness, caller: str) -> None:
    rid = f"RQ_{len(h.observed.sent) + 1}"
    req = build_request("finalize_simulation", {"provisional_success": True}, request_id=rid)
    try:
        await h.simulator.send_message(agent_pb.AgentSessionMessage(request=req), sender=caller)
    except RuntimeError:
        return  # the agent's end is closed: nobody reads it (the view follows nothing)
    simulator = caller == PEOPLE["simulator"].identity
    h.observed.sent.append(Sent(rid, simulator, simulator and h.job.job.state in LIVE_JOB))


async def _other_request(h: Harness, kind: str, payload: dict[str, Any] | None) -> None:
    # a request the view follows no reply of: the job's view does not change
    h.other += 1
    req = build_request(kind, payload, request_id=f"OTHER_{h.other}")
    with contextlib.suppress(RuntimeError):  # the agent's end is closed: nobody reads it
        msg = agent_pb.AgentSessionMessage(request=req)
        await h.simulator.send_message(msg, sender=PEOPLE["simulator"].identity)


async def _attach_b(h: Harness, _: str) -> None:
    session: AgentSession[Any] = AgentSession()
    h.sessions["B"] = session
    h._gate_close("B")
    h.job.attach(session)
    # a second session has no room of its own: RoomIO belongs to the primary one
    await session.start(Agent(instructions="Another agent."), session_host=False)


def _close(h: Harness, name: str) -> None:
    lk.ask_session_close(h.sessions[name], CloseReason.USER_INITIATED)


def _ctx_shutdown(h: Harness, _: str) -> None:
    # livekit's ctx.shutdown(): the primary session closes, then on_session_end tells the
    # job machine (the hold)
    primary = h.sessions["A"]
    if lk.session_live(primary):
        lk.ask_session_close(primary, CloseReason.JOB_SHUTDOWN)
    h.job.job.shutdown(SHUTDOWN_REASON)


async def _interrupt(h: Harness, playing: bool) -> None:
    avatar = h.job.avatar
    assert avatar is not None
    sink = avatar.installed_sink
    # (only a session's speech pushes audio to the avatar: none before the session began)
    playing = playing and h.session_began()
    if playing and avatar.state == "joined" and isinstance(sink, DataStreamAudioOutput):
        # something is playing to the avatar: one segment in its sink, pushed as the SDK
        # pushes it, from a task of its own (a sink still clearing holds it back there,
        # not the world's hand)
        frame = rtc.AudioFrame(b"\0\0" * 240, 24000, 1, 240)

        async def push() -> None:
            await sink.capture_frame(frame)
            sink.flush()

        h.bg(push(), "interrupt:segment")
        await settle()
    avatar.interrupt()


async def _clear_settles(h: Harness, _: str) -> None:
    # the avatar says where it stopped: the plugin's own clear has its answer
    payload = json.dumps({"playback_position": 0.0, "interrupted": True})
    # an RpcError: nobody takes it any more, the clear is over already
    with contextlib.suppress(rtc.RpcError):
        await h.room.invoke_rpc("lk.playback_finished", PEOPLE["avatar"].identity, payload)


async def _frames(seconds: float) -> Any:
    per = 240  # 10 ms at 24 kHz
    for _ in range(max(1, round(seconds * 100))):
        yield rtc.AudioFrame(b"\0\0" * per, 24000, 1, per)


def _say(h: Harness, _: str) -> None:
    # the agent's reply, through the SDK's own say() (its audio produced at once: the
    # hand-off to the sink, if any, comes in the same step)
    h.sessions["A"].say("A reply.", audio=_frames(SPEECH))


def _barge_in(h: Harness, _: str) -> None:
    # the user speaks over the agent: the session interrupts its speech, its own way
    done = h.sessions["A"].interrupt()
    done.add_done_callback(lambda f: f.cancelled() or f.exception())


async def _report(h: Harness, _: str) -> None:
    # the avatar played what it was given, and says so
    payload = json.dumps({"playback_position": SPEECH, "interrupted": False})
    with contextlib.suppress(rtc.RpcError):  # nobody takes it: the sink went
        await h.room.invoke_rpc("lk.playback_finished", PEOPLE["avatar"].identity, payload)


def _tell_plugin(word: str) -> Callable[[Harness, str], None]:
    return lambda h, _: h.plugin.tell(word)


def _open(pick: Callable[[Harness], Gate], word: str) -> Callable[[Harness, str], None]:
    def act(h: Harness, _: str) -> None:
        pick(h).open(word)

    return act


def _nothing(h: Harness, _: str) -> None:
    return None  # a hang: whatever waits goes on waiting


def _person(action: str) -> Callable[[Harness, str], Any]:
    who, _, event = action.rpartition("_")

    def act(h: Harness, arg: str) -> None:
        if event == "joins":
            _joins(h, who)
        else:
            h.room.remove_participant(PEOPLE[who].identity, rtc.DisconnectReason.Value(arg))

    return act


ACTIONS: dict[str, Callable[[Harness, str], Any]] = {
    **{
        f"{who}_{e}": _person(f"{who}_{e}")
        for who in ("user", "sip", "simulator")
        for e in ("joins", "leaves")
    },
    "room_disconnects": lambda h, _: h.room.disconnect_locally(),
    "finalize": lambda h, _: _finalize(h, PEOPLE["simulator"].identity),
    "stranger_finalize": lambda h, _: _finalize(h, PEOPLE["stranger"].identity),
    "ping": lambda h, _: _other_request(h, "ping", None),
    "malformed": lambda h, _: _other_request(
        h, "finalize_simulation", {"provisional_success": "yes"}
    ),
    "attach_b": _attach_b,
    "close_a": lambda h, _: _close(h, "A"),
    "close_b": lambda h, _: _close(h, "B"),
    "ctx_shutdown": _ctx_shutdown,
    # the agent's own job.shutdown() (an end-call tool's): the job hangs up by itself
    "job_shutdown": lambda h, _: h.job.shutdown(SHUTDOWN_REASON),
    "request_deletion": lambda h, _: h.job.request_room_deletion(),
    "release": lambda h, _: h.bg(h.job.aclose(), "job.aclose"),
    # the user's own calls, each returning once the job is closed
    "aclose": lambda h, _: h.bg(h.job.aclose(), "job.aclose"),
    "abort": lambda h, _: h.bg(h.job.aclose(graceful=False), "job.abort"),
    "avatar_start": lambda h, _: h.bg(h.job.start_avatar(), "avatar.start"),
    "session_start": lambda h, _: h.bg(h.start_session(), "session.start"),
    "avatar_joins": lambda h, _: _joins(h, "avatar"),
    "avatar_video": lambda h, _: h.room.publish_track(PEOPLE["avatar"].identity, "video"),
    "avatar_leaves": lambda h, _: h.room.remove_participant(
        PEOPLE["avatar"].identity, rtc.DisconnectReason.CLIENT_INITIATED
    ),
    "interrupt": lambda h, _: _interrupt(h, playing=True),
    "interrupt_idle": lambda h, _: _interrupt(h, playing=False),
    # the agent's speech and the user's, as the session's pipeline and VAD report them
    "agent_says": _say,
    "user_interrupts": _barge_in,
    "avatar_reports": _report,
    "user_speaks": lambda h, _: lk.set_user_state(h.sessions["A"], "speaking"),
    "user_listens": lambda h, _: lk.set_user_state(h.sessions["A"], "listening"),
    "avatar_close": lambda h, _: (
        h.bg(h.job.avatar.aclose(), "avatar.aclose") if h.job.avatar is not None else None
    ),
    # outcomes of work running aside
    "verdict_ready": _open(lambda h: h.verdicts[-1], "return"),
    "verdict_hangs": _nothing,
    "plugin_routed": _tell_plugin("routed"),
    "plugin_fails": _tell_plugin("error"),
    "plugin_no_route": _tell_plugin("no_route"),
    "plugin_hangs": _nothing,
    "plugin_returns": _tell_plugin("ok"),
    "plugin_fails_late": _tell_plugin("error"),
    "plugin_hangs_routed": _nothing,
    "clear_settles": _clear_settles,
    "a_closed": _open(lambda h: h.closes["A"], "finish"),
    "a_hangs": _open(lambda h: h.closes["A"], "hang"),
    # its teardown raises (a plugin's may): the session stops and never says `close`
    "a_fails": _open(lambda h: h.closes["A"], "fail"),
    "b_closed": _open(lambda h: h.closes["B"], "finish"),
    "deletion_returns": _open(lambda h: h.deletion_gates[-1], "ok"),
    "deletion_fails": _open(lambda h: h.deletion_gates[-1], "fail"),
    "callbacks_return": _open(lambda h: h.callback, "return"),
    "callback_hangs": _open(lambda h: h.callback, "hang"),
}
