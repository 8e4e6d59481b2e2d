"""Every livekit-agents private name the runtime reads, against the pinned SDK.

``agent_runtime.sdk.livekit_compat`` is the one module that touches them; each accessor is
checked here on real SDK objects (a real ``AgentSession`` started without a room, a real
``DataStreamAudioOutput`` over an unconnected ``rtc.Room``), so an SDK upgrade that renames
one fails here, by name, rather than somewhere in a job.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import importlib
import inspect
import re
from pathlib import Path
from types import SimpleNamespace

import livekit.agents
import livekit.api
import livekit.protocol.agent_simulation
import livekit.rtc
import pytest
from google.protobuf import json_format
from livekit import rtc
from livekit.agents import Agent, AgentServer, AgentSession, CloseReason, JobContext
from livekit.agents.simulation import (
    SimulationContext,
    SimulationDispatch,
    SimulationRun,
    SimulationVerdict,
)
from livekit.agents.testing import fake_job_context
from livekit.agents.types import ATTRIBUTE_SIMULATOR_DISPATCH
from livekit.agents.voice import room_io as room_io_module
from livekit.agents.voice.avatar import AvatarSession, DataStreamAudioOutput
from livekit.agents.voice.io import AudioOutput
from livekit.agents.voice.room_io import AudioOutputOptions

from agent_runtime.runtimes.avatar import audio_tail
from agent_runtime.sdk import livekit_compat as lk
from agent_runtime.sdk.session_close import hold_session_close, session_close_failed
from agent_runtime.testing.clock import settle
from agent_runtime.testing.inmemory import InMemoryRoom
from tests.support.avatar_rig import OtherSink
from tests.support.playout_rig import AskedLLM

ROOT = Path(__file__).resolve().parents[1]


async def test_a_session_is_text_only_in_a_text_simulation_only() -> None:
    session: AgentSession[None] = AgentSession()
    assert not lk.session_text_only(session) and not lk.session_text_only(None)
    with fake_job_context():
        assert not lk.session_text_only(session)
    with fake_job_context() as ctx:
        dispatch = livekit.protocol.agent_simulation.SimulationDispatch(simulation_run_id="r")
        ctx.job.attributes[ATTRIBUTE_SIMULATOR_DISPATCH] = json_format.MessageToJson(dispatch)
        assert lk.session_text_only(session)  # the default mode: text


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


async def test_the_avatar_runtime_s_sink_and_plugin_internals_exist_on_the_pinned_sdk() -> None:
    room = rtc.Room()
    sink = DataStreamAudioOutput(room, destination_identity="listener")
    assert lk.sink_destination(sink) == "listener"  # avatartalk streams to another identity
    assert hasattr(sink, "_clear_buffer_atask") and lk.sink_clear_task(sink) is None
    lk.keep_sink_off_the_playback_rpc(sink, lambda *a, **k: None)
    lk.let_sink_register_the_playback_rpc(sink)
    assert lk.SINK_REGISTRATION not in vars(sink)  # the class's own registration again
    handler = lk.sink_connection_listener(sink)
    assert handler in room._events["connection_state_changed"]  # the listener it added

    avatar = _Plugin()
    assert hasattr(avatar, "_wait_avatar_join_task") and lk.avatar_join_task(avatar) is None

    def ours(data: rtc.RpcInvocationData) -> str:
        return "ok"

    assert lk.rpc_handler(SimpleNamespace(_rpc_handlers={"lk.x": ours}), "lk.x") is ours
    assert lk.rpc_handler(SimpleNamespace(_rpc_handlers={}), "lk.x") is None


async def test_the_room_audio_output_is_roomio_s_own() -> None:
    out = lk.new_room_audio_output(rtc.Room())
    assert isinstance(out, AudioOutput) and isinstance(out, room_io_module._ParticipantAudioOutput)
    assert out.sample_rate == AudioOutputOptions().sample_rate


@pytest.mark.parametrize("route_first", [False, True])
async def test_roomio_s_own_room_output_is_read_from_the_pinned_sdk(route_first: bool) -> None:
    # a real RoomIO over an embedded room: its own output, or none when session.start()
    # found an audio route in place
    room = InMemoryRoom()
    room.connect_locally()
    session: AgentSession[None] = AgentSession()
    if route_first:
        session.output.audio = OtherSink()
    await session.start(Agent(instructions="compat"), room=room)
    own = lk.room_io_audio_output(session.room_io)
    if route_first:
        assert own is None
    else:
        assert isinstance(own, lk.RoomAudioOutput) and audio_tail(session) is own
    await session.aclose()
    await settle()


async def test_after_room_io_pick_runs_after_roomio_has_taken_its_pick() -> None:
    # a real RoomIO over an embedded room (no server): its start-up task waits for a pick
    room = InMemoryRoom()
    room.connect_locally()
    session: AgentSession[None] = AgentSession()
    await session.start(Agent(instructions="compat"), room=room)
    await settle()
    rio = session.room_io
    room.add_participant("alice")  # RoomIO picks her in the room callback
    seen: list[str | None] = []
    later = lk.after_room_io_pick(rio, lambda: seen.append(rio._participant_identity))
    assert later is not None and seen == []  # picked, not yet taken: after the task's step
    await later
    assert seen == ["alice"]  # its start-up task had linked her when `then` ran
    now = lk.after_room_io_pick(rio, lambda: seen.append("now"))
    assert now is None and seen[-1] == "now"  # nothing pending: at once
    await session.aclose()


class _RefusingLLM(AskedLLM):
    def prewarm(self, *, loop: asyncio.AbstractEventLoop | None = None) -> None:
        raise ConnectionError("the model provider refused the session")


async def test_a_start_that_failed_after_roomio_started_is_released() -> None:
    # a real RoomIO over an embedded room; the agent's activity fails as it starts
    room = InMemoryRoom()
    room.connect_locally()
    session: AgentSession[None] = AgentSession()
    assert not lk.session_half_started(session)  # nothing begun
    agent = Agent(instructions="compat", llm=_RefusingLLM())
    with contextlib.suppress(ConnectionError):
        await session.start(agent, room=room)
    assert not lk.session_started(session)
    assert lk.session_half_started(session) and room.listener_count() > 0
    await session.aclose()  # livekit's own close: nothing, the session never started
    assert lk.session_half_started(session) and room.listener_count() > 0
    await lk.release_half_started(session)
    assert not lk.session_half_started(session) and room.listener_count() == 0
    assert session.output.audio is None and session.input.audio is None
    assert agent._activity is None  # its activity's teardown ran: the agent can start again
    await lk.release_half_started(session)  # once is all: nothing left


def test_begin_finalize_gives_the_simulation_its_verdict_and_run() -> None:
    sim = SimulationContext(SimulationDispatch(), job_ctx=None)  # type: ignore[arg-type]
    lk.begin_finalize(sim, SimulationVerdict(success=True, reason="ok"), SimulationRun(id="r1"))
    assert sim.simulator_verdict == SimulationVerdict(success=True, reason="ok")
    assert sim.simulation_run is not None and sim.simulation_run.id == "r1"


async def test_the_user_state_and_a_held_close_on_a_real_session() -> None:
    session: AgentSession[None] = AgentSession()
    await session.start(Agent(instructions="compat"))
    seen: list[str] = []
    session.on("user_state_changed", lambda ev: seen.append(ev.new_state))
    lk.set_user_state(session, "speaking")
    assert session.user_state == "speaking" and seen == ["speaking"]

    release = asyncio.Event()
    hold_session_close(session, release.wait)
    lk.ask_session_close(session, CloseReason.USER_INITIATED)
    task = lk.session_closing_task(session)
    assert task is not None
    await asyncio.sleep(0.01)
    assert not task.done()  # held
    release.set()
    await asyncio.wait_for(task, 5)
    assert not lk.session_live(session) and not session_close_failed(session)


async def test_a_held_close_that_fails_stops_the_session_without_saying_close() -> None:
    session: AgentSession[None] = AgentSession()
    await session.start(Agent(instructions="compat"))
    closes: list[object] = []
    session.on("close", closes.append)

    async def fails() -> None:
        raise RuntimeError("a plugin's teardown failed")

    hold_session_close(session, fails)
    lk.ask_session_close(session, CloseReason.USER_INITIATED)
    task = lk.session_closing_task(session)
    assert task is not None
    with pytest.raises(RuntimeError, match="teardown failed"):
        await asyncio.wait_for(task, 5)
    # livekit's own failed close: stopped, no `close` said, the teardown its own again
    assert not lk.session_started(session) and closes == [] and session_close_failed(session)
    assert "_teardown_activity" not in vars(session)


async def test_a_job_context_s_parts_and_a_server_s_hooks() -> None:
    async def entry(ctx: JobContext) -> None:
        return None

    async def verdict(sim: SimulationContext) -> None:
        return None

    server = AgentServer()
    assert lk.server_hooks(server) == (None, None, None)
    server.rtc_session(on_simulation_end=verdict)(entry)
    hooks = lk.server_hooks(server)
    assert hooks is not None and hooks.entrypoint is entry and hooks.simulation_end is verdict
    assert lk.server_hooks(entry) is None  # a bare entrypoint is not a server

    with fake_job_context(room=rtc.Room()) as ctx:
        assert lk.job_simulation_end_fn(ctx) is None
        lk.set_job_simulation_end_fn(ctx, verdict)
        assert lk.job_simulation_end_fn(ctx) is verdict
        tempdir = Path(ctx._tempdir.name)  # the name the accessor must keep working
        assert tempdir.is_dir()
        lk.release_job_context(ctx)
        assert not tempdir.exists()


async def test_the_room_s_state_as_an_embedded_room_sets_it() -> None:
    room = rtc.Room()
    lk.set_room_info(room, lk.room_pb2.RoomInfo(name="r1"))
    assert room.name == "r1"
    lk.set_connection_state(room, rtc.ConnectionState.CONN_CONNECTED)
    assert room.connection_state == rtc.ConnectionState.CONN_CONNECTED

    info = lk.participant_pb2.ParticipantInfo(identity="user", sid="PA_1")
    p = rtc.RemoteParticipant(lk.participant_pb2.OwnedParticipant(info=info))
    lk.room_participants(room)["user"] = p
    assert room.remote_participants["user"] is p
    lk.participant_info(p).attributes["k"] = "v"
    assert p.attributes == {"k": "v"}

    kind = lk.track_pb2.TrackKind.KIND_AUDIO
    pub_info = lk.track_pb2.TrackPublicationInfo(sid="TR_1", kind=kind)
    pub = rtc.RemoteTrackPublication(lk.track_pb2.OwnedTrackPublication(info=pub_info))
    lk.participant_publications(p)["TR_1"] = pub
    assert p.track_publications["TR_1"] is pub
    lk.publication_info(pub).muted = True
    assert pub.muted

    def heard(*_: object) -> None:
        return None

    room.on("participant_connected", heard)
    assert heard in lk.listeners(room)["participant_connected"]


class _Plugin(AvatarSession):  # type: ignore[type-arg]
    """The smallest plugin: the SDK's base class, nothing started."""

    @property
    def avatar_identity(self) -> str:
        return "avatar"

    @property
    def provider(self) -> str:
        return "test"


