"""``JobSessions``: the job's sessions as the ``session`` machine hears them.

Built beside the job machine (by ``JobSystem``, or by ``JobRuntime`` alone; by a link or a
tracker used alone, ``own_sessions``). One listener per session the job follows
(``follow``) hears the SDK's ``close`` event and hands each close to the machine as
``session_closed``; the machine's effects tell the others through the declared links (the
session host; for the job's own session also the participant link, the avatar and
playout). A start of the job takes its own session through the machine too (``claim``): a
second start is the machine's reject cell. See ``statemachines.session``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Callable, Coroutine
from typing import Any

from livekit.agents import AgentSession

from agent_runtime.actor import Actor, ActorClosed, Event, EventRejected, Output, effect_table
from agent_runtime.clock import Clock
from agent_runtime.observe.trace import Tracer
from agent_runtime.runtimes._base import Hear, MachineRuntime
from agent_runtime.runtimes.routing import Wiring
from agent_runtime.scheduler import Scheduler
from agent_runtime.sdk import livekit_compat as lk
from statemachines.session import SESSION


class JobSessions(MachineRuntime[str]):
    """The sessions of one job. ``own``: the job's own session (the one the participant
    link follows), if it has one; ``label(session)``: its name in traces (the host's)."""

    def __init__(
        self,
        own: AgentSession[Any] | None,
        *,
        label: Callable[[AgentSession[Any]], str],
        clock: Clock | None = None,
        tracer: Tracer | None = None,
        scheduler: Scheduler | None = None,
        wiring: Wiring | None = None,
        instance: str = "",
        owner: Hear | None = None,
    ) -> None:
        super().__init__()
        self.own = own
        self._label = label
        # its CloseReason's value, as livekit's close event said it (a user's own close
        # handler may read it), the first time it closed
        self.own_close_reason: str | None = None
        # each session followed: its listener and its label (taken once, as it is followed)
        self._followed: list[tuple[AgentSession[Any], _CloseHeard, str]] = []
        self._run_machine(
            SESSION,
            _EFFECTS,
            instance=instance,
            clock=clock,
            tracer=tracer,
            scheduler=scheduler,
            hear=owner,
            wiring=wiring,
        )

    @property
    def own_session(self) -> str | None:
        """The own session's label once it is followed (what the ``is_own`` guard
        compares)."""
        return next((label for s, _, label in self._followed if s is self.own), None)

    def follow(self, session: AgentSession[Any]) -> None:
        """Hear each close of ``session`` from now on, with one listener (following it
        again changes nothing)."""
        if self.actor.closed or any(s is session for s, _, _ in self._followed):
            return
        label = self._label(session)
        listener = _CloseHeard(self, session, label)
        session.on("close", listener)
        self._followed.append((session, listener, label))

    async def claim(self) -> None:
        """A start of the job takes its own session; refused (``RuntimeError``) once one
        did, whatever became of it, and, as any part of a start, once the job let its
        sessions go."""
        try:
            await self.actor.send(Event("start"))
        except (EventRejected, ActorClosed):
            if self._finished:
                # the job closed on its own between the start's begin() and this claim
                raise RuntimeError("the job was closed before it finished starting") from None
            raise RuntimeError("the job's session is already started (or closed)") from None

    def release_half_started(self) -> Coroutine[Any, Any, None] | None:
        """What releasing the own session takes when a start of it was cut or failed
        half-way (its RoomIO's listeners and tasks, its activity: livekit's ``aclose()``
        does nothing for a session that never finished starting), or None when nothing
        is left. The teardown runs it within its step's share and logs its failure."""
        if self.own is None or not lk.session_half_started(self.own):
            return None
        return lk.release_half_started(self.own)

    def release_now(self) -> asyncio.Future[Any] | None:
        """Stop listening and let the machine go (``close``, then released): the job's last
        word. What is left to wait for, or None."""
        for session, listener, _ in self._followed:
            with contextlib.suppress(Exception):
                session.off("close", listener)
        self._followed.clear()
        return self._close_now(self.actor.release)

    def _closed(self, session: AgentSession[Any], label: str, ev: Any) -> None:
        reason = getattr(getattr(ev, "reason", None), "value", None) or str(
            getattr(ev, "reason", "")
        )
        if session is self.own and self.own_close_reason is None:
            self.own_close_reason = reason
        self._post(Event("session_closed", {"session": label, "reason": reason}))

    # -- effects ---------------------------------------------------------------------------
    def _fx_report_closed(self, ev: Event) -> Output:
        return Output(dict(ev.data))

    def _fx_report_own_closed(self, ev: Event) -> Output:
        return Output(dict(ev.data))


def own_sessions(
    job_wiring: Wiring | None,
    beside: Actor,
    post: Callable[[Event], None],
    session: AgentSession[Any],
) -> JobSessions | None:
    """The session machine that tells ``beside``'s runtime (by ``post``) its session's
    close: in a job (``job_wiring``) the job's, so None; used alone one of its own, on its
    clock, tracer and scheduler, whose links reach that runtime only: the close comes by
    the same declared link. It hears ``session`` from ``follow`` until ``release_now()``."""
    if job_wiring is not None:
        return None
    name = beside.instance  # its session's name in traces, the runtime's
    own = JobSessions(
        session,
        label=lambda _: name,
        clock=beside.clock,
        tracer=beside.tracer,
        scheduler=beside.scheduler,
        instance=name,
    )
    own.wiring.connect(beside.spec.name, post)
    return own


# the session machine's handlers, shared by every job (Handlers binds them)
_EFFECTS = effect_table(JobSessions, SESSION)


class _CloseHeard:
    """The listener on one followed session's ``close``: slotted rather than a closure in a
    ``Listener`` (a job holds one per session it follows). Its signature is read as it is:
    livekit's ``emit`` would build a bound method's on every event."""

    __slots__ = ("label", "runtime", "session")
    __signature__ = inspect.Signature([inspect.Parameter("ev", inspect.Parameter.POSITIONAL_ONLY)])

    def __init__(self, runtime: JobSessions, session: AgentSession[Any], label: str) -> None:
        self.runtime, self.session, self.label = runtime, session, label

    def __call__(self, ev: Any) -> None:
        self.runtime._closed(self.session, self.label, ev)
