"""What must hold in every run the fuzzer makes, and the user's own properties.

Each built-in property reads a ``Harness`` and returns the problems it found (empty: it
held). ``during`` ones are checked after every step, ``at_end`` ones once the job has ended
and everything was released. A user's property is a plain function of a ``FuzzOutcome``:
it fails by raising (``assert``) or by returning ``False``.
"""

from __future__ import annotations

import difflib
import inspect
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import CodeType
from typing import TYPE_CHECKING, Any

from agent_runtime.parts import described, takes
from agent_runtime.runtimes.avatar import session_room_io
from agent_runtime.sdk import livekit_compat as lk
from agent_runtime.testing.fuzz.harness import Failed
from agent_runtime.testing.invariants.checks import off_the_call as holding_on_the_call
from agent_runtime.testing.job_process import ENTRYPOINT_EXIT, SESSION_CLOSE
from agent_runtime.testing.result import seconds_text
from agent_runtime.testing.user_code import (
    PrewarmFailed,
    is_agents_task,
    is_user_callable,
    said,
)

if TYPE_CHECKING:
    from livekit.agents.job import JobContext

    from agent_runtime.system.agent_job import AgentJob
    from agent_runtime.testing.clock import VirtualClock
    from agent_runtime.testing.fuzz.harness import Harness, Sent
    from agent_runtime.testing.inmemory import InMemoryRoom

# the avatar machine's states in which its route may wait for a join (within join_timeout)
_JOINING = ("idle", "starting", "routing", "backoff")


@dataclass(frozen=True)
class Problem:
    """A property that did not hold: its name, one line, and the detail (a traceback)."""

    prop: str
    message: str
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.prop}: {self.message}"


@dataclass
class FuzzOutcome:
    """What a user's property sees of one run, once the job has ended."""

    steps: list[dict[str, Any]]
    job: AgentJob | None
    ctx: JobContext | None
    room: InMemoryRoom
    clock: VirtualClock
    requests: list[Sent]
    shutdown_reason: str | None
    shutdown_steps: list[tuple[float, str]]
    transitions: list[dict[str, Any]] = field(default_factory=list)


Check = Callable[[FuzzOutcome], Any]


class BadCheck(TypeError):
    """A check of the user's that cannot check an outcome: one that reads what a
    ``FuzzOutcome`` does not have (``outcome.jobb``), a class (calling it makes an
    instance, which passes whatever the agent did), a callable that cannot be called with
    the outcome, an ``async`` one (never awaited). The check's own mistake, which no run of
    the agent can pass (or fail), not a property the agent broke. ``check`` is it."""

    def __init__(self, check: Check, message: str) -> None:
        super().__init__(message)
        self.check = check


def not_a_check(check: Any) -> str | None:
    """Why the callable ``check`` cannot be a check, seen before any run; None when it
    may be one (what cannot be called with the outcome and has no signature to read, a
    builtin, is found by its first call: ``run_checks``)."""
    if isinstance(check, type):
        return (
            f"{check.__name__} is a class: calling it with the outcome makes an instance, "
            "which passes whatever the agent did (a check is a function of the outcome "
            "that raises or returns False)"
        )
    if inspect.iscoroutinefunction(check):
        return f"{_name(check)} is async: a check is called, never awaited (make it a def)"
    return None


def check_checks(checks: Sequence[Check]) -> None:
    """``TypeError`` (``BadCheck`` for a callable) for ``checks`` that are not a list of
    checks, before any run: ``fuzz`` and ``replay`` refuse them alike."""
    if callable(checks) or isinstance(checks, (str, bytes)) or not isinstance(checks, Iterable):
        what = described(checks) if callable(checks) else repr(checks)
        raise TypeError(f"checks must be a list of functions (checks=[my_check]), not {what}")
    for check in checks:
        if not callable(check):
            raise TypeError(f"a check must be callable as check(outcome), not {check!r}")
        if (why := not_a_check(check)) is not None:
            raise BadCheck(check, why)
        if not takes(check, 1):
            raise BadCheck(
                check, f"a check must be callable as check(outcome), not {described(check)}"
            )


def _name(check: Any) -> str:
    return str(getattr(check, "__qualname__", None) or repr(check))


