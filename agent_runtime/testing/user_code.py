"""Failures of the user's own code while the kit runs a job, kept for the test to fail on.

livekit logs what fails in an agent's code (an event handler that raises, a background task
that dies, an ``on_session_end`` or shutdown callback that raises) and goes on; in production
that is a log line nobody reads. The kit keeps each one, with its traceback, and the test
fails on it. "The user's code" is any frame outside the installed packages, the standard
library and this project's own packages: the agent under test.

A failure a library logged is the agent's when the library called the agent's code and that
code raised: livekit's emitter calling a handler, ``log_exceptions`` around the agent's
coroutine. One a library logged of its own work is the library's, handled there, even when
a frame of the user's files is on the way: a plugin catching its provider's error, raised by
a fake the test put in place of the HTTP client (reached through another library).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import logging
import sys
import sysconfig
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import agent_runtime
import statemachines
from agent_runtime.sdk import asyncio_compat as aio

_NOT_USER = tuple(
    str(Path(p).resolve())
    for p in {
        sysconfig.get_paths()["stdlib"],
        sysconfig.get_paths()["purelib"],
        sysconfig.get_paths()["platlib"],
        str(Path(agent_runtime.__file__).parent),
        str(Path(statemachines.__file__).parent),
    }
)


def is_user_file(filename: str) -> bool:
    """A frame of the agent under test (not a library's, not this project's)."""
    if filename.startswith("<"):
        return False
    try:
        path = str(Path(filename).resolve())
    except OSError:
        return False
    return not path.startswith(_NOT_USER)


def is_user_callable(cb: Any) -> bool:
    """``cb`` is the agent's own: its code is in the agent's files (a partial: its
    function's), or it is a wrapper that says it stands for a function of the agent's
    module (livekit wraps a shutdown callback that takes no reason so, giving the wrapper
    the callback's ``__module__``)."""
    fn = getattr(cb, "__func__", cb)
    while isinstance(fn, functools.partial):
        fn = fn.func
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    if code is not None and is_user_file(code.co_filename):
        return True
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    where = getattr(module, "__file__", None)
    return isinstance(where, str) and is_user_file(where)


# where a library frame belongs: installed packages by their top-level name (livekit's
# rtc, agents, api and plugins are one: livekit), the standard library and this project's
# own packages pass the agent's code on and own nothing
_SITE = tuple(
    str(Path(p).resolve())
    for p in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
)
_PASSING = tuple(
    str(Path(p).resolve())
    for p in {
        str(Path(agent_runtime.__file__).parent),
        str(Path(statemachines.__file__).parent),
    }
)


@functools.lru_cache(maxsize=4096)
def _library(filename: str) -> str | None:
    """The installed package a frame's file belongs to (its top-level name), ``""`` for
    the standard library's and this project's, ``None`` for the user's."""
    if filename.startswith("<"):
        return ""  # frozen modules (importlib's), code compiled from a string
    if is_user_file(filename):
        return None
    path = Path(filename)
    with contextlib.suppress(OSError):
        path = path.resolve()
    if str(path).startswith(_PASSING):
        return ""
    for site in _SITE:
        if path.is_relative_to(site):
            return path.relative_to(site).parts[0].removesuffix(".py")
    return ""  # the standard library's


def user_frames(tb: TracebackType | None, catcher: str | None = None) -> bool:
    """Whether the agent's code raised the exception of traceback ``tb``, caught by the
    installed package ``catcher`` (by default the first one the traceback goes through):
    a frame of the user's files is on the way from where it was caught to where it was
    raised, and the library that called it is the catcher (the standard library and this
    project's own pass calls on). The catcher called the agent's code, which raised:
    livekit's emitter a handler, its ``log_exceptions`` a coroutine, a task's coroutine
    being the agent's. A frame of the user's that another library called (aiohttp calling
    a fake the test put in place of its request, under a plugin that caught the error) is
    that library's work failing, and the catcher's to handle."""
    caller: str | None = None
    while tb is not None:
        owner = _library(tb.tb_frame.f_code.co_filename)
        if owner is None:
            return caller is None or caller == catcher
        if owner:
            caller = owner
            catcher = catcher or owner
        tb = tb.tb_next
    return False


def _code_at(error: BaseException) -> str:
    """``code in Booker.book (agent.py:49)``: the agent's innermost frame on the way to
    ``error``, for a failure a library caught and logged without saying whose code it
    called (a tool, ``on_exit``, a node the agent overrides)."""
    place = None
    tb = error.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if is_user_file(code.co_filename):
            place = f"{code.co_qualname} ({Path(code.co_filename).name}:{tb.tb_lineno})"
        tb = tb.tb_next
    return f"code in {place}" if place is not None else "code"


class UserCodeError(AssertionError):
    """The agent's own code failed while the kit ran its job (the cause is its exception)."""


class PrewarmFailed(UserCodeError):
    """The server's ``setup_fnc`` (its prewarm) raised, or had not returned within the
    server's ``initialize_process_timeout``: the job's entrypoint never ran."""


class CallbackHung(TimeoutError):
    """A shutdown callback (or ``on_session_end``) had not returned when livekit's worker
    kills the job's process (``shutdown_process_timeout``, 10 s by default), which logs
    only that the process did not exit in time: one that never returns, or one that takes
    longer (an upload), is cut there."""

    def __init__(self, name: str, bound: float | None = None) -> None:
        timeout = "shutdown_process_timeout" + (f", {bound:g}s" if bound is not None else "")
        super().__init__(
            f"{name} had not returned when livekit's worker kills the job's process (the "
            f"server's {timeout}): one that never returns, or takes longer, is cut there"
        )


class CallbackCut(RuntimeError):
    """A shutdown callback was still running when another one raised: livekit's job
    process gathers them and exits on the first failure, so deployed this one is cut
    where it was (what it was saving is lost)."""

    def __init__(self, name: str, by: str) -> None:
        super().__init__(
            f"{name} was still running when {by} raised: livekit's job process exits on "
            "the first shutdown callback that fails, cutting the others (deployed, it would "
            "not have finished)"
        )


class SessionCloseHeld(TimeoutError):
    """The primary session's close was still waiting on the agent's code (an ``on_exit``
    that never returns, say) at livekit's bound on it: livekit logs that ``aclose()`` timed
    out and goes on with the job's end that much later."""

    def __init__(self, waiting: list[str], bound: float) -> None:
        super().__init__(
            f"waited on {', '.join(waiting)}, which had not returned at livekit's bound on "
            f"the session's close ({bound:g}s): deployed, livekit logs \"AgentSession.aclose() "
            'timed out" and the job ends that much later'
        )


def agents_code_waiting(
    is_jobs: Callable[[asyncio.Task[Any]], bool] | None = None,
) -> list[str]:
    """Where the agent's code waits now, in the job's tasks (``is_jobs``; every task when
    None): each task's innermost frame of the agent's files along its chain of awaits,
    ``A.on_exit (agent.py:14)``."""
    found: list[str] = []
    me = asyncio.current_task()
    for task in asyncio.all_tasks():
        if task is me or task.done() or (is_jobs is not None and not is_jobs(task)):
            continue
        place = None
        coro: Any = task.get_coro()
        if _is_agents_own(coro):  # a task the agent started holds no close of livekit's
            continue
        while coro is not None:
            frame = getattr(coro, "cr_frame", None) or getattr(coro, "ag_frame", None)
            if frame is not None and is_user_file(frame.f_code.co_filename):
                place = f"{frame.f_code.co_qualname} ({Path(frame.f_code.co_filename).name}:"
                place += f"{frame.f_lineno})"
            coro = getattr(coro, "cr_await", None) or getattr(coro, "ag_await", None)
        if place is not None and place not in found:
            found.append(place)
    return found


def _is_agents_own(coro: Any) -> bool:
    code = getattr(coro, "cr_code", None) or getattr(coro, "ag_code", None)
    return code is not None and is_user_file(code.co_filename)


def is_agents_task(task: asyncio.Task[Any]) -> bool:
    """The task runs a coroutine of the agent's own files (one it started itself)."""
    return _is_agents_own(task.get_coro())


# the runner whose job's context this is (the entrypoint's task, the session-end hook's,
# the room's events, and all they start): what runs there is that job's; what the test's
# own task starts is the test's
JOB_SIDE: contextvars.ContextVar[object | None] = contextvars.ContextVar(
    "agent_runtime_job_side", default=None
)


class TasksLeftRunning(RuntimeError):
    """Tasks still running once the job's end was over (``EntrypointRunner.tasks_left``):
    livekit's job process cancels them only as the process exits, so in a worker they run
    on after the call. The message names each task's coroutine."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        one = len(names) == 1
        super().__init__(
            f"left {'a task' if one else 'tasks'} running after it ended: {', '.join(names)} "
            f"(livekit's job process cancels {'it' if one else 'them'} only as the process "
            "exits)"
        )


def stop_task(task: asyncio.Task[Any]) -> None:
    """End a task that swallows its cancellation, as a killed process ends it: its
    coroutine is closed where it waits (``GeneratorExit``: its ``finally`` blocks run, an
    ``except CancelledError`` does not catch it), then the task is cancelled, and ends at
    its next step. Without this, the loop's own close (``asyncio.run``, pytest-asyncio's
    runner) cancels and awaits it for ever."""
    coro = task.get_coro()
    if inspect.iscoroutine(coro):
        with contextlib.suppress(RuntimeError):  # it ignored GeneratorExit too
            coro.close()
    task.cancel()
    # what it ends with (the closed coroutine's "cannot reuse" error) is nobody's to read
    task.add_done_callback(lambda t: t.cancelled() or t.exception())


def task_name(task: asyncio.Task[Any]) -> str:
    """A task by its coroutine's qualified name (``(agent code)`` when it is the agent's),
    or by the task's own name when it runs no coroutine of its own."""
    coro = task.get_coro()
    code = getattr(coro, "cr_code", None)
    where = getattr(code, "co_qualname", None) or task.get_name()
    user = code is not None and is_user_file(code.co_filename)
    return f"{where}{' (agent code)' if user else ''}"