# -- livekit_compat is the only module outside sdk/ reading the SDK's private names ---------
# The SDK's private names: everything its sources define with a leading underscore.
_SDK_SOURCES = [Path(m.__file__).parent for m in (livekit.rtc, livekit.agents, livekit.api)]
_DEFINED = re.compile(r"(?:\bdef |\bclass |\bself\.|\bcls\.|^)(_[A-Za-z]\w*)", re.MULTILINE)
# SDK private names the project also gives attributes of its own: read on anything but
# ``self`` they are the SDK's
SHARED = {
    "_started",
    "_closing_task",
    "_close_soon",
    "_root_span_context",
    "_session_host",
    "_simulation_end_fnc",
    "_entrypoint_fnc",
    "_session_end_fnc",
    "_tempdir",
    "_update_user_state",
    "_aclose_impl",
    "_events",  # the listener table of livekit's emitters; Emitter keeps its own
}
_ATTRIBUTE_CALLS = {"getattr", "hasattr", "setattr", "delattr"}
# a livekit class's private name a project subclass takes over as its own, and why
OWN_IN_SUBCLASS = {
    # Emitter replaces rtc.EventEmitter's listener table with its own (tuples, not dicts)
    # and overrides every method that reads it (on, off, emit; once goes through them)
    "agent_runtime.emitter.Emitter": {"_events"},
}