def _misread(name: str, missing: str | None) -> str:
    have = [f.name for f in fields(FuzzOutcome)]
    close = difflib.get_close_matches(missing or "", have, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return (
        f"check {name} reads outcome.{missing}, which a FuzzOutcome does not have{hint}; "
        f"it has {', '.join(have)}"
    )


# -- during the run -----------------------------------------------------------------------
def audible(h: Harness) -> list[Problem]:
    """The agent's audio reaches the room or a joined avatar while its session runs,
    unless the agent itself started it with no audio output and no avatar (a text-only
    agent: ``RoomOptions(audio_output=False)``, or an ``output.audio`` of its own)."""
    job = h.job
    if job is None or job.lifecycle != "running" or not lk.session_live(job.session):
        return []
    if job.avatar is None and _no_room_audio(job.session):
        return []
    route = job.audio_route()
    if route == "none":
        return [Problem("audible", f"t={h.clock.now():g}: the agent's audio goes nowhere")]
    avatar = h.avatar
    if route == "avatar" and avatar is not None:
        state = job.states.get("avatar", "idle")
        if state not in _JOINING and avatar.avatar_identity not in h.room.remote_participants:
            return [
                Problem(
                    "audible",
                    f"t={h.clock.now():g}: the agent's audio goes to an avatar that is not in "
                    f"the room (avatar machine {state})",
                )
            ]
    return []


def _no_room_audio(session: Any) -> bool:
    """The session's RoomIO was built without its audio output to the room: the agent
    asked for none, or gave the session an audio output of its own before the start."""
    room_io = session_room_io(session)
    return room_io is not None and lk.room_io_audio_output(room_io) is None


def verdicts(h: Harness) -> list[Problem]:
    """Each request is answered at most once; a verdict goes only to the simulator."""
    out: list[Problem] = []
    for sent in h.sent.values():
        if len(sent.replies) > 1:
            out.append(
                Problem(
                    "verdict",
                    f"{sent.request} from {sent.caller} answered {len(sent.replies)} times",
                )
            )
        if sent.caller != "simulator" and any(r.get("verdict") for r in sent.replies):
            out.append(Problem("verdict", f"a verdict went to {sent.caller}, not the simulator"))
    return out


def off_the_call(h: Harness) -> list[Problem]:
    """While the job holds for the simulator's verdict, the agent is off the call: its
    session closed first (livekit's order), whichever way the job was asked to end
    (invariant 13, ``invariants.checks.off_the_call``)."""
    job = h.job
    if job is None:
        return []
    held = holding_on_the_call(job.states.get("job"), lk.session_live(job.session))
    return [Problem("off the call", f"t={h.clock.now():g}: {held}")] if held else []


def during(h: Harness) -> list[Problem]:
    """What is checked after every step, of a fuzzed run and of its replay alike: one place,
    so a failure the fuzzer found is the one its replay reproduces."""
    return audible(h) + verdicts(h) + off_the_call(h)


# -- once the job has ended ---------------------------------------------------------------
def answered(h: Harness) -> list[Problem]:
    """The simulator's finalize, asked while the job could answer, got its one reply. When
    the agent's ``on_simulation_end`` is still running, or the room went while the
    runtime's ``on_session_end`` never ran (the server was not given it, or the agent's own
    hook does not await it: livekit's shutdown disconnected the room with no hold), that is
    named as the cause."""
    cause, job = "", h.job
    if job is not None and job.states.get("finalize") == "answering":
        # livekit does not bound the agent's callback: the reply waits for it
        at = seconds_text(round(h.clock.now(), 3))
        cause = f": the agent's on_simulation_end had not returned at t={at}"
    elif job is not None and not h.room.isconnected() and job.job.disconnect_hint():
        # only a room that went can be livekit's disconnect with no hold
        cause = f": {NO_HOLD}"
    return [
        Problem(
            "verdict",
            f"the simulator's finalize_simulation ({sent.request_id}) got no reply{cause}",
        )
        for sent in h.sent.values()
        if sent.caller == "simulator"
        and sent.request == "finalize_simulation"
        and sent.while_open
        and not sent.replies
    ]


# why a verdict owed after the hang-up is lost when the runtime's on_session_end never ran
NO_HOLD = (
    "the job never held for it, as agent_runtime's on_session_end did not run and livekit's "
    "shutdown disconnected the room at once (give the server's rtc_session "
    "on_session_end=on_session_end, or await on_session_end(ctx) in your own)"
)


def end_bound(h: Harness) -> float:
    """How long a job may take to end once something ended it: livekit's bounds and the
    job's own (a grace period, the simulator's hold, its close)."""
    job = h.job
    own = 0.0
    if job is not None:
        s = job.settings
        own = s.grace_period + s.session_end_timeout + s.session_close_timeout + s.close_timeout
    end = h.process.session_end_timeout if h.process is not None else 0.0
    return ENTRYPOINT_EXIT + SESSION_CLOSE + end + own


def closes(h: Harness) -> list[Problem]:
    """Once an end condition held, the job ended within its bounds."""
    process = h.process
    if h.ended_at is None or process is None:
        return []
    bound = end_bound(h)
    if process.ended_at is None:
        return [Problem("closes", f"{h.end_cause} at t={h.ended_at:g}, and the job never ended")]
    if process.ended_at > h.ended_at + bound + 1e-6:
        return [
            Problem(
                "closes",
                f"{h.end_cause} at t={h.ended_at:g}; the job ended at t={process.ended_at:g}, "
                f"past its bound ({bound:g}s)",
            )
        ]
    return []


def released(h: Harness) -> list[Problem]:
    """Nothing the job started is left running, no room listener of its is left. After a
    session close the agent's code held (reported as user code), livekit's half-closed
    session is left with its tasks and listeners: only the agent's own tasks count then."""
    out: list[Problem] = []
    # the runner's check, as run_entrypoint's teardown makes it, the harness's inputs too
    left = h.runner.tasks_left(callers_too=True)
    if h.runner.failures.close_held:
        left = [t for t in left if is_agents_task(t)]
        if not left:
            return []
        mine = ", ".join(h.runner.name_left(t) for t in left)
        return [
            Problem("released", f"tasks still running after the job ended: {mine}{RELEASE_HINT}")
        ]
    if left:
        names = [h.runner.name_left(t) for t in left]
        hint = RELEASE_HINT if any(n.endswith(" (agent code)") for n in names) else ""
        out.append(
            Problem(
                "released", f"tasks still running after the job ended: {', '.join(names)}{hint}"
            )
        )
    # livekit's JobContext keeps its own listener, and the agent's own are its business
    # (the room goes with the job's process)
    left_on_room = [
        f"{event}: {getattr(cb, '__qualname__', cb)!s}"
        for event, cb in lk.emitter_listeners(h.room)
        if (event, cb) not in h.listeners_before
        and getattr(cb, "__self__", None) is not h.ctx
        and not is_user_callable(cb)
    ]
    if left_on_room:
        out.append(
            Problem(
                "released", f"room listeners left after the job ended: {', '.join(left_on_room)}"
            )
        )
    return out


# what to do about a task of the agent's left running, for a newcomer who sees no fault
RELEASE_HINT = (
    " (livekit's job process cancels them only as it exits, so deployed they run on after "
    "the call: cancel the agent's own at the job's end, in a shutdown callback say)"
)


def user_code(h: Harness) -> list[Problem]:
    """No exception escaped the agent's own code. Not counted: an entrypoint that was still
    waiting, its job not built, when a step ended the job (the room deleted, a shutdown:
    livekit's ``wait_for_participant`` raises then, and the job ends as it would have)."""
    out: list[Problem] = []
    if isinstance(h.entry, Failed):
        error = h.entry.error
        if isinstance(error, PrewarmFailed):
            # the kit named it already (the server's setup_fnc, run before the entrypoint);
            # one that hung has no exception of its own
            cause = error.__cause__
            detail = agents_traceback(cause) if cause is not None else ""
            out.append(Problem("user code", str(error), detail))
        else:
            out.append(_raised("entrypoint", error))
    waiting = h.job is None and h.ended_at is not None
    for i, f in enumerate(h.runner.user_failures):
        if not (f.where == "entrypoint" and waiting and i >= h.failures_at_end):
            out.append(_raised(f.where, f.error))
    return out


def run_checks(checks: list[Check], outcome: FuzzOutcome) -> list[Problem]:
    """The user's checks on ``outcome``: a problem for each that raised or returned
    ``False``; ``BadCheck`` for one that read what the outcome does not have."""
    out: list[Problem] = []
    for check in checks:
        name = _name(check)
        try:
            ok = check(outcome)
        except Exception as e:
            if isinstance(e, AttributeError) and e.obj is outcome:
                raise BadCheck(check, _misread(name, e.name)) from None
            if isinstance(e, TypeError) and _at_the_call(e):
                # no code of the check ran: it cannot take the outcome (a builtin whose
                # signature could not be read before the run, time.time or len)
                raise BadCheck(check, f"check {name} cannot check the outcome: {e}") from None
            out.append(
                Problem(
                    f"check {name}",
                    f"{type(e).__name__}: {e}",
                    agents_traceback(e),
                )
            )
            continue
        if inspect.isawaitable(ok):
            if inspect.iscoroutine(ok):
                ok.close()  # never run: no "never awaited" warning on top
            raise BadCheck(
                check,
                f"check {name} returned {type(ok).__name__}: a check is called, never "
                "awaited (make it a plain function that raises or returns False)",
            )
        if ok is False:
            out.append(Problem(f"check {name}", "returned False"))
    return out


def _at_the_call(e: BaseException) -> bool:
    """Whether ``e`` was raised by the call itself, before any Python code of the callee
    ran (its traceback goes no deeper than the caller's frame)."""
    tb = e.__traceback__
    return tb is not None and tb.tb_next is None


def _raised(where: str, e: BaseException) -> Problem:
    return Problem("user code", f"the agent's {where} {said(e)}", agents_traceback(e))


_KIT = str(Path(__file__).resolve().parents[2])  # agent_runtime/


def agents_traceback(e: BaseException) -> str:
    """``e``'s traceback from the first frame that is not the kit's own (the harness and
    the runner that called the entrypoint, a callback, are not what failed)."""
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None and _kit_frame(tb.tb_frame.f_code):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(e), e, tb))


def _kit_frame(code: CodeType) -> bool:
    try:
        return str(Path(code.co_filename).resolve()).startswith(_KIT)
    except OSError:
        return False
