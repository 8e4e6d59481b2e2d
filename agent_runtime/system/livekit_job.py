"""``AgentJob`` inside a livekit-agents job: the options its ``JobContext`` gives, the live
job of each context, and the ``on_session_end`` hook that ends it."""

from __future__ import annotations

import asyncio
import inspect
import logging
import re
import string
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from livekit.agents.job import JobContext

from agent_runtime.parts import check_part
from agent_runtime.sdk import livekit_compat as lk
from agent_runtime.settings import SettingError, SettingTypeError
from agent_runtime.system._inputs import injections

if TYPE_CHECKING:
    from agent_runtime.runtimes.job import JobRuntime
    from agent_runtime.runtimes.room_events import RoomEventAdapter
    from agent_runtime.system.agent_job import AgentJob

logger = logging.getLogger("agent_runtime.agent_job")


@dataclass(eq=False)
class _Registration:
    """An ``AgentJob`` in its livekit job context, from ``from_job_context`` until the job
    closed. What the job's machines know is read from them: its reason and its close (the
    ``job`` machine), an ``aclose()`` (the lifecycle is ``closing``), whether it followed
    the room. Kept here is only what none of them hears: what livekit's process did, and
    whether the agent's code gave ``job.shutdown`` a reason (the ``job`` machine hears a
    ``shutdown`` alike from the agent, the participant link and livekit's hooks)."""

    job: AgentJob
    # job.shutdown(reason) was given a reason: the job's close ends livekit's job with it
    agent_gave_reason: bool = False
    # ctx.shutdown() was called (the agent's code, an end-call tool, the simulator leaving):
    # livekit's end is under way, and it disconnects the room after on_session_end (read as
    # the job's close begins: the close's own ask, at its disconnect step, changes nothing)
    livekit_asked: bool = False
    # livekit has called on_session_end: a room lost in a hold is no missing hook
    session_end_called: bool = False
    # the job's close began, and the room is its own to end (livekit's end was not asked):
    # done once its disconnect step is over, which session_end_hook waits for before yours
    room_ended: asyncio.Future[None] | None = None


# the live job of each job context, for on_session_end / on_simulation_end; dropped at close
_JOBS: dict[Any, _Registration] = {}
# the contexts whose job closed after it followed their room: that room is disconnected
# now, or about to be (the job's close disconnects it, or livekit's shutdown under way does)
_ENDED: weakref.WeakSet[JobContext] = weakref.WeakSet()


# what a name filled into a path must not hold: a separator (a room named "../x" wrote
# outside the trace directory; "team/standup" named a directory that is not there), a
# control character, or what Windows refuses in a file name
_UNSAFE = re.compile(r'[/\\\x00-\x1f:*?"<>|]')


def _file_part(name: str) -> str:
    """``name`` as one file-name part: unsafe characters as ``_``, at most 128 bytes of
    UTF-8 (whole characters), never ``.`` or ``..``."""
    # bytes, not characters: the system's limit is 255 bytes, which 128 characters of a
    # non-Latin room name pass (no trace file at all)
    part = _UNSAFE.sub("_", name).encode(errors="replace")[:128].decode(errors="ignore")
    return part if part.strip(".") else part.replace(".", "_") or "_"