def _defined(paths: list[Path]) -> set[str]:
    return {
        name
        for path in paths
        for name in _DEFINED.findall(path.read_text(encoding="utf-8"))
        if not name.startswith("__")
    }


def _modules() -> list[Path]:
    """Every module of the package but sdk/'s (the testing kit's and the tools' included),
    the project's own verification and benchmarks, and the examples."""
    base = ROOT / "agent_runtime"
    return sorted(
        [p for p in base.rglob("*.py") if p.relative_to(base).parts[0] != "sdk"]
        + [p for d in ("verification", "benchmarks", "examples") for p in (ROOT / d).rglob("*.py")]
    )


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _livekit_privates(cls: type, package: str = "livekit") -> set[str]:
    """The private names the classes of ``package`` (livekit, or asyncio) among ``cls``'s
    bases define (but those a project class among them took over: ``OWN_IN_SUBCLASS``)."""
    names: set[str] = set()
    taken: set[str] = set()
    for base in cls.__mro__:
        if base is not cls and base.__module__.split(".")[0] == package:
            with contextlib.suppress(OSError, TypeError):
                names |= {n for n in _DEFINED.findall(inspect.getsource(base)) if n[:2] != "__"}
        taken |= OWN_IN_SUBCLASS.get(f"{base.__module__}.{base.__qualname__}", set())
    return names - taken