@dataclass(frozen=True)
class UserFailure:
    """Where the user's code failed (``entrypoint``, ``on_session_end``, ``shutdown
    callback``, ``event handler``, ``task``; ``job`` for tasks it left running) and its
    exception."""

    where: str
    error: BaseException

    def describe(self) -> str:
        lines = traceback.format_exception(self.error)
        return f"{self.where} {said(self.error)}\n" + "".join(lines)

    def as_error(self) -> UserCodeError:
        err = UserCodeError(f"the agent's {self.where} {said(self.error)}")
        err.__cause__ = self.error
        return err


class UserFailures(logging.Handler):
    """Collects the user's failures: the kit adds what it awaits itself (``add``); as a log
    handler and the loop's exception handler it also catches what livekit only logs."""

    def __init__(self) -> None:
        super().__init__(level=logging.ERROR)
        self.failures: list[UserFailure] = []
        # a session close the agent's code held was cut: the session's own tasks left
        # running are that failure's consequence, not one more
        self.close_held = False
        self.caller: asyncio.Task[Any] | None = None  # the test's own task, once known
        # whether a task is the job's (the runner's count): None, every task is
        self.is_jobs: Callable[[asyncio.Task[Any]], bool] | None = None
        self._seen: set[int] = set()
        self._previous: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def add(self, where: str, error: BaseException) -> None:
        if id(error) in self._seen:
            return
        self.close_held = self.close_held or isinstance(error, SessionCloseHeld)
        self._seen.add(id(error))
        self.failures.append(UserFailure(where, error))

    # -- what livekit only logs -------------------------------------------------------------
    def emit(self, record: logging.LogRecord) -> None:
        if record.name == "asyncio":
            # a loop's exception handler reporting: the job's loop reports to
            # _on_loop_error; this is another loop's task, collected now (an earlier test's)
            return
        exc = record.exc_info[1] if record.exc_info else None
        # what a library logged of the user's code; the agent's own logging is its choice
        if (
            exc is not None
            and not is_user_file(record.pathname)
            and user_frames(exc.__traceback__, _library(record.pathname) or None)
        ):
            where = "event handler" if "emit" in record.getMessage() else _code_at(exc)
            self.add(where, exc)
            try:
                task = asyncio.current_task()  # livekit logs inside the task, then re-raises
            except RuntimeError:  # logged from a thread
                task = None
            # the test's own task, which called into the agent, ends as the test says; a
            # task the test started is retrieved, but how it ends is not the agent's
            if task is not None and task is not self.caller:
                report = self.is_jobs is None or self.is_jobs(task)
                task.add_done_callback(functools.partial(_retrieve, exc, report))

    def _on_loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if isinstance(exc, BaseException) and user_frames(exc.__traceback__):
            self.add("task", exc)
            return
        if self._previous is not None:
            self._previous(loop, context)
        else:
            loop.default_exception_handler(context)

    def install(self) -> None:
        if logging.root.manager.disable >= logging.ERROR:
            # livekit's emitter logs an event handler's exception and swallows it: with
            # its log disabled the kit would pass a test whose agent fails
            raise RuntimeError(
                "logging is disabled at ERROR (logging.disable): the testing kit hears the "
                "agent's event handlers fail through livekit's log and would miss them; "
                "call logging.disable(logging.NOTSET) first, or disable below ERROR only"
            )
        logging.getLogger().addHandler(self)
        self._loop = asyncio.get_running_loop()
        self._previous = self._loop.get_exception_handler()
        self._loop.set_exception_handler(self._on_loop_error)

    def uninstall(self) -> None:
        logging.getLogger().removeHandler(self)
        if self._loop is not None and not self._loop.is_closed():
            self._loop.set_exception_handler(self._previous)
        self._loop = None

    def take(self) -> list[UserFailure]:
        """The failures not yet taken (each is reported once)."""
        out, self.failures = self.failures, []
        return out