def context_options(ctx: JobContext, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with what ``ctx`` gives where they are silent: its simulation context,
    the ``on_simulation_end`` given to ``AgentServer.rtc_session``, ``ctx.delete_room``;
    ``trace_path`` filled in (``{job_id}``, ``{room}``)."""
    if not isinstance(ctx, JobContext):
        # before anything reads it: None failed deep inside, on a missing attribute
        raise TypeError(f"ctx must be a livekit-agents JobContext, not {type(ctx).__name__}")
    if (reg := _JOBS.get(ctx)) is not None:
        raise RuntimeError(f"this job context already has an AgentJob ({reg.job.lifecycle})")
    if ctx in _ENDED:
        raise RuntimeError(CONTEXT_ENDED)
    trace_path = options.get("trace_path")
    if isinstance(trace_path, str):
        # the job's room, as the dispatch names it (livekit's runner names ctx.room from it;
        # a room built by hand may have no name before it connects)
        room = ctx.job.room.name or ctx.room.name
        # a Path: filled in, it is no template any more (AgentJob fills only a str)
        options["trace_path"] = Path(fill_trace_path(trace_path, room=room, job_id=ctx.job.id))
    if options.get("simulation") is None:
        options["simulation"] = ctx.simulation_context()
    if options.get("on_simulation_end") is None:
        # where the job runner puts rtc_session(on_simulation_end=...)
        options["on_simulation_end"] = lk.job_simulation_end_fn(ctx)
    if options.get("delete_room") is None and "delete_room" not in injections():

        async def delete_room() -> None:
            await ctx.delete_room()

        options["delete_room"] = delete_room
    return options


def fill_trace_path(template: str, *, room: str, job_id: str | None = None) -> str:
    """``template`` with ``{room}`` and, inside a livekit job, ``{job_id}`` filled in, each
    as one file name. ``{job_id}`` outside a livekit job (``job_id`` None: ``AgentJob(...)``
    built directly), ``{room}`` of a room with no name yet there, and any other field, spec
    or conversion (``{room.name}``, ``{jobid}``, ``{job_id:>300}``, ``{room!r}``) is a
    ``SettingError`` naming it, not a Python error from ``format`` or a literal name."""
    try:
        fields = list(string.Formatter().parse(template))
    except ValueError as e:  # a lone "{" or "}"
        raise SettingError(f"trace_path: {e} (write {{{{ or }}}} for a brace)") from None
    values = {"room": room} if job_id is None else {"room": room, "job_id": job_id}
    for _, name, spec, conversion in fields:
        if name == "job_id" and job_id is None:
            raise SettingError(
                "trace_path: {job_id} is filled in only inside a livekit job "
                "(AgentJob.from_job_context); a job built with AgentJob(...) has no job id"
            )
        if name == "room" and not room and job_id is None:
            raise SettingError(
                "trace_path: {room} is the room's name, and this room has none yet (a room "
                "is named as it connects): connect it before building the job"
            )
        # !s and :s say what filling in does anyway: a string as it is
        if name is not None and (
            name not in values or spec not in ("", "s") or conversion not in (None, "s")
        ):
            field = "{" + name + (f"!{conversion}" if conversion else "")
            field += (f":{spec}" if spec else "") + "}"
            raise SettingError(
                f"trace_path: only {{job_id}} and {{room}} can be filled in, not {field}"
            )
    return template.format(**{k: _file_part(v) for k, v in values.items()})


def register(ctx: JobContext, job: AgentJob) -> None:
    """``job`` is ``ctx``'s until it closes; it closes with livekit's own shutdown too."""
    _JOBS[ctx] = _Registration(job)

    def shut_down(reason: str) -> None:
        if (reg := _JOBS.get(ctx)) is not None:
            reg.livekit_asked = True
            # the job's close (its callbacks, its log line) gives this reason, not the
            # session close livekit makes from it
            reg.job.job.note_reason(reason)
        process_shutdown(reason)

    process_shutdown = lk.set_job_shutdown_hook(ctx, shut_down)

    # the safety net when on_session_end was not passed (no hold then: the room is
    # already disconnected)
    async def on_livekit_shutdown(reason: str) -> None:
        job.job.shutdown(reason)  # livekit's own end: not the agent's to tell livekit
        await job.wait_closed()

    ctx.add_shutdown_callback(on_livekit_shutdown)


def agent_asked(ctx: JobContext, reason: str) -> None:
    """The agent's code asked the job to end with ``reason`` (``job.shutdown(reason)``)."""
    if reason and (reg := _JOBS.get(ctx)) is not None:
        reg.agent_gave_reason = True


def disconnect_work(
    ctx: JobContext, job: JobRuntime, events: RoomEventAdapter
) -> Callable[[], Awaitable[None] | None]:
    """The job close's ``disconnect`` step inside a livekit job, as its close begins. When
    livekit's shutdown is under way it disconnects the room after ``on_session_end``, which
    still has the room: the step does nothing. Otherwise the job disconnects the room it
    followed; when the agent asked the job to end (``job.shutdown(reason)``, ``aclose()``:
    the lifecycle is ``closing``), livekit's end is asked first with the job's reason, as
    ``ctx.shutdown(reason)`` asks it (its shutdown callbacks and its exit say why, not
    "room disconnected")."""
    reg = _JOBS.get(ctx)
    if reg is None:
        return job.disconnect_room
    if reg.livekit_asked:
        return lambda: None
    ended = reg.room_ended = asyncio.get_running_loop().create_future()

    def disconnect() -> Awaitable[None] | None:
        asked = reg.agent_gave_reason or reg.job.lifecycle == "closing"
        if asked and job.reason and events.started and ctx.room.isconnected():
            ctx.shutdown(job.reason)  # livekit's end begins: on_session_end runs meanwhile
        return _then_done(job.disconnect_room(), ended)

    return disconnect


def _then_done(work: Awaitable[None] | None, done: asyncio.Future[None]) -> Awaitable[None] | None:
    """``work`` (a coroutine: its step's task, cut at its bound), then ``done``, however
    ``work`` ended; ``done`` at once when there is no work."""
    if work is None:
        done.set_result(None)
        return None

    async def run() -> None:
        try:
            await work
        finally:
            done.set_result(None)

    return run()


def job_of(ctx: JobContext) -> AgentJob | None:
    return reg.job if (reg := _JOBS.get(ctx)) is not None else None


def forget(ctx: JobContext, *, room_followed: bool) -> None:
    """``ctx``'s job closed; a job that had followed its room ended the livekit job."""
    if _JOBS.pop(ctx, None) is not None and room_followed:
        _ENDED.add(ctx)


def context_ended(ctx: JobContext) -> bool:
    return ctx in _ENDED


def hold_hint(ctx: JobContext) -> str:
    """Until livekit runs ``on_session_end``, a room that goes during a hold may be
    livekit's own disconnect, which the hook's absence causes; once it runs, it is not."""
    reg = _JOBS.get(ctx)
    return "" if reg is not None and reg.session_end_called else NO_HOOK_HINT


async def _room_ended_by_the_job(reg: _Registration) -> None:
    """Until the job's close has disconnected the room, when its close is what ends it, or
    until the job is closed (a disconnect cut at its bound)."""
    ended = reg.room_ended
    if ended is not None and not ended.done() and (closed := reg.job.job.when_closed()):
        await asyncio.wait((ended, closed), return_when=asyncio.FIRST_COMPLETED)


NO_HOOK_HINT = (
    " (a livekit job's room is disconnected as its session closes unless rtc_session was "
    "given on_session_end=on_session_end)"
)

CONTEXT_ENDED = (
    "this job context's AgentJob is closed, and its room goes with it: livekit ends the "
    "job; a new session comes as a new job"
)


async def on_session_end(ctx: JobContext) -> None:
    """Pass to ``AgentServer.rtc_session(..., on_session_end=on_session_end)``.

    livekit-agents calls it after the primary session closed and before it disconnects the
    room: the job shuts down here, holding for the simulator's finalize (bounded by
    ``session_end_timeout``), and this returns once the job is ``closed``.
    """
    if not isinstance(ctx, JobContext):  # on_session_end("x") was logged as no job
        raise TypeError(f"ctx must be a livekit-agents JobContext, not {type(ctx).__name__}")
    reg = _JOBS.get(ctx)
    if reg is None:
        logger.info(
            "on_session_end: no live AgentJob for this job (none made, or closed)",
            extra={"job_id": ctx.job.id, "room": ctx.job.room.name},
        )
        return
    reg.session_end_called = True  # the hook is given: a room lost now is no missing hook
    job = reg.job
    job.job.shutdown("session ended")  # livekit's own end: not the agent's to tell livekit
    try:
        await job.wait_closed()
    except asyncio.CancelledError:
        if job.lifecycle != "closed":
            # livekit's own line says only that on_session_end timed out
            s = job.settings
            job.job.actor.report(
                logger,
                logging.WARNING,
                "on_session_end was cut before the job closed (livekit's session_end_timeout "
                "on AgentServer, or the worker shutting down) in job state %s: the job's hold "
                "and close take up to %gs (its session_end_timeout %gs + close_timeout %gs); "
                "give AgentServer(session_end_timeout=...) at least that",
                job.states.get("job"),
                s.session_end_timeout + s.close_timeout,
                s.session_end_timeout,
                s.close_timeout,
            )
        raise


def session_end_hook(
    then: Callable[[JobContext], Any] | None = None,
) -> Callable[[JobContext], Awaitable[None]]:
    """Your own session-end callback ``then(ctx)``, then ``on_session_end``.

    Yours runs first, where livekit runs it alone: after the session closed, within the
    server's ``session_end_timeout``. When the job was shut down through livekit
    (``ctx.shutdown()`` once the job was built: your code, an end-call tool, the simulator
    leaving) the room is connected while yours runs: livekit disconnects it afterwards,
    and the job leaves it to livekit. When the job's own close ended it (the user left, say,
    or your ``job.shutdown(reason)`` or ``aclose()``), its close disconnects the room: yours
    runs once the room is gone, as livekit alone runs it once the room ends. In a
    simulation the job holds for the verdict while yours runs; read the verdict in
    ``on_simulation_end``. If yours raises, the job still ends, then its error is raised
    (livekit logs it, as it logs a failing ``on_session_end``)."""
    # its arity too, as on_simulation_end's: a then() taking no ctx failed at every job end
    try:
        check_part("then", then)
    except SettingTypeError as e:  # "then must be ..." alone does not say whose then
        raise SettingTypeError(f"session_end_hook(then): {e}") from None

    async def hook(ctx: JobContext) -> None:
        if isinstance(ctx, JobContext) and (reg := _JOBS.get(ctx)) is not None:
            reg.session_end_called = True  # the hook is given, though yours runs first
            # the job's close is disconnecting the room (yours ran as the disconnect raced
            # livekit here: with the room, or without it, or losing it as it ran)
            await _room_ended_by_the_job(reg)
        failed: Exception | None = None
        try:
            if then is not None:
                res = then(ctx)
                if inspect.isawaitable(res):
                    await res
        except Exception as e:  # raised once the job has ended (a cut is not caught)
            failed = e
        await on_session_end(ctx)
        if failed is not None:
            raise failed

    if then is not None:  # named for yours, as livekit names a callback it wraps
        hook.__qualname__ = f"session_end_hook({getattr(then, '__qualname__', repr(then))})"
        hook.__module__ = getattr(then, "__module__", None) or hook.__module__
    return hook