def _classes(
    module: str, tree: ast.Module, package: str = "livekit"
) -> list[tuple[ast.ClassDef, set[str]]]:
    """Each top-level class of ``module`` with the private names its bases of ``package``
    define (none for a class of the project's own)."""
    out = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            if module.startswith("agent_runtime"):
                cls = getattr(importlib.import_module(module), node.name)
                out.append((node, _livekit_privates(cls, package)))
            else:
                out.append((node, set()))
    return out


def _own(paths: list[Path]) -> set[str]:
    """The private names the project's modules and classes define (not those a class
    inherits from a livekit base: an embedded room setting ``self._connection_state``
    does not make it the project's)."""
    own: set[str] = set()
    for path in paths:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        own |= {
            n.name
            for n in tree.body
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        }
        for node, inherited in _classes(_module_name(path), tree):
            mine: set[str] = set()
            for n in ast.walk(node):
                if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef):
                    mine.add(n.name)
                elif (
                    isinstance(n, ast.Attribute)
                    and isinstance(n.ctx, ast.Store)
                    and isinstance(n.value, ast.Name)
                    and n.value.id in ("self", "cls")
                ):
                    mine.add(n.attr)
            own |= mine - inherited
    return {n for n in own if n.startswith("_") and not n.startswith("__")}


def private_reads(
    source: str,
    *,
    sdk: set[str],
    own: set[str],
    subclasses: list[tuple[ast.ClassDef, set[str]]] = (),  # type: ignore[assignment]
    module: str = "",
    shared: frozenset[str] | set[str] = SHARED,
    package: str = "livekit",
) -> list[tuple[int, str]]:
    """(line, name) wherever ``source`` reads or writes a private name of the SDK: an
    attribute of anything but ``self``/``cls`` that the SDK defines and the project does
    not (or one of ``shared``), such a name given to ``getattr`` and its kind, a private
    name or module imported from ``package``, and in a subclass of a class of ``package``
    any ``self._name`` its bases there define (``subclasses``: the class nodes of
    ``source`` with those names). ``sdk``: the private names ``package`` defines."""
    theirs = (sdk - own) | shared
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in theirs:
            owner = node.value
            if not (isinstance(owner, ast.Name) and owner.id in ("self", "cls")):
                found.append((node.lineno, node.attr))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in _ATTRIBUTE_CALLS
            and len(node.args) > 1
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in theirs
        ):
            found.append((node.lineno, str(node.args[1].value)))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == package:
            name = node.module or ""
            private_module = any(part.startswith("_") for part in name.split("."))
            for alias in node.names:
                if private_module or alias.name.startswith("_"):
                    found.append((node.lineno, f"{name}.{alias.name}"))
    for cls, inherited in subclasses:
        for node in ast.walk(cls):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "self"
                and node.attr in inherited
                and (module, cls.name, node.attr) not in OWN_IN_SUBCLASS
            ):
                found.append((node.lineno, f"self.{node.attr}"))
    return sorted(set(found))