def _retrieve(error: BaseException, report: bool, task: asyncio.Future[Any]) -> None:
    """Take ``task``'s outcome once it is done, when it is ``error``, the test's failure
    now. Left, the task logs it again as "never retrieved" whenever it is collected, which
    CPython 3.11 turns into pytest's INTERNALERROR when that is in the middle of pytest
    formatting a failure. Another error it ended with is its owner's: it is looked at
    without being taken, and once the task's other done callbacks (its owner's, a task
    awaiting it) have run, reported now if none of them took it, as asyncio would have
    later, when ``report`` (a task of the job's: a test's own task's end is the test's).
    The runtime's own tasks (an avatar plugin's start that failed) are taken by the
    runtime: asyncio would not report them, nor does the kit."""
    if task.cancelled():
        return
    ended_with = aio.peek_exception(task)
    if ended_with is error:
        task.exception()
    elif ended_with is not None and report:
        task.get_loop().call_soon(_report_untaken, task)


def _report_untaken(task: asyncio.Future[Any]) -> None:
    if not aio.exception_retrieved(task):
        task.get_loop().call_exception_handler(
            {
                "message": "Task exception was never retrieved",
                "exception": task.exception(),
                "future": task,
            }
        )


# livekit's get_job_context() with no job context current
NO_JOB_CONTEXT = "no job context found"
# livekit's Plugin.register_plugin (plugin.py), which every plugin package's import calls
PLUGIN_THREAD = "Plugins must be registered on the main thread"


def said(error: BaseException) -> str:
    """What the user's code did: ``raised ValueError: ...``, or that it had not returned."""
    if isinstance(error, (CallbackHung, CallbackCut, SessionCloseHeld, TasksLeftRunning)):
        return str(error)
    text = f"raised {type(error).__name__}: {error}"
    if isinstance(error, RuntimeError) and str(error) == PLUGIN_THREAD:
        text += (
            " (it imported a livekit plugin, which registers itself: livekit's job process "
            "runs the entrypoint on its main thread, where that works, but the kit ran it "
            "off the main thread: fuzz_entrypoint or fuzz() called while an event loop "
            "runs, as in an async test, fuzz on a thread of their own; import the plugin "
            "at the top of the agent's module, as livekit advises, or fuzz from a sync test "
            "or with agent-runtime fuzz)"
        )
    elif isinstance(error, RuntimeError) and str(error).startswith(NO_JOB_CONTEXT):
        text += (
            " (it ran outside the job's context: livekit runs every turn inside it; a turn "
            "the test starts itself runs there with run_entrypoint.in_job(...), e.g. "
            "in_job(session.generate_reply, user_input=...))"
        )
    return text