def test_the_check_finds_a_private_sdk_name_however_it_is_read() -> None:
    sdk = _defined([p for d in _SDK_SOURCES for p in d.rglob("*.py")])
    own = {"_room", "_installed"}
    source = (
        "from livekit.agents.voice.room_io._output import _ParticipantAudioOutput\n"
        "from livekit.agents.voice.avatar import DataStreamAudioOutput\n"
        "sink._destination_identity\n"
        "getattr(lp, '_rpc_handlers', None)\n"
        "session._started\n"
        "self._lc._installed, self._room, self._started, sink._room\n"
        "class Fake(rtc.Room):\n"
        "    def go(self):\n"
        "        self._connection_state = 1\n"
        "        self._mine = 2\n"
    )
    fake = ast.parse(source).body[-1]
    assert isinstance(fake, ast.ClassDef)
    reads = private_reads(
        source,
        sdk=sdk,
        own=own,
        subclasses=[(fake, _livekit_privates(type("Fake", (rtc.Room,), {})))],
    )
    assert [name for _, name in reads] == [
        "livekit.agents.voice.room_io._output._ParticipantAudioOutput",
        "_destination_identity",
        "_rpc_handlers",
        "_started",
        "self._connection_state",
    ]


def test_no_module_outside_sdk_reads_a_private_sdk_name() -> None:
    """``session._started``, ``ctx._tempdir``, an ``AgentServer``'s hooks, the sink's and
    the room's internals, RoomIO's private output class, rtc's protobuf modules, the state
    an embedded room sets on ``rtc.Room``: read in ``sdk/`` only (the runtime, the testing
    kit, the tools and the examples checked)."""
    modules = _modules()
    assert ROOT / "agent_runtime" / "runtimes" / "avatar" / "_lifecycle.py" in modules
    assert ROOT / "agent_runtime" / "testing" / "inmemory.py" in modules
    sdk = _defined([p for d in _SDK_SOURCES for p in d.rglob("*.py")])
    own = _own(modules)
    offenders = []
    for path in modules:
        source = path.read_text(encoding="utf-8")
        module = _module_name(path)
        subclasses = [(c, names) for c, names in _classes(module, ast.parse(source)) if names]
        offenders += [
            f"{path.relative_to(ROOT)}:{line} {name}"
            for line, name in private_reads(
                source, sdk=sdk, own=own, subclasses=subclasses, module=module
            )
        ]
    assert offenders == []


# -- asyncio's private names too: read in sdk/asyncio_compat.py only -----------------------
_ASYNCIO_SOURCES = [Path(asyncio.__file__).parent]
# asyncio private names the project also gives attributes of its own (the scheduler's
# ``_ready``): read on anything but ``self`` they are asyncio's
ASYNCIO_SHARED = frozenset({"_ready", "_scheduled", "_is_coroutine", "_callback"})


def asyncio_private_reads(paths: list[Path]) -> list[str]:
    """``path:line name`` wherever one of ``paths`` reads a private name of asyncio: a
    loop's ready queue or timer heap, a future's state, the legacy coroutine marker, on an
    object, through ``getattr``, imported, or inherited by a subclass of an asyncio class
    (a loop of the kit's reading its base's ``self._scheduled``)."""
    sdk = _defined([p for d in _ASYNCIO_SOURCES for p in d.rglob("*.py")])
    own = _own(_modules())
    found = []
    for path in paths:
        source = path.read_text(encoding="utf-8")
        module = _module_name(path)
        tree = ast.parse(source)
        subclasses = [(c, names) for c, names in _classes(module, tree, "asyncio") if names]
        found += [
            f"{path.relative_to(ROOT)}:{line} {name}"
            for line, name in private_reads(
                source,
                sdk=sdk,
                own=own,
                subclasses=subclasses,
                module=module,
                shared=ASYNCIO_SHARED,
                package="asyncio",
            )
        ]
    return found


def test_the_asyncio_check_finds_a_private_name_however_it_is_read() -> None:
    """What the kit's virtual time and the emitter read before they went through
    ``asyncio_compat``: each is found, by line."""
    source = (
        "import asyncio\n"
        "from asyncio.base_events import _format_handle\n"
        "MARK = getattr(asyncio.coroutines, '_is_coroutine', None)\n"
        "def settle(loop):\n"
        "    return getattr(loop, '_ready', None), loop._ready, fut._log_traceback\n"
        "class Sched:\n"
        "    def f(self):\n"
        "        return self._ready\n"
    )
    sdk = _defined([p for d in _ASYNCIO_SOURCES for p in d.rglob("*.py")])
    reads = private_reads(source, sdk=sdk, own=set(), shared=ASYNCIO_SHARED, package="asyncio")
    assert reads == [
        (2, "asyncio.base_events._format_handle"),
        (3, "_is_coroutine"),
        (5, "_log_traceback"),
        (5, "_ready"),
    ]
    loop_source = (
        "class Loop(asyncio.SelectorEventLoop):\n"
        "    def next_timer(self):\n"
        "        return self._scheduled, self._mine\n"
    )
    cls = ast.parse(loop_source).body[0]
    assert isinstance(cls, ast.ClassDef)
    inherited = _livekit_privates(type("Loop", (asyncio.SelectorEventLoop,), {}), "asyncio")
    reads = private_reads(
        loop_source,
        sdk=sdk,
        own={"_mine"},
        subclasses=[(cls, inherited)],
        shared=ASYNCIO_SHARED,
        package="asyncio",
    )
    assert reads == [(3, "self._scheduled")]


def test_no_module_outside_sdk_reads_a_private_asyncio_name() -> None:
    """The kit's ``settle()`` and its loop's timers, the emitter's coroutine check: read
    through ``agent_runtime.sdk.asyncio_compat`` (the runtime, the kit, the tools, the
    project's verification, the benchmarks and the examples checked)."""
    modules = _modules()
    assert ROOT / "agent_runtime" / "testing" / "clock.py" in modules
    assert asyncio_private_reads(modules) == []


async def test_the_asyncio_accessors_read_a_running_loop() -> None:
    """``ready_handles`` holds what the loop runs next; ``scheduled_timers`` a timer armed,
    and ``marked_coroutine`` asyncio's legacy marker (none on a plain function)."""
    from agent_runtime.sdk import asyncio_compat as aio

    loop = asyncio.get_running_loop()
    handle = loop.call_soon(lambda: None)
    ready = aio.ready_handles(loop)
    assert ready is not None and handle in ready
    timer = loop.call_later(60, lambda: None)
    assert timer in aio.scheduled_timers(loop)
    timer.cancel()
    handle.cancel()
    marker = getattr(asyncio.coroutines, "_is_coroutine", None)

    def plain() -> None:
        return None

    assert not aio.marked_coroutine(plain)
    if marker is not None:
        plain._is_coroutine = marker  # type: ignore[attr-defined]
        assert aio.marked_coroutine(plain)
    assert aio.ready_handles(object()) is None  # type: ignore[arg-type]
    assert aio.scheduled_timers(object()) == ()  # type: ignore[arg-type]


async def test_a_sink_s_open_and_ended_segments_are_read_from_the_pinned_sdk() -> None:
    out = OtherSink()
    frame = rtc.AudioFrame(b"\0\0" * 240, 24000, 1, 240)
    assert not lk.segment_open(out) and lk.ended_unreported(out) == 0
    await out.capture_frame(frame)
    assert lk.segment_open(out) and lk.pending_playbacks(out) == 1
    assert lk.ended_unreported(out) == 0  # still being captured
    out.flush()
    assert not lk.segment_open(out) and lk.ended_unreported(out) == 1
    out.on_playback_finished(playback_position=0.01, interrupted=False)
    assert lk.ended_unreported(out) == 0
    # the data stream sink keeps what it pushed of its last segment
    sink = DataStreamAudioOutput(rtc.Room(), destination_identity="avatar")
    assert "_AudioOutput__capturing" in vars(sink) and lk.pushed_seconds(sink) == 0.0
    assert lk.pushed_seconds(out) == 0.0  # an output that keeps no count


async def test_a_sink_whose_start_failed_is_let_start_again() -> None:
    sink = DataStreamAudioOutput(rtc.Room(), destination_identity="avatar")
    assert not lk.restart_failed_sink(sink)  # never started: nothing to do

    async def fails() -> None:
        raise RuntimeError("participant 'avatar' disconnected while waiting")

    task = asyncio.ensure_future(fails())
    with contextlib.suppress(RuntimeError):
        await task
    sink._start_atask = task
    assert lk.restart_failed_sink(sink) and sink._start_atask is None

    async def started() -> None:
        return None

    ok = asyncio.ensure_future(started())
    await ok
    sink._start_atask = ok
    assert not lk.restart_failed_sink(sink) and sink._start_atask is ok
